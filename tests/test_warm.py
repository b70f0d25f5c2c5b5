"""Keeping idle voices' memory warm: the toucher reads every page of every weight, and the
engine sweeps while idle only when asked to (or when it measured that memory goes cold)."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from synthetic_voice import VARIANTS, random_model

from daemon.engine import Engine, EngineSettings
from tts.warm import PAGE, WeightToucher


def test_the_toucher_reads_one_byte_in_every_page_of_every_weight() -> None:
    model = random_model(VARIANTS["medium"])
    toucher = WeightToucher.of(model)
    storages = {id(p): p.untyped_storage() for p in model.parameters()}
    expected = {s.data_ptr(): math.ceil(s.nbytes() / PAGE) for s in storages.values()}
    assert toucher.pages >= sum(expected.values()) > 1000
    # The views alias the weights: changing a page's first byte changes what a sweep reads.
    before = toucher.touch()
    weight = model.dec.conv_post.weight
    with torch.no_grad():
        raw = torch.empty(0, dtype=torch.uint8).set_(weight.untyped_storage())
        raw[0] += 1
    assert toucher.touch() == before + 1


async def test_the_engine_keeps_loaded_voices_warm_only_when_asked(catalog) -> None:  # type: ignore[no-untyped-def]
    off = Engine(catalog, EngineSettings(keep_warm="off"))
    assert off.keep_warm() is None
    off.close()
    engine = Engine(catalog, EngineSettings(keep_warm="on", warm_interval=0.01))
    try:
        await engine.preload()
        thread = engine.keep_warm()
        assert thread is not None and thread.name == "herald-warm"
        for _ in range(500):  # sweeps come while nobody speaks
            if engine.warm_sweeps >= 3:
                break
            await asyncio.sleep(0.01)
        assert engine.warm_sweeps >= 3
    finally:
        engine.close()
    assert not thread.is_alive()  # close() ends it, and waits for it


@pytest.mark.parametrize("value", ["sometimes", 1])
def test_keep_warm_setting_refuses_other_values(value: object) -> None:
    from daemon.settings import ConfigError, load_settings

    with pytest.raises(ConfigError, match="voices.keep_warm"):
        load_settings(None, [f"voices.keep_warm={value}"])

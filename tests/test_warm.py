"""Keeping idle voices' memory warm: the toucher reads every page of every weight, and the
engine sweeps while idle only when asked to (or when it measured that memory goes cold)."""

from __future__ import annotations

import _ctypes
import asyncio
import ctypes
import math
import mmap
import shutil
import time
from pathlib import Path

import pytest
import torch
from synthetic_voice import VARIANTS, random_model

from daemon.synthesis.engine import Engine, EngineSettings
from tts.memory import KeepWarm
from tts.warm import PAGE, PROBE_IDLE, CodeToucher, Warmer, WeightToucher


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


def test_the_code_toucher_learns_the_code_that_ran_since_forget() -> None:
    """What is learned depends on what ran since ``forget``, not on what ran before it
    (other tests in the same process may have run more code, or forgotten it already)."""
    model = random_model(VARIANTS["x_low"])

    def decode() -> None:
        with torch.inference_mode():
            model.dec(torch.randn(1, model.config.inter_channels, 4), None)

    def torch_pages(toucher: CodeToucher) -> int:
        return sum(len(offsets) for (_, offsets), path in zip(toucher.views, toucher.paths)
                   if "libtorch_cpu" in path)

    decode()  # its first run, with whatever it sets up once, is not what is compared
    assert CodeToucher.forget() > 0
    idle = CodeToucher()  # nothing of torch's ran since
    assert CodeToucher.forget() > 0
    decode()
    learned = CodeToucher()
    assert 0 < idle.pages < learned.pages
    assert torch_pages(idle) < torch_pages(learned)  # the generator ran there
    assert learned.touch() == learned.touch() > 0  # reads the same code bytes each time


def _text_mapping(path: Path) -> tuple[int, int]:
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[1] == "r-xp" and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            return start, end
    raise AssertionError(f"{path} has no executable mapping")


def test_forget_leaves_privately_written_code_alone(tmp_path: Path) -> None:
    """Dropping the page-table entries of a mapping reverts its written pages to the file;
    ``forget`` must skip such mappings (a debugger's breakpoint, a patched library)."""
    lib = tmp_path / "copy.so"
    shutil.copy(_ctypes.__file__, lib)  # any shared object, loaded afresh from a new path
    ctypes.CDLL(str(lib))
    start, end = _text_mapping(lib)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    byte = ctypes.c_uint8.from_address(start)
    original = byte.value
    assert libc.mprotect(start, end - start, mmap.PROT_READ | mmap.PROT_WRITE) == 0
    byte.value = original ^ 0xFF  # a private copy of the page now differs from the file
    assert libc.mprotect(start, end - start, mmap.PROT_READ | mmap.PROT_EXEC) == 0
    CodeToucher.forget()
    assert byte.value == original ^ 0xFF


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


@pytest.mark.timed  # the rule: a stop does not wait out the probe's idle second
def test_stopping_during_the_probe_ends_the_thread_at_once() -> None:
    """``auto`` first leaves memory idle for seconds; a daemon stopped meanwhile must not
    wait them out (nor leave the thread reading memory while the interpreter exits)."""
    warmer = Warmer(lambda: [], busy=lambda: False)
    thread = warmer.start("auto")
    assert thread is not None
    time.sleep(0.1)  # inside the first probe's idle second
    started = time.monotonic()
    warmer.stop()
    assert not thread.is_alive()
    assert time.monotonic() - started < PROBE_IDLE  # did not wait out the idle second
    assert warmer.sweeps == 0
    assert warmer.decided.is_set() and not warmer.sweeping  # nothing to wait for after stop


@pytest.mark.parametrize("mode, sweeping", [("on", True), ("off", False)])
def test_the_warmers_verdict_is_known_without_a_probe(mode: KeepWarm, sweeping: bool) -> None:
    warmer = Warmer(lambda: [], busy=lambda: False)
    try:
        warmer.start(mode)
        assert warmer.decided.wait(timeout=5)
        assert warmer.sweeping is sweeping
    finally:
        warmer.stop()


@pytest.mark.parametrize("value", ["sometimes", 1])
def test_keep_warm_setting_refuses_other_values(value: object) -> None:
    from daemon.settings import ConfigError, load_settings

    with pytest.raises(ConfigError, match="voices.keep_warm"):
        load_settings(None, [f"voices.keep_warm={value}"])

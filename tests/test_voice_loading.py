"""The ONNX loader: every Piper variant's layout loads into the right modules, and any
missing, unexpected or misshaped weight is refused loudly."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch
from fresh_python import run_python
from synthetic_voice import VARIANTS, export_like_piper, random_model

from tts.errors import VoiceError
from tts.voice import VoiceConfig, VoiceInfo, load_onnx_weights


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_round_trip(variant: str, tmp_path: Path) -> None:
    model = random_model(VARIANTS[variant])
    path = tmp_path / f"{variant}.onnx"
    export_like_piper(model, path)
    loaded = load_onnx_weights(path)
    assert loaded.config == model.config
    theirs = model.state_dict()
    for key, value in loaded.state_dict().items():
        if key.startswith("dp.flows.1."):
            continue
        assert torch.allclose(value, theirs[key], rtol=1e-6, atol=1e-7), key


def test_bundled_voice_loads_every_weight(catalog) -> None:  # type: ignore[no-untyped-def]
    model = load_onnx_weights(catalog.resolve().model_path)
    assert model.config.hidden_channels == 192 and model.config.upsample_rates == (8, 8, 4)
    assert sum(p.numel() for p in model.parameters()) > 15_000_000


def _rewrite(src: Path, dst: Path, edit) -> None:  # type: ignore[no-untyped-def]
    m = onnx.load(str(src))
    edit(m.graph.initializer)
    onnx.save(m, str(dst))


def test_missing_weight_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "v.onnx"
    export_like_piper(random_model(VARIANTS["medium"]), src)

    def drop(inits) -> None:  # type: ignore[no-untyped-def]
        victim = next(i for i in inits if i.name == "dec.conv_post.weight")
        inits.remove(victim)

    _rewrite(src, tmp_path / "bad.onnx", drop)
    with pytest.raises(VoiceError, match="missing: dec.conv_post.weight"):
        load_onnx_weights(tmp_path / "bad.onnx")


def test_misshaped_and_unexpected_weights_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "v.onnx"
    export_like_piper(random_model(VARIANTS["medium"]), src)

    def mangle(inits) -> None:  # type: ignore[no-untyped-def]
        bias = next(i for i in inits if i.name == "enc_p.proj.bias")
        bias.dims[0] = 10
        del bias.float_data[:]
        bias.raw_data = bytes(40)
        extra = onnx.numpy_helper.from_array(torch.zeros(3).numpy(), "dec.surprise.weight")
        inits.append(extra)

    _rewrite(src, tmp_path / "bad.onnx", mangle)
    with pytest.raises(VoiceError) as e:
        load_onnx_weights(tmp_path / "bad.onnx")
    assert "misshaped: enc_p.proj.bias" in str(e.value)
    assert "unexpected: dec.surprise.weight" in str(e.value)


def test_not_a_voice(tmp_path: Path) -> None:
    bad = tmp_path / "junk.onnx"
    bad.write_bytes(b"this is not a model")
    with pytest.raises(VoiceError):
        load_onnx_weights(bad)


def _info(num_speakers: int, names: dict[str, int]) -> VoiceInfo:
    config = VoiceConfig.from_json({"audio": {"sample_rate": 22050}, "num_speakers": num_speakers,
                                    "speaker_id_map": names, "phoneme_id_map": {"_": [0]}})
    return VoiceInfo("xx_XX-test-medium", Path("v.onnx"), Path("v.onnx.json"), config)


def test_speakers_resolve_from_the_config_alone() -> None:
    """Fronts refuse a speaker before queueing, with no weights loaded (``VoiceInfo``)."""
    multi = _info(3, {"ann": 0, "bo": 2, "cy": 1})
    assert multi.speakers == ["ann", "cy", "bo"]
    assert [multi.speaker_id(s) for s in ("bo", 1, "2", None, "")] == [2, 1, 2, 0, 0]
    with pytest.raises(VoiceError, match="has no speaker 'dee'; known: ann, cy, bo"):
        multi.speaker_id("dee")
    with pytest.raises(VoiceError, match="has no speaker 3: speakers are 0..2"):
        multi.speaker_id(3)
    single = _info(1, {})
    assert single.speaker_id(None) is None and single.speaker_id(0) is None
    with pytest.raises(VoiceError, match="has a single speaker; got 'ann'"):
        single.speaker_id("ann")


def test_loading_a_voice_hands_the_parsed_file_back() -> None:
    """Loading parses the whole ONNX file and frees it: glibc would keep those pages
    resident on the loading thread's heap for good (~60 MB for the bundled voice). After a
    load, a further trim must find little left to hand back. A fresh process: what earlier
    tests freed in this one doesn't count."""
    code = (
        "import ctypes, json\n"
        "from tts import VoiceCatalog\n"
        "from tts.memory import anonymous_mb\n"
        "voice = VoiceCatalog().synthesizer()  # kept: only the garbage may go\n"
        "before = anonymous_mb()\n"
        "ctypes.CDLL('libc.so.6').malloc_trim(0)\n"
        "print(json.dumps([before, anonymous_mb()]))\n")
    out = run_python(code).stdout
    before, after = json.loads(out.splitlines()[-1])
    assert before - after < 10, f"{before - after:.0f} MB were still there to hand back"

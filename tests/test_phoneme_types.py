"""Voices of every phoneme type piper-tts knows (espeak, text, pinyin, japanese, hebrew,
thai): herald's phoneme ids equal those of piper-tts's own phonemizers (installed with their
extras) for the same text and voice config, and a small voice of each type speaks the same
samples through herald as through piper-tts (onnxruntime). A type herald does not know is
refused naming it; a voice whose extra or g2pW is missing says what to install.

The voices and g2pW's model are small ones made by ``typed_voices`` (real Chinese, Japanese,
Hebrew and Thai voices and g2pW cannot be downloaded here): the ids and the audio come out of
the real code paths, but they are no evidence of how natural a real voice sounds.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from audio_checks import pcm16, rms
from conftest import ROOT
from herald_process import herald_env
from piper import PiperVoice, SynthesisConfig
from sentences import (
    AR_SENTENCES,
    HE_SENTENCES,
    JA_SENTENCES,
    TEXT_SENTENCES,
    TH_SENTENCES,
    ZH_SENTENCES,
)
from typed_voices import TYPES, make_g2pw

from tts import SynthesisOptions, VoiceCatalog, VoiceError
from tts.voice import Voice, VoiceInfo

SENTENCES = {"pinyin": ZH_SENTENCES, "japanese": JA_SENTENCES, "hebrew": HE_SENTENCES,
             "thai": TH_SENTENCES, "espeak": AR_SENTENCES, "text": TEXT_SENTENCES}
# Each sentence, and all of a language's at once (sentence splitting); Thai's one by one
# only, TLTK takes seconds a sentence (its last sentence has two).
CASES = [pytest.param(t, s, id=f"{t}-{i}") for t, ss in SENTENCES.items()
         for i, s in enumerate([*ss, " ".join(ss)] if t != "thai" else ss)]
AUDIO_TEXT = {t: " ".join(ss[:2]) for t, ss in SENTENCES.items()} | {"thai": TH_SENTENCES[2]}
NOISELESS = SynthesisOptions(noise_scale=0.0, noise_w=0.0)


@pytest.fixture(scope="module")
def typed_catalog(typed_voices: Path) -> VoiceCatalog:
    return VoiceCatalog([typed_voices], include_bundled=False)


@pytest.fixture(scope="module")
def piper_voices(typed_voices: Path) -> dict[str, PiperVoice]:
    """piper-tts's own voices, downloading nothing: the g2pW model is already where
    ``PiperVoice`` looks for it (``download_dir/g2pW``)."""
    return {t: PiperVoice.load(typed_voices / f"{k.name}.onnx", download_dir=typed_voices)
            for t, k in TYPES.items()}


def piper_ids(voice: PiperVoice, text: str) -> list[list[int]]:
    return [voice.phonemes_to_ids(p) for p in voice.phonemize(text) if p]


def piper_audio(voice: PiperVoice, text: str) -> np.ndarray:
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, normalize_audio=False)
    return np.concatenate([c.audio_float_array for c in voice.synthesize(text, config)])


def si_snr(ours: np.ndarray, theirs: np.ndarray) -> float:
    """Scale-invariant signal-to-noise ratio of ``ours`` against ``theirs``, in dB."""
    ours, theirs = ours - ours.mean(), theirs - theirs.mean()
    target = (ours @ theirs) / (theirs @ theirs) * theirs
    noise = ours - target
    return float(10 * np.log10((target @ target) / max(float(noise @ noise), 1e-30)))


@pytest.mark.parametrize("phoneme_type,text", CASES)
def test_ids_equal_piper(phoneme_type: str, text: str, typed_catalog: VoiceCatalog,
                         piper_voices: dict[str, PiperVoice]) -> None:
    ours = typed_catalog.synthesizer(TYPES[phoneme_type].name).sentences(text)
    theirs = piper_ids(piper_voices[phoneme_type], text)
    assert ours == theirs
    assert ours and all(len(ids) > 3 for ids in ours)  # something was read


def test_chinese_normalization_and_layout(typed_catalog: VoiceCatalog) -> None:
    """What Piper's Chinese phonemizer does to the text happens: the temperature is read
    零下七度, the percentage 百分之七十七, the decimal 三点五, quotes vanish, and ids are
    padded after each syllable's tone, not after every phoneme."""
    from piper.phonemize_chinese import PHONEME_TO_ID as ZH

    synth = typed_catalog.synthesizer(TYPES["pinyin"].name)

    def ids(text: str) -> list[int]:
        [one] = synth.sentences(text)
        return one

    assert ids("-7°C") == ids("零下七度")
    assert ids("77%") == ids("百分之七十七")
    assert ids("3.5") == ids("三点五")
    assert ids("“你好”") == ids("你好")
    # 你 ni3: BOS, n, i, 3, PAD, EOS (one pad, after the tone)
    assert ids("你") == [*ZH["^"], *ZH["n"], *ZH["i"], *ZH["3"], *ZH["_"], *ZH["$"]]
    assert len(synth.sentences("第一句话。第二句话！第三句话？")) == 3


def test_polyphones_are_read_by_the_model(typed_voices: Path, tmp_path: Path,
                                          typed_catalog: VoiceCatalog) -> None:
    """g2pW's model decides a polyphone's reading: another model (another seed) reads the
    same sentence differently, and herald follows it, as piper-tts does."""
    other = tmp_path / "voices"
    other.mkdir()
    kind = TYPES["pinyin"]
    for suffix in (".onnx", ".onnx.json"):
        shutil.copyfile(typed_voices / f"{kind.name}{suffix}", other / f"{kind.name}{suffix}")
    make_g2pw(other, "".join(ZH_SENTENCES), seed=1)
    text = "".join(ZH_SENTENCES[0] + ZH_SENTENCES[5])
    ours = VoiceCatalog([other], include_bundled=False).synthesizer(kind.name).sentences(text)
    theirs = piper_ids(PiperVoice.load(other / f"{kind.name}.onnx", download_dir=other), text)
    assert ours == theirs
    assert ours != typed_catalog.synthesizer(kind.name).sentences(text)


@pytest.mark.parametrize("phoneme_type", list(TYPES))
def test_audio_equals_piper(phoneme_type: str, typed_catalog: VoiceCatalog,
                            piper_voices: dict[str, PiperVoice]) -> None:
    text = AUDIO_TEXT[phoneme_type]
    synth = typed_catalog.synthesizer(TYPES[phoneme_type].name)
    ours = synth.synthesize(text, NOISELESS)
    theirs = piper_audio(piper_voices[phoneme_type], text)
    assert len(ours) == len(theirs) and len(ours) > synth.sample_rate // 2
    assert float(np.sqrt(np.mean(theirs ** 2))) > 1e-3  # not silence on both sides
    assert si_snr(ours, theirs) >= 60.0
    if phoneme_type == "pinyin":  # streamed in chunks: the same samples
        streamed = np.concatenate([c.samples for c in synth.stream(text, NOISELESS)])
        assert si_snr(streamed, theirs) >= 60.0


def _copy_voice(typed_voices: Path, kind_of: str, into: Path, **changes: object) -> Path:
    kind = TYPES[kind_of]
    into.mkdir(parents=True, exist_ok=True)
    model = into / f"{kind.name}.onnx"
    shutil.copyfile(typed_voices / f"{kind.name}.onnx", model)
    config = json.loads((typed_voices / f"{kind.name}.onnx.json").read_text())
    config.update(changes)
    model.with_name(model.name + ".json").write_text(json.dumps(config))
    return model


def test_unknown_phoneme_type_is_refused(typed_voices: Path, tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    model = _copy_voice(typed_voices, "text", tmp_path, phoneme_type="arpabet")
    with pytest.raises(VoiceError, match="phoneme type 'arpabet' is not one herald knows"):
        VoiceInfo.from_files(model)
    with caplog.at_level(logging.WARNING):
        catalog = VoiceCatalog([tmp_path])
    assert TYPES["text"].name not in {i.name for i in catalog.infos()}
    assert "'arpabet'" in caplog.text


def test_missing_g2pw_says_what_to_run(typed_voices: Path, tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    model = _copy_voice(typed_voices, "pinyin", tmp_path)  # without g2pW beside it
    with caplog.at_level(logging.WARNING):
        catalog = VoiceCatalog([tmp_path])
    assert TYPES["pinyin"].name not in {i.name for i in catalog.infos()}
    assert "g2pW" in caplog.text and "herald voices download" in caplog.text
    with pytest.raises(VoiceError, match="g2pW.*herald voices download"):
        Voice.load(VoiceInfo.from_files(model))
    # found in another voice directory, it is used
    assert Voice.load(VoiceInfo.from_files(model), [typed_voices]).phonemizer.sentences("你好")


def test_missing_extra_names_the_install_command(typed_voices: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Without OpenJTalk (Python's documented way to make an import fail: None in
    sys.modules), a Japanese voice is left out and loading it names the command."""
    monkeypatch.setitem(sys.modules, "pyopenjtalk", None)
    model = _copy_voice(typed_voices, "japanese", tmp_path)
    with caplog.at_level(logging.WARNING):
        catalog = VoiceCatalog([tmp_path])
    assert TYPES["japanese"].name not in {i.name for i in catalog.infos()}
    for text in (caplog.text, ""):
        if not text:
            with pytest.raises(VoiceError) as e:
                Voice.load(VoiceInfo.from_files(model))
            text = str(e.value)
        assert "Japanese voices need piper-tts's ja extra" in text
        assert "scripts/setup --extras ja" in text and "pip install 'piper-tts[ja]==" in text


def test_herald_say_speaks_chinese_with_the_pinyin_voice(typed_voices: Path,
                                                         tmp_path: Path) -> None:
    """`herald say` as a user runs it, with the voice directory holding the pinyin voice and
    g2pW: the voice loads from there, and the WAV has its rate and its Chinese."""
    kind = TYPES["pinyin"]
    out = tmp_path / "zh.wav"
    r = subprocess.run([sys.executable, "-m", "daemon.cli", "say", "我用iPhone给妈妈打电话。",
                        "--voice-dir", str(typed_voices), "--voice", kind.name,
                        "--out", str(out)],
                       cwd=ROOT, env=herald_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with wave.open(str(out)) as w:
        assert w.getframerate() == 16000
        samples = pcm16(w.readframes(w.getnframes()))
    alone = VoiceCatalog([typed_voices], include_bundled=False).synthesizer(kind.name)
    chinese = alone.synthesize("我用", NOISELESS)  # at least the Chinese runs' length
    assert len(samples) > len(chinese) + 16000 // 4 and rms(samples) > 1e-3

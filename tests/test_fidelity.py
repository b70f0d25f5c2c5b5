"""herald's samples equal piper-tts's (onnxruntime) for the same voice, with the sampling
noise off and Piper's peak normalisation off."""

from __future__ import annotations

import numpy as np
import pytest
from audio_checks import assert_speech
from piper import PiperVoice, SynthesisConfig
from sentences import SENTENCES

from tts import SynthesisOptions

NOISELESS = SynthesisOptions(noise_scale=0.0, noise_w=0.0)


@pytest.fixture(scope="module")
def piper_voice(catalog):  # type: ignore[no-untyped-def]
    info = catalog.resolve()
    return PiperVoice.load(info.model_path, info.config_path)


def piper_audio(voice: PiperVoice, text: str, length_scale: float = 1.0) -> np.ndarray:
    cfg = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, length_scale=length_scale,
                          normalize_audio=False)
    return np.concatenate([c.audio_float_array for c in voice.synthesize(text, cfg)])


@pytest.mark.parametrize("text", SENTENCES)
def test_same_samples_as_piper(text: str, synth, piper_voice) -> None:  # type: ignore[no-untyped-def]
    ours = synth.synthesize(text, NOISELESS)
    theirs = piper_audio(piper_voice, text)
    assert len(ours) == len(theirs)
    assert np.abs(ours - theirs).max() < 1e-3
    assert_speech(ours, synth.sample_rate)


def test_rate_control_matches_piper(synth, piper_voice) -> None:  # type: ignore[no-untyped-def]
    text = SENTENCES[0]
    slow = synth.synthesize(text, SynthesisOptions(noise_scale=0.0, noise_w=0.0,
                                                   length_scale=1.5))
    theirs = piper_audio(piper_voice, text, length_scale=1.5)
    assert len(slow) == len(theirs)
    assert np.abs(slow - theirs).max() < 1e-3
    assert len(slow) > 1.3 * len(synth.synthesize(text, NOISELESS))


def test_streamed_equals_piper(synth, piper_voice) -> None:  # type: ignore[no-untyped-def]
    text = SENTENCES[-1]
    streamed = np.concatenate([c.samples for c in synth.stream(text, NOISELESS)])
    theirs = piper_audio(piper_voice, text)
    assert len(streamed) == len(theirs)
    assert np.abs(streamed - theirs).max() < 1e-3

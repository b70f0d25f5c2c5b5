"""Checks on audio: that it is speech, and that it is the audio herald should have made.

Speech alternates between voiced stretches and pauses, so its short-time energy varies a
lot; white noise and silence don't. Most of its energy is below 4 kHz.

What herald should have made is the engine's own synthesis of the same text with the same
options (a seed, or the noise off): ``reference_pcm``. Compared with ``assert_pcm_close``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tts import SynthesisOptions, to_pcm16

if TYPE_CHECKING:
    from tts import Synthesizer

# Float sums done in another order (another process, another torch thread count) round a
# sample of the same synthesis up or down by a step or two; a real difference (a chunk lost,
# repeated or out of order, another seed) is far bigger.
PCM_TOLERANCE = 2  # LSB of 16-bit PCM


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0


def assert_speech(samples: np.ndarray, rate: int, min_seconds: float = 0.3,
                  max_seconds: float | None = None) -> None:
    """Fail unless ``samples`` (float, [-1, 1]) look like speech."""
    seconds = len(samples) / rate
    assert seconds >= min_seconds, f"only {seconds:.2f} s of audio"
    if max_seconds is not None:
        assert seconds <= max_seconds, f"{seconds:.2f} s of audio, expected <= {max_seconds}"
    level = rms(samples)
    assert level > 0.01, f"audio is (nearly) silent: rms {level:.4f}"
    frame = int(rate * 0.02)
    n = len(samples) // frame
    energy = np.sqrt(np.mean(samples[: n * frame].reshape(n, frame) ** 2, axis=1))
    active = energy > 0.1 * energy.max()
    assert 0.15 < active.mean() < 0.98, f"energy envelope not speech-like ({active.mean():.2f})"
    spread = float(np.std(energy) / (np.mean(energy) + 1e-9))
    assert spread > 0.35, f"energy too steady for speech (cv {spread:.2f}): noise or a tone?"
    spectrum = np.abs(np.fft.rfft(samples)) ** 2
    freqs = np.fft.rfftfreq(len(samples), 1 / rate)
    low = spectrum[freqs < 4000].sum() / spectrum.sum()
    assert low > 0.7, f"only {low:.0%} of the energy below 4 kHz: not a voice"


def pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data[: len(data) // 2 * 2], dtype="<i2").astype(np.float32) / 32767.0


def reference_pcm(synth: Synthesizer, text: str | Sequence[str], options: SynthesisOptions,
                  one_shot: bool = False) -> bytes:
    """s16le PCM of ``text`` straight from the engine: streamed, as herald streams it, or
    in one shot. Several texts are synthesized one by one and joined, as herald speaks a
    streamed text sentence by sentence."""
    texts = [text] if isinstance(text, str) else list(text)
    if one_shot:
        return b"".join(to_pcm16(synth.synthesize(t, options)) for t in texts)
    return b"".join(to_pcm16(c.samples) for t in texts for c in synth.stream(t, options))


def as_samples(pcm: bytes | np.ndarray) -> np.ndarray:
    """16-bit PCM (s16le bytes or an integer array) as int32 samples, safe to subtract."""
    if isinstance(pcm, np.ndarray):
        return pcm.astype(np.int32)
    return np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.int32)


def assert_pcm_close(got: bytes | np.ndarray, want: bytes | np.ndarray,
                     what: str = "the reference") -> None:
    """``got`` is ``want`` sample for sample, to within ``PCM_TOLERANCE``."""
    g, w = as_samples(got), as_samples(want)
    assert len(w), f"nothing to compare: {what} is empty"
    assert len(g) == len(w), f"{len(g)} samples, {what} has {len(w)}"
    diff = int(np.abs(g - w).max())
    assert diff <= PCM_TOLERANCE, f"audio differs from {what} by up to {diff} LSB"

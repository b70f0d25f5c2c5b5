"""Checks that audio is speech: long enough, loud enough, and shaped like a voice.

Speech alternates between voiced stretches and pauses, so its short-time energy varies a
lot; white noise and silence don't. Most of its energy is below 4 kHz.
"""

from __future__ import annotations

import numpy as np


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

"""Checks on audio: that it is speech, and that it is the audio herald should have made.

Speech alternates between voiced stretches and pauses, so its short-time energy varies a
lot; white noise and silence don't. Most of its energy is below 4 kHz.

What herald should have made is the engine's own synthesis of the same text with the same
options (a seed, or the noise off): ``reference_pcm``. Compared with ``assert_pcm_close``;
encoded (MP3, Opus, FLAC), decoded by ffmpeg, with ``assert_codec_audio``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pytest

from tts import SynthesisOptions, to_pcm16

if TYPE_CHECKING:
    from tts import Synthesizer

# Float sums done in another order (another process, another torch thread count) round a
# sample of the same synthesis up or down by a step or two; a real difference (a chunk lost,
# repeated or out of order, another seed) is far bigger.
PCM_TOLERANCE = 2  # LSB of 16-bit PCM


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0


def energy(x: np.ndarray) -> float:
    """Root of the summed squares: unlike ``rms``, silence around the sound leaves it as
    it is, so it compares what a device recorded however much silence it wrote."""
    return float(np.sqrt(np.sum(np.square(x, dtype=np.float64))))


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
    """16-bit PCM (s16le bytes, an integer array, or floats in [-1, 1] as ``pcm16`` and the
    engine give them) as int32 samples, safe to subtract."""
    if isinstance(pcm, np.ndarray):
        if np.issubdtype(pcm.dtype, np.floating):
            return np.round(np.clip(pcm, -1.0, 1.0) * 32767.0).astype(np.int32)
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


# --- encoded audio ---------------------------------------------------------------------

# An MP3 stream can't carry LAME's info frame (written last, at the front), so decoders play
# the codec's delay too: LAME's 576 samples plus the decoder's 529.
MP3_STREAM_DELAY = 1105
LOSSY_MIN_CORRELATION = 0.98
LOSSY_MAX_SPECTRAL_DB = 3.0


def _need_ffmpeg() -> None:
    if shutil.which("ffmpeg") is None:
        pytest.fail("ffmpeg is not installed: run scripts/setup --test")


def ffmpeg_decode(data: bytes, rate: int) -> np.ndarray:
    """Any encoded audio -> float samples at ``rate``, by ffmpeg."""
    _need_ffmpeg()
    done = subprocess.run(["ffmpeg", "-v", "error", "-i", "pipe:0", "-f", "s16le", "-ac", "1",
                           "-ar", str(rate), "pipe:1"], input=data, capture_output=True,
                          timeout=60)
    assert done.returncode == 0, f"ffmpeg could not decode it: {done.stderr.decode()}"
    return pcm16(done.stdout)


def decode(name: str, data: bytes, rate: int) -> np.ndarray:
    """Audio encoded as ``name`` (a ``tts.codec`` format) -> float samples at ``rate``."""
    return pcm16(data) if name == "pcm" else ffmpeg_decode(data, rate)


def codec_frame(name: str, rate: int) -> int:
    """Samples per codec frame at ``rate``: MP3's 1152 (576 below 32 kHz, MPEG-2), Opus's
    20 ms, FLAC's 1152 at the level herald uses; WAV and PCM carry the samples themselves."""
    return {"mp3": 1152 if rate >= 32000 else 576, "opus": rate // 50, "flac": 1152}.get(name, 0)


def spectral_distance_db(a: np.ndarray, b: np.ndarray, rate: int) -> float:
    """Mean distance (dB) between the band energies of two aligned signals, over the frames
    that carry speech: 24 log-spaced bands from 100 Hz to 8 kHz (where a voice is), 23 ms
    frames. Encoded speech lands within a couple of dB; the same speech 30 ms off, 6 dB
    quieter or band-limited to 4 kHz is 6-25 dB away."""
    n, hop = 512, 256
    frames = (min(len(a), len(b)) - n) // hop
    idx = np.arange(n)[None, :] + hop * np.arange(frames)[:, None]
    freqs = np.fft.rfftfreq(n, 1 / rate)
    edges = np.geomspace(100, 8000, 25)

    def bands(x: np.ndarray) -> np.ndarray:
        power = np.abs(np.fft.rfft(x[idx] * np.hanning(n), axis=1)) ** 2
        return np.stack([power[:, (freqs >= lo) & (freqs < hi)].sum(axis=1)
                         for lo, hi in zip(edges[:-1], edges[1:])], axis=1)

    ba, bb = bands(a), bands(b)
    loud = bb.sum(axis=1) > 1e-3 * bb.sum(axis=1).max()
    la, lb = 10 * np.log10(ba[loud] + 1e-10), 10 * np.log10(bb[loud] + 1e-10)
    return float(np.mean(np.sqrt(np.mean((la - lb) ** 2, axis=1))))


def assert_codec_audio(name: str, got: np.ndarray, want: np.ndarray, rate: int,
                       delay: int = 0) -> None:
    """``got`` (decoded) is ``want`` (herald's PCM, at ``rate``) after ``delay`` samples of
    codec delay: as long to within one codec frame (MP3 only ever adds padding), the same
    samples if lossless, else correlated and spectrally close, and speech."""
    extra, frame = len(got) - delay - len(want), codec_frame(name, rate)
    assert 0 <= extra <= frame if name == "mp3" else abs(extra) <= frame, \
        f"{name}: decoded {len(got)} samples for {len(want)} (+{delay} delay)"
    aligned = got[delay:delay + len(want)]
    if name in ("flac", "wav", "pcm"):  # lossless: the same samples, as two syntheses are
        assert_pcm_close(aligned, want, f"{name} (lossless)")
        return
    corr = float(np.corrcoef(aligned[: len(want)], want[: len(aligned)])[0, 1])
    assert corr > LOSSY_MIN_CORRELATION, f"{name}: correlation with the original {corr:.3f}"
    lsd = spectral_distance_db(aligned, want, rate)
    assert lsd < LOSSY_MAX_SPECTRAL_DB, f"{name}: spectral distance {lsd:.1f} dB"
    assert_speech(aligned, rate)

"""Encoded audio (``tts.codec``): every format, decoded by an independent decoder (ffmpeg,
whose MP3, Opus and FLAC decoders share no code with LAME, libopus and libFLAC), gives back
herald's speech: the same length to within one codec frame, the same content.

The speech is herald's own, streamed in the engine's chunks (small first, larger later) and
fed to the encoders chunk by chunk as a server would.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from tests.audio_checks import assert_speech, pcm16
from tts import SynthesisOptions, to_pcm16
from tts.audio import AudioFormat
from tts.codec import (
    CONTENT_TYPES,
    FORMATS,
    UnsupportedFormat,
    check_format,
    encode,
    encoder,
    opus_rate,
)
from tts.resample import Resampler

TEXT = "The washing machine has finished, and the laundry is ready to be hung up outside."

# Samples per codec frame at the voice's 22 050 Hz: MP3 (MPEG-2 layer III) 576, Opus 20 ms,
# FLAC at the level herald uses 1152; WAV and PCM carry the samples themselves.
FRAME = {"mp3": 576, "opus": 441, "flac": 1152, "wav": 0, "pcm": 0}
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


def decode(name: str, data: bytes, fmt: AudioFormat) -> np.ndarray:
    return pcm16(data) if name == "pcm" else ffmpeg_decode(data, fmt.rate)


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


@pytest.fixture(scope="module")
def speech(synth) -> tuple[list[bytes], AudioFormat]:  # type: ignore[no-untyped-def]
    chunks = [to_pcm16(c.samples) for c in synth.stream(TEXT, SynthesisOptions(seed=7))]
    assert len(chunks) >= 3, "the sentence should come in several chunks"
    return chunks, AudioFormat(synth.voice.config.sample_rate)


def assert_same_audio(name: str, got: np.ndarray, want: np.ndarray, rate: int,
                      delay: int = 0) -> None:
    """``got`` (decoded) is ``want`` (herald's PCM) after ``delay`` samples of codec delay."""
    extra = len(got) - delay - len(want)
    assert 0 <= extra <= FRAME[name] if name == "mp3" else abs(extra) <= FRAME[name], \
        f"{name}: decoded {len(got)} samples for {len(want)} (+{delay} delay)"
    aligned = got[delay:delay + len(want)]
    if name in ("flac", "wav", "pcm"):  # lossless
        assert np.array_equal(np.round(aligned * 32767), np.round(want * 32767)), \
            f"{name} is lossless but the samples differ"
        return
    corr = float(np.corrcoef(aligned[: len(want)], want[: len(aligned)])[0, 1])
    assert corr > LOSSY_MIN_CORRELATION, f"{name}: correlation with the original {corr:.3f}"
    lsd = spectral_distance_db(aligned, want, rate)
    assert lsd < LOSSY_MAX_SPECTRAL_DB, f"{name}: spectral distance {lsd:.1f} dB"
    assert_speech(aligned, rate)


@pytest.mark.parametrize("name", FORMATS)
def test_stream_decodes_to_the_speech(speech, name: str) -> None:  # type: ignore[no-untyped-def]
    chunks, fmt = speech
    enc = encoder(name, fmt)
    assert enc.content_type == CONTENT_TYPES[name]
    data = b"".join([enc.feed(c) for c in chunks] + [enc.finish()])
    want = pcm16(b"".join(chunks))
    got = decode(name, data, fmt)
    assert_same_audio(name, got, want, fmt.rate, MP3_STREAM_DELAY if name == "mp3" else 0)


@pytest.mark.parametrize("name", FORMATS)
def test_whole_file_decodes_to_the_speech(speech, name: str) -> None:  # type: ignore[no-untyped-def]
    """``encode`` writes complete headers: an MP3's LAME tag lets the decoder drop the delay."""
    chunks, fmt = speech
    pcm = b"".join(chunks)
    got = decode(name, encode(name, fmt, pcm), fmt)
    assert_same_audio(name, got, pcm16(pcm), fmt.rate)


@pytest.mark.parametrize("name", FORMATS)
def test_first_audio_comes_out_with_the_first_chunk(speech, name: str) -> None:  # type: ignore[no-untyped-def]
    """What ``feed`` returns for the first chunk already decodes to audio (not only a
    header): a client can start playing before the rest is synthesized."""
    chunks, fmt = speech
    enc = encoder(name, fmt)
    first = enc.feed(chunks[0])
    assert first, f"{name}: nothing out after the first chunk"
    heard = decode(name, first, fmt)
    assert len(heard) >= fmt.rate // 50, f"{name}: the first bytes hold {len(heard)} samples"
    rest = b"".join([enc.feed(c) for c in chunks[1:]] + [enc.finish()])
    got = decode(name, first + rest, fmt)
    assert_same_audio(name, got, pcm16(b"".join(chunks)), fmt.rate,
                      MP3_STREAM_DELAY if name == "mp3" else 0)


def test_opus_is_fed_a_rate_it_takes(speech) -> None:  # type: ignore[no-untyped-def]
    chunks, fmt = speech
    assert [opus_rate(r) for r in (8000, 16000, 22050, 24000, 44100, 48000)] == \
        [8000, 16000, 24000, 24000, 48000, 48000]
    enc = encoder("opus", fmt)
    assert enc.audio_format.rate == 24000 and enc.source == fmt
    # A 16 kHz voice's audio goes in as it is.
    to16 = Resampler(fmt.rate, 16000)
    pcm = to_pcm16(np.concatenate([to16.process(pcm16(b"".join(chunks))), to16.flush()]))
    fmt16 = AudioFormat(16000)
    enc16 = encoder("opus", fmt16)
    assert enc16.audio_format.rate == 16000
    data = enc16.feed(pcm) + enc16.finish()
    assert_same_audio("opus", ffmpeg_decode(data, 16000), pcm16(pcm), 16000)


def test_format_names() -> None:
    assert check_format(" MP3 ") == "mp3"
    with pytest.raises(UnsupportedFormat, match="'aac' is not supported; supported: mp3, "
                                                 "opus, flac, wav, pcm"):
        encoder("aac", AudioFormat(22050))


def test_abandoned_stream_frees_its_pipe(speech) -> None:  # type: ignore[no-untyped-def]
    chunks, fmt = speech
    before = len(os.listdir("/proc/self/fd"))
    for name in ("mp3", "opus", "flac"):
        enc = encoder(name, fmt)
        enc.feed(chunks[0])
        enc.close()
        enc.close()
    assert len(os.listdir("/proc/self/fd")) == before

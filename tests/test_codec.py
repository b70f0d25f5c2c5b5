"""Encoded audio (``tts.codec``): every format, decoded by an independent decoder (ffmpeg,
whose MP3, Opus and FLAC decoders share no code with LAME, libopus and libFLAC), gives back
herald's speech: the same length to within one codec frame, the same content.

The speech is herald's own, streamed in the engine's chunks (small first, larger later) and
fed to the encoders chunk by chunk as a server would.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from audio_checks import MP3_STREAM_DELAY, assert_codec_audio, decode, ffmpeg_decode, pcm16

from tts import SynthesisOptions, to_pcm16
from tts.audio import AudioFormat
from tts.codec import (
    CONTENT_TYPES,
    FORMATS,
    UnsupportedFormat,
    check_format,
    encode,
    encoder,
)
from tts.resample import Resampler

TEXT = "The washing machine has finished, and the laundry is ready to be hung up outside."

@pytest.fixture(scope="module")
def speech(synth) -> tuple[list[bytes], AudioFormat]:  # type: ignore[no-untyped-def]
    chunks = [to_pcm16(c.samples) for c in synth.stream(TEXT, SynthesisOptions(seed=7))]
    assert len(chunks) >= 3, "the sentence should come in several chunks"
    return chunks, AudioFormat(synth.voice.config.sample_rate)


@pytest.mark.parametrize("name", FORMATS)
def test_stream_decodes_to_the_speech(speech, name: str) -> None:  # type: ignore[no-untyped-def]
    chunks, fmt = speech
    enc = encoder(name, fmt)
    assert enc.content_type == CONTENT_TYPES[name]
    data = b"".join([enc.feed(c) for c in chunks] + [enc.finish()])
    want = pcm16(b"".join(chunks))
    got = decode(name, data, fmt.rate)
    assert_codec_audio(name, got, want, fmt.rate, MP3_STREAM_DELAY if name == "mp3" else 0)


@pytest.mark.parametrize("name", FORMATS)
def test_whole_file_decodes_to_the_speech(speech, name: str) -> None:  # type: ignore[no-untyped-def]
    """``encode`` writes complete headers: an MP3's LAME tag lets the decoder drop the delay."""
    chunks, fmt = speech
    pcm = b"".join(chunks)
    got = decode(name, encode(name, fmt, pcm), fmt.rate)
    assert_codec_audio(name, got, pcm16(pcm), fmt.rate)


@pytest.mark.parametrize("name", FORMATS)
def test_first_audio_comes_out_with_the_first_chunk(speech, name: str) -> None:  # type: ignore[no-untyped-def]
    """What ``feed`` returns for the first chunk already decodes to audio (not only a
    header): a client can start playing before the rest is synthesized."""
    chunks, fmt = speech
    enc = encoder(name, fmt)
    first = enc.feed(chunks[0])
    assert first, f"{name}: nothing out after the first chunk"
    heard = decode(name, first, fmt.rate)
    assert len(heard) >= fmt.rate // 50, f"{name}: the first bytes hold {len(heard)} samples"
    rest = b"".join([enc.feed(c) for c in chunks[1:]] + [enc.finish()])
    got = decode(name, first + rest, fmt.rate)
    assert_codec_audio(name, got, pcm16(b"".join(chunks)), fmt.rate,
                      MP3_STREAM_DELAY if name == "mp3" else 0)


def test_opus_is_fed_48_khz_from_any_voice(speech) -> None:  # type: ignore[no-untyped-def]
    """A 22 050 Hz voice and a 16 kHz one: both resampled to Opus's 48 kHz, both heard back
    as they were (compared at the voice's rate), and ``samples`` counts what went in."""
    chunks, fmt = speech
    to16 = Resampler(fmt.rate, 16000)
    pcm16k = to_pcm16(np.concatenate([to16.process(pcm16(b"".join(chunks))), to16.flush()]))
    for source, pcm in ((fmt, b"".join(chunks)), (AudioFormat(16000), pcm16k)):
        enc = encoder("opus", source)
        assert enc.audio_format == AudioFormat(48000) and enc.source == source
        data = enc.feed(pcm) + enc.finish()
        n = len(pcm) // 2
        assert enc.samples == Resampler(source.rate, 48000).expected_length(n)
        assert_codec_audio("opus", ffmpeg_decode(data, source.rate), pcm16(pcm), source.rate)


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

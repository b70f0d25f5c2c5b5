"""Encoded audio: the PCM herald makes, as MP3, Ogg Opus, FLAC, WAV or raw PCM.

One library does every codec: libsndfile (through ``soundfile``, whose wheels carry a
libsndfile built with LAME, mpg123, libopus, libvorbis and libFLAC, for x86-64 and aarch64
alike), so nothing here encodes by hand and nothing needs a system codec package.

Encoding is streaming: ``feed`` takes s16le PCM as the engine produces it and returns the
encoded bytes that are ready, so a client can start playing while the rest is synthesized.
A streaming encoder's libsndfile writes into a pipe, which it knows it cannot seek back in:
it then writes nothing that would need completing at the end (FLAC's STREAMINFO says
"length unknown", as the format allows; MP3 goes without LAME's info frame, so a decoder
plays the encoder's delay of about 50 ms of silence first and a little padding last).
``encode`` makes a whole file instead, into memory, headers complete (an MP3's LAME tag
then tells decoders the delay and padding to drop), for answers sent in one piece.

Three settings make the first bytes come early:

* Ogg pages: libsndfile closes an Opus page once it holds ``_OGG_PAGE_MS`` of audio (by
  default it holds a page back for a second);
* FLAC: compression levels 0-2 use blocks of 1152 samples (4096 above), so a block is
  complete within the engine's first chunk of about 2000 samples;
* MP3: LAME hands out frames as it completes them (with its look-ahead of one frame).

Opus is fed 48 kHz, resampled with ``tts.resample``: its own rate, the one Ogg Opus decoders
play back at whatever the input was, and the cheapest to encode at libsndfile's default
bitrate (about 64 kbit/s for mono, which libopus codes in its CELT mode; at the ~35 kbit/s
libsndfile picks for 16 or 24 kHz input it takes the SILK path, three to five times the
CPU).
"""

from __future__ import annotations

import io
import os
import weakref
from dataclasses import dataclass
from typing import Literal, get_args

import soundfile

from .audio import AudioFormat, pcm16_to_float, to_pcm16, wav_bytes, wav_stream_header
from .resample import Resampler

CodecName = Literal["mp3", "opus", "flac", "wav", "pcm"]
FORMATS: tuple[str, ...] = get_args(CodecName)

CONTENT_TYPES: dict[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
EXTENSIONS: dict[str, str] = {"mp3": ".mp3", "opus": ".opus", "flac": ".flac", "wav": ".wav",
                              "pcm": ".pcm"}

OPUS_RATE = 48000
_OGG_PAGE_MS = 50.0  # SFC_SET_OGG_PAGE_LATENCY_MS: the least libsndfile takes (default 1000)
_SFC_SET_OGG_PAGE_LATENCY_MS = 0x1302  # from sndfile.h; soundfile has no name for it
_PIECE = 8192  # samples per libsndfile write in a stream (see _Libsndfile._write)
_FLAC_LEVEL = 0.25  # libsndfile's 0..1 scale; x 8 = FLAC level 2, the last with 1152 blocks


@dataclass(frozen=True)
class _Codec:
    major: str  # libsndfile's format and subtype names
    subtype: str
    compression: float | None = None


_CODECS: dict[str, _Codec] = {
    "mp3": _Codec("MP3", "MPEG_LAYER_III"),
    "opus": _Codec("OGG", "OPUS"),
    "flac": _Codec("FLAC", "PCM_16", _FLAC_LEVEL),
}


class UnsupportedFormat(ValueError):
    """An audio format name herald does not encode."""


def check_format(name: str) -> CodecName:
    """``name`` as a codec name, or UnsupportedFormat saying which ones there are."""
    key = name.strip().lower()
    if key not in FORMATS:
        raise UnsupportedFormat(f"audio format {name!r} is not supported; "
                                f"supported: {', '.join(FORMATS)}")
    return key  # type: ignore[return-value]


class Encoder:
    """One stream of audio in one format. ``feed`` s16le PCM at ``source`` as it comes, get
    what is encoded so far; ``finish`` once, for the rest. Encoding a chunk of audio takes a
    small fraction of its duration (LAME and libopus are the costly ones), so ``feed`` may
    run wherever the chunk arrives.

    ``format`` is the codec name, ``content_type`` its MIME type, ``audio_format`` what the
    encoded audio is (the source's, except Opus's rate), ``samples`` how many samples at that
    rate have gone in so far.
    """

    format: CodecName
    content_type: str
    source: AudioFormat
    audio_format: AudioFormat
    samples: int = 0

    def feed(self, pcm: bytes) -> bytes:
        raise NotImplementedError

    def finish(self) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        """Abandon the stream before ``finish`` (the client went away); ``finish`` closes
        too. Idempotent."""


def output_format(name: CodecName, source: AudioFormat) -> AudioFormat:
    """What a decoder of ``name`` gets back from audio in ``source``: Opus always decodes at
    48 kHz; the others keep the source's rate."""
    rate = OPUS_RATE if name == "opus" else source.rate
    return AudioFormat(rate, source.width, source.channels)


def encoder(name: str, source: AudioFormat) -> Encoder:
    """A streaming encoder for format ``name`` (see FORMATS); raises UnsupportedFormat."""
    codec = check_format(name)
    if source.width != 2:
        raise ValueError(f"encoders take 16-bit PCM, not {source.width * 8}-bit")
    if codec == "pcm":
        return _Raw(source)
    if codec == "wav":
        return _WavStream(source)
    return _Libsndfile(codec, source, stream=True)


def encode(name: str, source: AudioFormat, pcm: bytes) -> bytes:
    """Whole audio as one file of format ``name``, its headers complete (a WAV's sizes, a
    FLAC's length and checksum, an MP3's LAME tag with the encoder delay for gapless play)."""
    codec = check_format(name)
    if codec == "pcm":
        return pcm
    if codec == "wav":
        return wav_bytes(pcm, source)
    enc = _Libsndfile(codec, source, stream=False)
    return enc.feed(pcm) + enc.finish()


class _Raw(Encoder):
    def __init__(self, source: AudioFormat) -> None:
        self.format, self.content_type = "pcm", CONTENT_TYPES["pcm"]
        self.source = self.audio_format = source

    def feed(self, pcm: bytes) -> bytes:
        self.samples += len(pcm) // (self.source.width * self.source.channels)
        return bytes(pcm)

    def finish(self) -> bytes:
        return b""


class _WavStream(_Raw):
    """A WAV header with the sizes at their maximum (the length is not known yet), then PCM."""

    def __init__(self, source: AudioFormat) -> None:
        super().__init__(source)
        self.format, self.content_type = "wav", CONTENT_TYPES["wav"]
        self._header: bytes | None = wav_stream_header(source)

    def feed(self, pcm: bytes) -> bytes:
        head, self._header = self._header or b"", None
        return head + super().feed(pcm)

    def finish(self) -> bytes:
        head, self._header = self._header or b"", None
        return head


class _Pipe:
    """Where a streaming encoder's libsndfile writes: a pipe, which libsndfile knows it can't
    seek back in, so it writes nothing that needs a seek (LAME's info frame) and leaves the
    length in FLAC's header unknown. ``take`` reads what has arrived without waiting."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._closer = weakref.finalize(self, _close_fds, self.read_fd, self.write_fd)

    def take(self) -> bytes:
        out = bytearray()
        while True:
            try:
                piece = os.read(self.read_fd, 65536)
            except BlockingIOError:
                break
            if not piece:
                break
            out += piece
        return bytes(out)

    def close(self) -> None:
        self._closer()


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


class _Libsndfile(Encoder):
    def __init__(self, codec: CodecName, source: AudioFormat, stream: bool) -> None:
        spec = _CODECS[codec]
        self.format, self.content_type, self.source = codec, CONTENT_TYPES[codec], source
        self.audio_format = output_format(codec, source)
        rate = self.audio_format.rate
        self._resampler = Resampler(source.rate, rate) if rate != source.rate else None
        self._pipe = _Pipe() if stream else None
        self._whole = io.BytesIO()
        self._file = soundfile.SoundFile(
            self._whole if self._pipe is None else self._pipe.write_fd, "w", closefd=False,
            samplerate=rate, channels=source.channels, format=spec.major, subtype=spec.subtype,
            compression_level=spec.compression)
        if spec.major == "OGG":
            self._command(_SFC_SET_OGG_PAGE_LATENCY_MS, "double *", _OGG_PAGE_MS)
        self._out = bytearray()
        self._done = False

    def _command(self, command: int, ctype: str, value: float) -> None:
        # soundfile exposes sf_command only for the settings it names; this one it doesn't.
        ffi, lib = soundfile._ffi, soundfile._snd
        ptr = ffi.new(ctype, value)
        if lib.sf_command(self._file._file, command, ptr, ffi.sizeof(ctype[:-1].strip())):
            raise RuntimeError(f"libsndfile refused command {command:#x} for {self.format}")

    def feed(self, pcm: bytes) -> bytes:
        if self._done:
            raise RuntimeError("feed after finish")
        if not pcm:
            return b""
        if self._resampler is not None:
            pcm = to_pcm16(self._resampler.process(pcm16_to_float(pcm)))
        self._write(pcm)
        return self._take()

    def _write(self, pcm: bytes) -> None:
        # In pieces, each read out before the next: libsndfile's writes block while the pipe
        # is full, and a piece's encoding is far smaller than a pipe holds (64 KiB).
        frame = self.audio_format.width * self.audio_format.channels
        self.samples += len(pcm) // frame
        step = _PIECE * frame
        for start in range(0, len(pcm), step):
            self._file.buffer_write(pcm[start:start + step], dtype="int16")
            if self._pipe is not None:
                self._out += self._pipe.take()

    def finish(self) -> bytes:
        if self._done:
            return b""
        self._done = True
        if self._resampler is not None:
            self._write(to_pcm16(self._resampler.flush()))
        self._file.close()
        if self._pipe is None:
            return self._whole.getvalue()
        out = self._take()
        self._pipe.close()
        return out

    def close(self) -> None:
        """Abandon the stream (the client went away): free the encoder and its pipe."""
        self._done = True
        self._file.close()
        if self._pipe is not None:
            self._pipe.close()

    def _take(self) -> bytes:
        if self._pipe is not None:
            self._out += self._pipe.take()
        out, self._out = bytes(self._out), bytearray()
        return out

"""The audio format herald hands around, and the one conversion from model output to PCM.

Everything past the model is signed 16-bit little-endian mono PCM at the voice's rate; the
header helpers here are the only place WAV bytes are made (``tts.codec`` encodes the same
PCM as MP3, Ogg Opus or FLAC, and streams WAV with these).
"""

from __future__ import annotations

import io
import struct
import wave
from dataclasses import dataclass

import numpy as np

SAMPLE_WIDTH = 2  # bytes, s16le
CHANNELS = 1


@dataclass(frozen=True)
class AudioFormat:
    rate: int
    width: int = SAMPLE_WIDTH
    channels: int = CHANNELS

    @property
    def bytes_per_second(self) -> int:
        return self.rate * self.width * self.channels

    def as_dict(self) -> dict[str, int]:
        return {"rate": self.rate, "width": self.width, "channels": self.channels}


def to_pcm16(samples: np.ndarray, gain: float = 1.0) -> bytes:
    """Float samples in [-1, 1] -> s16le bytes, after a fixed gain and clipping."""
    scaled = np.clip(samples * (gain * 32767.0), -32767.0, 32767.0)
    return scaled.astype("<i2").tobytes()


def pcm16_to_float(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32767.0


def wav_bytes(pcm: bytes, fmt: AudioFormat) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(fmt.channels)
        w.setsampwidth(fmt.width)
        w.setframerate(fmt.rate)
        w.writeframes(pcm)
    return buf.getvalue()


def wav_stream_header(fmt: AudioFormat) -> bytes:
    """A WAV header for audio of unknown length (sizes at their maximum, as streamers do)."""
    data_size = 0xFFFFFFFF - 36
    return b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + struct.pack(
        "<IHHIIHH", 16, 1, fmt.channels, fmt.rate, fmt.bytes_per_second,
        fmt.width * fmt.channels, fmt.width * 8,
    ) + b"data" + struct.pack("<I", data_size)

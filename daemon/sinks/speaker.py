"""Local playback through sounddevice (PortAudio -> ALSA). STUB: to be built (issue 3).

Contract used by the scheduler:

    sink = SpeakerSink(settings, metrics)
    await sink.start(); await sink.stop()
    sink.volume = 0.5                       # 0..1, applies from the next block
    stats = await sink.play(fmt, chunks, on_first_audio)
        # fmt: tts.AudioFormat; chunks: AsyncIterator[bytes] of s16le mono PCM.
        # Returns once the audio has drained from the device (PlaybackStats).
        # on_first_audio() is called when the first block is handed to the device.
        # Raises SpeakerUnavailable when the device is missing or busy (after logging).
    sink.cut()                              # interrupt: short fade-out, play() returns early
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from pydantic import BaseModel

from tts import AudioFormat

from ..metrics import Metrics


class SpeakerUnavailable(Exception):
    """The sound device is missing, busy or failed."""


class SpeakerSettings(BaseModel):
    enabled: bool = True
    device: str | None = None  # PortAudio device name or number; None = system default
    volume: float = 1.0


@dataclass
class PlaybackStats:
    samples: int = 0
    underruns: int = 0
    cut: bool = False


class SpeakerSink:
    name = "speaker"

    def __init__(self, settings: SpeakerSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.volume = settings.volume

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def play(self, fmt: AudioFormat, chunks: AsyncIterator[bytes],
                   on_first_audio: Callable[[], None] | None = None) -> PlaybackStats:
        raise SpeakerUnavailable("speaker sink not built yet")

    def cut(self) -> None:
        pass

"""What the scheduler needs from its sinks: a speaker, and network sinks (the MQTT audio topic),
so it depends on these contracts rather than on the sound-device or broker code (tests drive
the scheduler with a speaker of their own)."""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from typing import Protocol

from tts import AudioFormat

from .speaker import SpeakerUnavailable

__all__ = ["NetworkSink", "NetworkStream", "Played", "Speaker", "SpeakerUnavailable"]


class Played(Protocol):
    """How one utterance went on the device."""

    @property
    def underruns(self) -> int: ...  # episodes of an empty buffer while audio was coming

    @property
    def cut(self) -> bool: ...  # stopped before its end


class Speaker(Protocol):
    """One utterance at a time on the sound device, with the next one cued behind it.

    ``play`` raises SpeakerUnavailable when the device is missing, busy or failed."""

    async def play(self, fmt: AudioFormat, chunks: AsyncIterable[bytes],
                   on_first_audio: Callable[[], None] | None = None, key: object = None,
                   pause: float = 0.0) -> Played: ...

    def cue(self, key: object, fmt: AudioFormat, pcm: bytes, pause: float = 0.0,
            on_first_audio: Callable[[], None] | None = None) -> None: ...

    def cut(self, key: object = None) -> None: ...


class NetworkStream(Protocol):
    def write(self, pcm: bytes) -> None: ...
    def close(self, outcome: str = "finished") -> None: ...


class NetworkSink(Protocol):
    name: str

    def open(self, request_id: str, fmt: AudioFormat) -> NetworkStream: ...

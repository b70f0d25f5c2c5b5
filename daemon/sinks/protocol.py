"""What the scheduler needs from its sinks: a speaker, and network sinks (the MQTT audio topic),
so it depends on these contracts rather than on the sound-device or broker code (tests drive
the scheduler with a speaker of their own)."""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from typing import Protocol

from tts import AudioFormat

from ..errors import HeraldError

__all__ = ["NetworkSink", "NetworkStream", "Played", "Speaker", "SpeakerUnavailable"]


class SpeakerUnavailable(HeraldError):
    """The sound device is missing, busy or failed, or an utterance could make no progress.
    The message says what to do."""


class Played(Protocol):
    """How one utterance went on the device."""

    @property
    def underruns(self) -> int: ...  # episodes of an empty buffer while audio was coming

    @property
    def cut(self) -> bool: ...  # stopped before its end

    @property
    def skew(self) -> float | None: ...  # seconds its start was late (None: no start time)


class Speaker(Protocol):
    """One utterance at a time on the sound device, with the next one cued behind it
    (``daemon.sinks.speaker.SpeakerSink`` is one; tests drive the scheduler with their own)."""

    async def play(self, fmt: AudioFormat, chunks: AsyncIterable[bytes],
                   on_first_audio: Callable[[], None] | None = None, key: object = None,
                   pause: float = 0.0, start_at: float | None = None,
                   preroll: float = 0.0) -> Played:
        """Play one utterance (s16le mono ``chunks`` in ``fmt``); return once it has drained
        from the device, or was cut. ``on_first_audio()`` runs on the loop when its first
        audio goes to the device. ``key`` names it for cut(key) and cue(key, ...) (by
        identity). ``pause``: at least this much silence after the previous utterance, if
        that one ended by itself. ``start_at`` (wall clock, ``time.time()`` seconds): its
        first sample reaches the device's output at that instant, or as soon as it can
        after it (``pause`` then doesn't apply); ``Played.skew`` says how late it was.
        ``preroll``: at least this many seconds of it buffered before its first sample
        goes out (or all of it, if it is shorter), for audio that comes over a network;
        ``on_first_audio`` runs when it does go out.
        Raises SpeakerUnavailable when the device is missing, busy or fails, or the
        utterance could make no progress (after logging)."""
        ...

    def cue(self, key: object, fmt: AudioFormat, pcm: bytes, pause: float = 0.0,
            on_first_audio: Callable[[], None] | None = None) -> None:
        """The whole next utterance, known before the current one ends: it follows the
        current one after ``pause``, in the same device stream; play(..., key=key) claims
        it."""
        ...

    def cut(self, key: object = None) -> None:
        """Interrupt the utterance named ``key`` (None: the one being heard) with a short
        fade-out; its play() returns early."""
        ...

    def stalled(self) -> str | None:
        """What is wrong while an utterance has audio to play and the device takes none;
        None otherwise."""
        ...


class NetworkStream(Protocol):
    def write(self, pcm: bytes) -> None: ...
    def close(self, outcome: str = "finished") -> None: ...


class NetworkSink(Protocol):
    name: str

    def open(self, request_id: str, fmt: AudioFormat) -> NetworkStream: ...

"""What a playback reports, and one utterance's playback as the event loop sees it: a mixer
``Voice`` whose hooks reach the loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...settings import SpeakerSettings
from .clock import DeviceClock
from .mixer import State, Voice


@dataclass
class PlaybackStats:
    samples: int = 0  # samples of the input (voice rate) handed to the device
    underruns: int = 0  # episodes of an empty buffer while the utterance was producing
    cut: bool = False
    device_rate: int = 0  # rate the device ran at (!= input rate: resampled)
    xruns: int = 0  # underflows PortAudio reported on the device itself
    # Asked to start at a wall-clock instant: when its first sample reached the DAC (the
    # device's estimate) minus that instant, in seconds; positive: late. None otherwise, or
    # when none of it was played.
    skew: float | None = None


class Playback(Voice):
    """A voice whose hooks reach the event loop: ``play()`` waits on ``done``, the feeder on
    ``space``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, src_rate: int, dev_rate: int,
                 settings: SpeakerSettings, on_first_audio: Callable[[], None] | None,
                 key: object = None) -> None:
        super().__init__(src_rate, dev_rate, settings, key)
        self.loop = loop
        self.on_first_audio = on_first_audio  # replaced under ``lock`` (a claimed cue)
        self.done: asyncio.Future[None] = loop.create_future()
        self.space = asyncio.Event()
        # Held for its start time: the loop's timer that starts the stream (see the sink).
        self.wake: asyncio.TimerHandle | None = None

    def also_on_first_audio(self, fn: Callable[[], None] | None) -> None:
        """Another first-audio callback (play()'s, for a claimed cue): now if its audio has
        started, else along with its own."""
        if fn is None:
            return
        with self.lock:
            started = self.first_sent
            if not started:
                before = self.on_first_audio

                def both() -> None:
                    if before is not None:
                        before()
                    fn()

                self.on_first_audio = both
        if started:
            fn()

    def held(self, clock: DeviceClock, lead_in: float, wake: Callable[[Playback], None]
             ) -> bool:
        """Whether it waits for its start time, ready as it is: then ``wake(self)`` runs on
        the loop when its stream is to be started (``lead_in``: seconds of the device's
        lead-in silence, played before the start time)."""
        if self.wake is None and self.start_at is not None and not self.first_sent:
            delay = clock.wake_in(self.start_at, lead_in)
            if delay > 0:
                self.wake = self.loop.call_later(delay, self._woken, wake)
        return self.wake is not None

    def needs_stream(self) -> bool:
        """Whether a start of its stream that PortAudio refused is to be tried again. That
        start's audio thread may have run the callback before PortAudio ended it (on a
        device that takes audio faster than real time: a sound card's buffer is full of
        silence at the start, and the thread is ended at its first wait) and played some or
        all of it, or parked it; or it was cut meanwhile."""
        with self.lock:
            if self.state is State.PARKED and self.ready():
                self.state = State.PLAYING
            return self.state in (State.PLAYING, State.STARVED) and not self.cut

    def _woken(self, wake: Callable[[Playback], None]) -> None:
        self.wake = None
        wake(self)

    def first_audio(self) -> None:
        if self.on_first_audio is not None:
            self.signal(self.on_first_audio)

    def space_freed(self) -> None:
        self.signal(self.space.set)

    def heard(self) -> None:
        self.signal(self.finish)

    def signal(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the loop (from PortAudio's thread)."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed: nobody is waiting any more
            pass

    def finish(self, error: BaseException | None = None) -> None:
        """On the loop: resolve ``play()``'s wait."""
        with self.lock:
            self.state = State.DONE
        if self.wake is not None:
            self.wake.cancel()
            self.wake = None
        if not self.done.done():
            if error is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(error)
        self.space.set()


@dataclass
class Quiet:
    """An utterance that has made no progress since ``since`` (monotonic)."""

    since: float
    report_after: float  # seconds of it that a working device may show
    device: str

    def stalled(self) -> str | None:
        """What is wrong, once it has been quiet for longer than a working device would be."""
        seconds = time.monotonic() - self.since
        if seconds <= self.report_after:
            return None
        return (f"the speaker has played nothing for {seconds:.0f} s with audio to play "
                f"(sound device {self.device!r})")

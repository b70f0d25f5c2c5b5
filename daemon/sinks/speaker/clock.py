"""The device's clock and the wall clock: starting an utterance at an agreed instant.

Satellites that play one announcement together agree on a wall-clock instant (``time.time()``
seconds; the hosts keep their clocks in step with NTP). Each must make the first sample of
the utterance reach its DAC at that instant. What a device knows is its own clock: PortAudio
stamps every callback with ``currentTime`` (now) and ``outputBufferDacTime`` (when the
block's first frame will reach the DAC: now plus the delay ALSA reports, i.e. what its buffer
and the hardware hold ahead of the block). On ALSA both are PCM status timestamps, on
CLOCK_MONOTONIC; other host APIs use other bases. ``DeviceClock`` is the one place where the
two clocks meet:

* it keeps the offset between them (wall minus device), measured in every callback. A
  sample taken in the callback can only be too big (the thread ran after the device's
  clock was read), so the estimate is the smallest sample of the last ``WINDOW`` seconds:
  a late thread doesn't move it, a stepped clock is followed within that time;
* a block's DAC time is the later of what the device reports for it and what the blocks
  before it in this stream make it (the previous one's DAC time plus its length): a device
  cannot play a block before it has played the one before. On a real device the two agree;
  where buffering goes unreported (ALSA's file plugin holds a period's worth, a FIFO behind
  it more) the reports jump back and forth, and the blocks' own count keeps the timeline
  continuous;
* the mixer converts an utterance's start instant to the device's clock once, when the
  stream is running, and places its first sample in the block whose DAC time reaches it,
  with silence before it in that block (``Mixer``); the start skew reported is that
  sample's DAC time, mapped back to wall clock, minus the instant asked for;
* it learns how long the device takes from "start the stream" to its first block at the
  DAC (ALSA plays a buffer of silence first), so that the sink wakes the stream just
  early enough and holds nothing in the meantime: ``wake_in``.

A device that takes audio faster than real time (ALSA's null and file plugins writing to a
plain file) runs the callback as fast as it returns, so the blocks' count runs ahead of the
clock: the silence before the instant and the first sample are written at once when the
stream wakes, ``START_MARGIN`` or so early, and the skew is what a device playing in real
time would have had. Such a device is good for what was written, not for when.
"""

from __future__ import annotations

import math
import time
from collections import deque

# Seconds the stream is started earlier than it needs: the loop's timer firing late, the
# speaker thread's hop and PortAudio's start. Only silence is played in it.
START_MARGIN = 0.1
# Seconds of offset samples the estimate is the smallest of: dozens of callbacks, and short
# enough that NTP's slewing (at most 500 ppm) moves the offset by less than a millisecond.
WINDOW = 2.0
# How far ahead of "now" a DAC time can sensibly be; beyond it the stamps are not usable.
MAX_DELAY = 10.0


class DeviceClock:
    """One output stream's clock, fed by its callback (PortAudio's thread), read by the mixer
    in that same callback and by the sink on the loop."""

    def __init__(self, latency: float, rate: int) -> None:
        """``latency``: the output latency PortAudio reports for the stream, the first guess
        of how long it takes from starting the stream to its first block at the DAC;
        ``rate``: the stream's frame rate."""
        self.latency, self.rate = latency, rate
        self.startup = latency  # learnt: stream start -> first block at the DAC, seconds
        self.offset: float | None = None  # wall clock minus device clock
        # (device time, offset sample) of the last WINDOW seconds, samples increasing: the
        # first is the smallest
        self._samples: deque[tuple[float, float]] = deque()
        self._started_at: float | None = None  # wall time the sink started the stream
        self._frames = 0  # frames handed to the device since the stream started
        self._anchor: float | None = None  # device time of the stream's frame 0

    def tick(self, current: float, dac: float, frames: int) -> float:
        """In the callback, with PortAudio's ``currentTime`` and ``outputBufferDacTime`` for
        a block of ``frames``: the block's DAC time on the device's clock. Without usable
        stamps (a host API that gives none), the monotonic clock and the reported latency
        stand in for them."""
        wall = time.time()
        if not (current > 0 and 0 <= dac - current < MAX_DELAY
                and math.isfinite(current) and math.isfinite(dac)):
            current = time.monotonic()
            dac = current + self.latency
        sample, samples = wall - current, self._samples
        if samples and current < samples[-1][0]:  # the device's clock went back: a new base
            samples.clear()
        while samples and samples[-1][1] >= sample:
            samples.pop()
        samples.append((current, sample))
        while samples[0][0] < current - WINDOW:
            samples.popleft()
        self.offset = samples[0][1]
        started, self._started_at = self._started_at, None
        if started is not None:  # the first block since the sink started the stream
            self._frames, self._anchor = 0, None
        elapsed = self._frames / self.rate
        if self._anchor is None or dac - elapsed > self._anchor:
            self._anchor = dac - elapsed
        dac = self._anchor + elapsed
        self._frames += frames
        if started is not None:
            took = dac + self.offset - started
            # Up at once (starting late costs a late start), down slowly (one quick start
            # on a loaded machine is not the rule).
            self.startup = took if took > self.startup else self.startup + (
                took - self.startup) / 4
        return dac

    def to_device(self, wall: float) -> float:
        """A wall-clock instant on the device's clock (once the stream has run)."""
        return wall - (self.offset or 0.0)

    def to_wall(self, device: float) -> float:
        """A device-clock instant (a DAC time) on the wall clock."""
        return device + (self.offset or 0.0)

    def starting(self) -> None:
        """The sink starts the stream now: its first block tells how long that takes."""
        self._started_at = time.time()

    def wake_in(self, start_at: float, lead_in: float = 0.0) -> float:
        """Seconds from now until the stream must be started for a first sample at
        ``start_at`` (wall clock), with ``lead_in`` seconds of silence (a device that wakes
        late) before it; zero or less: start it now."""
        return start_at - lead_in - self.startup - START_MARGIN - time.time()

    def start_by(self, start_at: float | None, lead_in: float = 0.0) -> float | None:
        """``wake_in`` as an instant on ``time.monotonic()``'s clock: the latest the stream
        may be started for a first sample at ``start_at``; None without a start time."""
        if start_at is None:
            return None
        return time.monotonic() + self.wake_in(start_at, lead_in)

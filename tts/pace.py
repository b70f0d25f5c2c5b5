"""How many latent frames the playing lane decodes next: as few windows as its listener allows.

Every window costs a fixed few milliseconds besides its frames (hundreds of small tensor
operations, every weight read again), so a sentence made in few large windows costs less
than one made in many small ones. But a listener plays from the first window on, and each
window must be done before the audio handed out so far runs out. So the first window is
small (the first audio is early), and each window after it is as large as that audio pays
for at the pace the windows before it were made, less a margin; at least twice the one
before (the plan that holds on any machine that runs in real time at all) and at most
``largest`` (a window is what another request waits for at most before it gets a turn).

Beside other syntheses (``tts.options.Demand``), a window holds what the demand asks and is
not made larger than the plan: a larger one would delay the others' turns unannounced.

A window's pace is known only once it has run, and it changes when a helper process is
handed work while another process keeps a core busy: the lane, the helper and the other
process then share the cores, and the lane's next window runs several times slower than
the one before it (``crowd``). What the buffer pays for is reckoned at that slower pace
until a window has been measured at it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

MARGIN = 0.05  # seconds of audio kept in hand when sizing a window by what is buffered
# How many times slower than the last window the next may run after work is handed to a
# helper beside a busy process: measured on 2 vCPUs, the playing lane's flow and generator
# took 2.7x and 2.9x as long a frame right after the cut as in the window before it
# (bench/README.md, "Measurements behind the defaults").
CROWDED = 3.0


class Pace:
    """The audio one playing lane has handed out, and what its windows cost."""

    def __init__(self, frame_seconds: float, clock: Callable[[], float] = time.perf_counter,
                 margin: float = MARGIN) -> None:
        self.frame_seconds = frame_seconds  # seconds of audio in one latent frame
        self.clock = clock
        self.margin = margin
        self.first_out: float | None = None  # when the first audio was handed out
        self.handed = 0.0  # seconds of audio handed out
        self.per_frame: float | None = None  # compute seconds per frame, last window
        self.slowdown = 1.0  # the next window's pace against the last one's (``crowd``)
        self.crowded = False  # work was handed to helpers beside a busy process (``crowd``)

    @classmethod
    def plan_only(cls) -> Pace:
        """A pace that never grows a window past the plan (nothing is ever buffered)."""
        return cls(1.0, clock=lambda: 0.0, margin=math.inf)

    def buffered(self) -> float:
        """Seconds of audio handed out and not yet played, for a listener that plays from
        the first chunk on."""
        if self.first_out is None:
            return 0.0
        return max(0.0, self.handed - (self.clock() - self.first_out))

    def spare(self) -> float:
        """Seconds of buffered audio a window may take, the margin kept."""
        return self.buffered() - self.margin

    def _per_frame(self) -> float | None:
        """Compute seconds a frame of the next window is reckoned at; None before any
        audio is out."""
        if self.first_out is None or self.per_frame is None:
            return None
        return self.per_frame * self.slowdown

    def affordable(self) -> int:
        """Frames the buffered audio pays for at the last window's pace; 0 before any."""
        return _frames(self.spare(), self._per_frame())

    def size(self, planned: int, largest: int, asked: int | None) -> int:
        """The next window's frames: the plan, grown to what the buffer pays for while nothing
        else waits (``asked`` None), or to what a demand asks."""
        if asked is None:
            return min(largest, max(planned, self.affordable()))
        return min(largest, max(planned, asked))

    def foldable(self, size: int) -> int:
        """Frames a window of ``size`` may take on beyond it and still be done before the
        audio handed out runs out (the margin spent), at the last window's pace; 0 before
        any. A sentence's last few frames are folded into the window before them rather than
        made a window of their own, which would cost a window's fixed overhead."""
        return max(0, _frames(self.buffered(), self._per_frame()) - size)

    def flow_ahead(self, cap: int, flow_ran: tuple[int, float] | None, window: int,
                   planned: int) -> int:
        """Frames the flow may run ahead of what the next window of ``window`` frames needs:
        what half the buffered audio pays for at the flow's last measured pace (``flow_ran``:
        frames, seconds), at most ``cap``. Every flow push costs a few milliseconds of fixed
        overhead, and running ahead spares pushes; but the frames computed early delay the
        next chunk, so only as far as the audio already out covers them. Before the first
        chunk nothing is buffered and nothing runs ahead.

        Once the lane has handed work to helpers beside a busy process (``crowd``), its pace
        swings as they start and stop, and a window grown past the plan (``planned``) to
        what the buffer pays for leaves the flow no more than what it does not take: there,
        the window and half the buffer's worth of flow besides made the next chunk late.
        Elsewhere a later window's pace is over-estimated by the first one's, which carries
        the look-ahead of both networks, and the rule would only cost flow pushes (a short
        command 7-12% more at one lane)."""
        per_frame = self._per_frame()
        if flow_ran is None or flow_ran[0] <= 0 or per_frame is None:
            return 0
        spare = self.spare()
        left = 0.5 * spare
        if self.crowded and window > planned:
            left = min(left, spare - window * per_frame)
        return max(0, min(cap, _frames(left, self.slowdown * flow_ran[1] / flow_ran[0])))

    def crowd(self) -> None:
        """Work was just handed to a helper beside a busy process: reckon the next window at
        ``CROWDED`` times the last one's pace, until it has run and been measured; and from
        now on, let the flow run ahead only with what a grown window leaves (``flow_ahead``)."""
        self.slowdown = CROWDED
        self.crowded = True

    def ran(self, frames: int, seconds: float) -> None:
        """A window of ``frames`` took ``seconds`` to compute."""
        if frames > 0:
            self.per_frame = seconds / frames
            self.slowdown = 1.0

    def out(self, samples: int, sample_rate: int) -> None:
        """``samples`` of audio were handed out."""
        if self.first_out is None:
            self.first_out = self.clock()
        self.handed += samples / sample_rate


def _frames(seconds: float, per_frame: float | None) -> int:
    """Frames that ``seconds`` of compute pay for at ``per_frame`` seconds each; 0 for none,
    or before anything was measured (``per_frame`` None)."""
    if per_frame is None or seconds <= 0:
        return 0
    return int(min(seconds / max(per_frame, 1e-6), 1e9))


def in_frames(seconds: float | None, frame_seconds: float) -> int | None:
    """A demand's seconds of audio in latent frames (None stays None)."""
    return None if seconds is None else math.ceil(max(0.0, seconds) / frame_seconds)


def next_end(start: int, size: int, fold: int, frames: int, complete: bool) -> int:
    """Where a window of ``size`` frames from ``start`` ends; a tail of at most ``fold``
    frames left after it (once the sentence's length is known) is folded in rather than
    decoded as a sliver of its own."""
    end = start + size
    if complete and frames - end <= fold:
        end = frames
    return min(end, frames)

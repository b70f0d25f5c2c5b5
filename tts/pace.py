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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

MARGIN = 0.05  # seconds of audio kept in hand when sizing a window by what is buffered


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

    def affordable(self) -> int:
        """Frames the buffered audio pays for at the last window's pace; 0 before any."""
        return _frames(self.spare(), self.per_frame if self.first_out is not None else None)

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
        per_frame = self.per_frame if self.first_out is not None else None
        return max(0, _frames(self.buffered(), per_frame) - size)

    def flow_ahead(self, cap: int, flow_ran: tuple[int, float] | None) -> int:
        """Frames the flow may run ahead of what the next window needs: what half of the
        buffered audio pays for at the flow's last measured pace (``flow_ran``: frames,
        seconds), at most ``cap``. Every flow push costs a few milliseconds of fixed
        overhead, and running ahead spares pushes; but the frames computed early delay the
        next chunk, so only as far as the audio already out covers it. Before the first
        chunk nothing is buffered and nothing runs ahead."""
        if flow_ran is None or flow_ran[0] <= 0 or self.first_out is None:
            return 0
        return max(0, min(cap, _frames(0.5 * self.spare(), flow_ran[1] / flow_ran[0])))

    def ran(self, frames: int, seconds: float) -> None:
        """A window of ``frames`` took ``seconds`` to compute."""
        if frames > 0:
            self.per_frame = seconds / frames

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

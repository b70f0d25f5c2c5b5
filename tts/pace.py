"""How many latent frames the playing lane decodes next: as few windows as its listener allows.

Every window costs a fixed few milliseconds besides its frames (hundreds of small tensor
operations, every weight read again), and so does every push of the flow, so a sentence
made in few large windows costs less than one made in many small ones. But a listener plays
from the first window on, and each window must be done before the audio handed out so far
runs out. So the first window is small (the first audio is early), and each window after it
is as large as that audio pays for, less a margin; at least twice the one before (the plan
that holds on any machine that runs in real time at all) and at most ``largest`` (a window
is what another request waits for at most before it gets a turn).

What a window will cost is predicted by ``Costs``: a fixed part and a part per frame,
fitted to the windows made before it. Sizing by the last window's cost per frame instead
would read the first window's fixed part (most of its cost: it has only a few frames) as a
cost per frame, and make the second window a fraction of what the audio out pays for.

Beside other syntheses (``tts.options.Demand``), a window holds what the demand asks and is
not made larger than the plan: a larger one would delay the others' turns unannounced.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

MARGIN = 0.05  # seconds of audio kept in hand when sizing a window by what is buffered
DECAY = 0.85  # weight of a cost measurement against the one after it


class Cost:
    """Seconds a run of ``n`` frames takes: ``fixed + per_frame * n``, fitted by least
    squares to the runs measured so far, the older weighing less (``DECAY`` each), so the fit
    follows a host that gets busier or quieter. Until runs of different lengths have been
    seen the fixed part is unknown and taken as 0 (the cost per frame is then the measured
    runs' average, which over-estimates larger runs: a safe guess)."""

    def __init__(self, decay: float = DECAY) -> None:
        self.decay = decay
        self._lock = threading.Lock()  # one voice's streams may run in several threads
        self._s = [0.0] * 5  # weighted sums: 1, n, n^2, seconds, n * seconds
        self.fixed = 0.0
        self.per_frame: float | None = None

    def add(self, frames: int, seconds: float) -> None:
        if frames <= 0:
            return
        n, y = float(frames), max(0.0, seconds)
        with self._lock:
            s = [v * self.decay for v in self._s]
            for i, v in enumerate((1.0, n, n * n, y, n * y)):
                s[i] += v
            self._s = s
            w, sn, snn, sy, sny = s
            spread = w * snn - sn * sn  # w^2 times the weighted variance of n
            slope = (w * sny - sn * sy) / spread if spread > w * w else -1.0
            fixed = (sy - slope * sn) / w
            if slope > 0 and 0.0 <= fixed:
                self.fixed, self.per_frame = fixed, slope
            else:  # one length only, or a fit that makes no sense: all of it per frame
                self.fixed, self.per_frame = 0.0, sy / sn

    def seconds(self, frames: int) -> float:
        """The predicted seconds of ``frames`` frames (0 for none); 0 before any run."""
        if frames <= 0 or self.per_frame is None:
            return 0.0
        return self.fixed + self.per_frame * frames

    @property
    def known(self) -> bool:
        return self.per_frame is not None


class Costs:
    """What the generator's windows and the flow's pushes cost one voice in this process.
    Shared by its streams, so that a stream's first windows are sized by what the windows
    before them cost, not by its own first one alone."""

    def __init__(self) -> None:
        self.window = Cost()
        self.flow = Cost()


class Pace:
    """The audio one playing lane has handed out, and what its windows cost."""

    def __init__(self, frame_seconds: float, clock: Callable[[], float] = time.perf_counter,
                 margin: float = MARGIN, costs: Costs | None = None) -> None:
        self.frame_seconds = frame_seconds  # seconds of audio in one latent frame
        self.clock = clock
        self.margin = margin
        self.costs = costs or Costs()
        self.first_out: float | None = None  # when the first audio was handed out
        self.handed = 0.0  # seconds of audio handed out

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

    def affordable(self, budget: float, pushed: Callable[[int], int] = lambda n: 0,
                   largest: int = 1 << 20) -> int:
        """The most frames, up to ``largest``, that a window can have and be made in
        ``budget`` seconds: its generator's frames and the flow's push it needs
        (``pushed``: frames the flow is pushed for a window of ``n``; 0, none); 0 before any
        window was measured."""
        window, flow = self.costs.window, self.costs.flow
        if not window.known or budget <= 0:
            return 0

        def cost(n: int) -> float:
            p = pushed(n)
            return window.seconds(n) + (flow.seconds(p) if p > 0 else 0.0)

        if cost(largest) <= budget:
            return largest
        lo, hi = 0, largest  # cost(lo) fits (0 frames: nothing to make), cost(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid)
        return lo

    def spare(self) -> float:
        """Seconds of buffered audio a window may take, the margin kept; 0 before any audio
        is out."""
        return max(0.0, self.buffered() - self.margin)

    def size(self, planned: int, largest: int, asked: int | None,
             pushed: Callable[[int], int] = lambda n: 0) -> int:
        """The next window's frames: the plan, grown to what the buffer pays for while nothing
        else waits (``asked`` None), or to what a demand asks."""
        if asked is None:
            return min(largest, max(planned, self.affordable(self.spare(), pushed, largest)))
        return min(largest, max(planned, asked))

    def flow_ahead(self, cap: int) -> int:
        """Frames the flow may run ahead of what the next window needs: what half of the
        spare buffered audio pays for at the flow's measured cost, at most ``cap``. Every
        push costs a fixed part, and running ahead spares pushes; but the frames computed
        early delay the next chunk, so only as far as the audio already out covers it.
        Before the first chunk nothing is buffered and nothing runs ahead."""
        flow = self.costs.flow
        if not flow.known or cap <= 0:
            return 0
        budget = 0.5 * self.spare()
        if flow.seconds(1) > budget:
            return 0
        per_frame = flow.per_frame or 1e-9
        return int(min(cap, max(0.0, budget - flow.fixed) / max(per_frame, 1e-9)))

    def ran(self, frames: int, seconds: float, flow: tuple[int, float] | None = None) -> None:
        """A window of ``frames`` took ``seconds`` to compute, of which ``flow`` (frames,
        seconds) in a push of the flow."""
        if flow is not None and flow[0] > 0:
            self.costs.flow.add(flow[0], flow[1])
            seconds -= flow[1]
        self.costs.window.add(frames, seconds)

    def out(self, samples: int, sample_rate: int) -> None:
        """``samples`` of audio were handed out."""
        if self.first_out is None:
            self.first_out = self.clock()
        self.handed += samples / sample_rate


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

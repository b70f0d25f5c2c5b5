"""Which render computes its next chunk when several wait for the synthesis workers.

A stream's listener starts playing at its first chunk; from then on the stream has a
deadline, the moment the audio handed out so far runs out, and missing it is an audible
gap. Taking turns chunk by chunk ignores that: a new stream's first, expensive window
delays every playing stream, whether or not they have audio to spare. So:

* a stream that has not started (or a job that is not a stream at all, such as a voice
  loading) goes first, in the order they came, unless computing its next step would make a
  playing stream miss its deadline. The playing streams' steps are counted on whichever
  worker is free first, as they will run: counted as if one worker took them all, two
  workers keep the playing streams a second or more ahead while new ones wait (six streams
  on two workers: the last first audio a third later, bench/README.md);
* otherwise the playing stream whose audio runs out first goes (earliest deadline first);
* a stream's windows hold enough audio to last while the others take their turns
  (``least_audio``): a stream that starts while five more wait for their first audio
  starts with half a second of it rather than a tenth, so theirs can come before its next;
* a new stream is admitted only while the streams already playing leave the workers room
  for one more in real time (the sum of their real-time factors); until then it waits, and
  says so, rather than making every stream stutter.

Pure functions on plain values: ``daemon.synthesis.workers`` measures and calls them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

HEADROOM = 0.8  # of the workers' time: what playing streams may need together
MARGIN = 0.02  # seconds: a deadline counts as kept only with this much to spare
SLOW_PACE = 0.25  # compute seconds per audio second assumed before any was measured


@dataclass(frozen=True)
class Due:
    """What the scheduler knows of one waiting job."""

    queued: float  # when it joined the queue (monotonic seconds)
    cost: float  # its next step's estimated seconds
    runs_out: float | None = None  # a playing stream's deadline; None: not playing (yet)
    rtf: float | None = None  # a stream's compute seconds per second of audio, so far
    stream: bool = False  # a stream: subject to admission until it plays


def feasible(first_cost: float, playing: Sequence[Due], now: float,
             margin: float = MARGIN, others: Sequence[float] = ()) -> bool:
    """Whether every playing stream still meets its deadline if a step of ``first_cost``
    seconds runs first on the worker choosing, and the playing ones then take one step
    each, earliest deadline first, each on whichever worker is free first. ``others``: when
    each of the other workers is free (the estimated end of its step; ``now`` or earlier:
    idle)."""
    free = [now + first_cost, *(max(now, t) for t in others)]
    heapq.heapify(free)
    for due in sorted(playing, key=lambda d: d.runs_out or 0.0):
        assert due.runs_out is not None
        done = heapq.heappop(free) + due.cost
        if done + margin > due.runs_out:
            return False
        heapq.heappush(free, done)
    return True


def least_audio(ahead: float, buffered: float, pace: float | None, playing: bool = True,
                margin: float = MARGIN) -> float:
    """Seconds of audio a stream's next window should hold so that its listener still has
    some when the stream's turn comes again: after ``ahead`` seconds of the others' work,
    and then its own next window, which (doubling) holds twice this one's audio at ``pace``
    (compute seconds per audio second; unknown: a slow guess). ``buffered``: the audio the
    listener has left now, which pays for part of it.

    A ``playing`` stream's window must also be done before its listener runs out: never
    more than ``buffered`` pays for at ``pace``; the window after it grows again. (The
    first window has no such bound: nobody listens yet.)"""
    pace = pace if pace is not None else SLOW_PACE
    wanted = max(0.0, (ahead + margin - buffered) / max(1.0 - 2 * pace, 0.2))
    if playing:
        wanted = min(wanted, max(0.0, buffered - margin) / max(pace, 1e-3))
    return wanted


def admitted(new: Due, playing_rtfs: Sequence[float], workers: int,
             headroom: float = HEADROOM) -> bool:
    """Whether a stream that has not started may start beside streams needing
    ``playing_rtfs`` of the workers' time: always the first one, then while one more like
    the heaviest playing one fits."""
    if not new.stream or not playing_rtfs:
        return True
    return sum(playing_rtfs) + max(playing_rtfs) <= headroom * workers


def pick(waiting: Sequence[Due], now: float, playing_rtfs: Sequence[float] = (),
         workers: int = 1, others: Sequence[float] = ()) -> int | None:
    """Index of the job in ``waiting`` to run next; None: none may run now (the only ones
    waiting are new streams that do not fit, see ``admitted``).

    ``playing_rtfs``: the real-time factors of every stream playing now, waiting or not
    (a stream whose listener has enough buffered is not in ``waiting`` but needs its share).
    ``others``: when each worker but the one choosing is free (``feasible``)."""
    playing = [i for i, d in enumerate(waiting) if d.runs_out is not None]
    starting = [i for i, d in enumerate(waiting) if d.runs_out is None
                and admitted(d, playing_rtfs, workers)]
    if starting:
        first = min(starting, key=lambda i: waiting[i].queued)
        if feasible(waiting[first].cost, [waiting[i] for i in playing], now, others=others):
            return first
    if playing:
        return min(playing, key=lambda i: waiting[i].runs_out or 0.0)
    return None

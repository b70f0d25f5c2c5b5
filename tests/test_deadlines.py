"""daemon.synthesis.deadlines: which waiting render computes next. Plain values: times are seconds
on any clock, costs are a step's estimated seconds."""

from __future__ import annotations

import pytest

from daemon.synthesis.deadlines import Due, admitted, feasible, least_audio, pick

NOW = 100.0


def playing(runs_out: float, cost: float = 0.01, rtf: float = 0.05) -> Due:
    return Due(queued=NOW - 1, cost=cost, runs_out=runs_out, rtf=rtf, stream=True)


def new(queued: float = NOW - 0.5, cost: float = 0.05) -> Due:
    return Due(queued=queued, cost=cost, stream=True)


def test_a_new_streams_first_chunk_goes_before_playing_ones_with_audio_to_spare() -> None:
    waiting = [playing(NOW + 1.0), new()]
    assert pick(waiting, NOW, [0.05]) == 1


def test_a_playing_stream_about_to_run_out_goes_before_a_new_one() -> None:
    # 40 ms of audio left, the new stream's first chunk takes 50: the playing one first.
    waiting = [new(), playing(NOW + 0.04)]
    assert pick(waiting, NOW, [0.05]) == 1


def test_playing_streams_go_earliest_deadline_first() -> None:
    waiting = [playing(NOW + 0.5), playing(NOW + 0.2), playing(NOW + 0.9)]
    assert pick(waiting, NOW, [0.05] * 3) == 1


def test_new_streams_start_in_the_order_they_came() -> None:
    waiting = [new(queued=NOW - 0.1), new(queued=NOW - 0.3), new(queued=NOW - 0.2)]
    assert pick(waiting, NOW) == 1


def test_a_new_stream_waits_when_every_deadline_together_would_be_missed() -> None:
    """Each playing stream alone has time for the new chunk, but not all of them in turn."""
    waiting = [playing(NOW + 0.095, cost=0.02), playing(NOW + 0.10, cost=0.02), new(cost=0.05)]
    assert feasible(0.05, [waiting[0]], NOW)
    assert not feasible(0.05, waiting[:2], NOW)
    assert pick(waiting, NOW, [0.05, 0.05]) == 0


def test_the_playing_streams_steps_are_counted_on_whichever_worker_is_free_first() -> None:
    """Two playing streams with 0.25 s of audio left, steps of 0.1 s, a new stream's first
    step of 0.2 s: one worker cannot do all three in time, two can (the new step on one, the
    playing ones on the other), unless the other is busy until too late."""
    waiting = [playing(NOW + 0.25, cost=0.1), playing(NOW + 0.25, cost=0.1), new(cost=0.2)]
    assert not feasible(0.2, waiting[:2], NOW)
    assert pick(waiting, NOW, [0.05, 0.05], workers=2) == 0
    idle = [NOW - 1.0]  # idle since a second: free now
    assert feasible(0.2, waiting[:2], NOW, others=idle)
    assert pick(waiting, NOW, [0.05, 0.05], workers=2, others=idle) == 2
    # The other worker's step ends in 0.1 s: the second playing stream's step ends at 0.3 s.
    assert not feasible(0.2, waiting[:2], NOW, others=[NOW + 0.1])
    assert pick(waiting, NOW, [0.05, 0.05], workers=2, others=[NOW + 0.1]) == 0
    # Free in 0.02 s: both playing steps fit on it, the second done at 0.22 s.
    assert feasible(0.2, waiting[:2], NOW, others=[NOW + 0.02])


def test_a_stream_that_does_not_fit_in_real_time_waits() -> None:
    heavy = [0.3, 0.3]  # two playing streams need 60% of one worker
    assert not admitted(new(), heavy, workers=1)
    assert admitted(new(), heavy, workers=2)
    assert admitted(new(), [], workers=1)  # the first stream always starts
    # Only the new stream waits; nothing else is waiting: the worker idles.
    assert pick([new()], NOW, heavy) is None
    # A playing stream still gets its chunks meanwhile.
    assert pick([new(), playing(NOW + 5.0)], NOW, heavy) == 1


def test_jobs_that_are_not_streams_go_in_turn_and_are_never_held() -> None:
    load = Due(queued=NOW - 0.2, cost=0.5)  # a voice loading, say
    assert admitted(load, [0.5, 0.5], workers=1)
    assert pick([Due(queued=NOW - 0.1, cost=0.01), load], NOW, [0.5, 0.5]) == 1


def test_a_window_holds_enough_to_last_while_the_others_take_their_turns() -> None:
    """Nothing ahead and nothing buffered: nothing more than planned. Work ahead: at least
    that much audio, more for the stream's own next (twice as long) window at its pace, and
    the audio still buffered pays for part of it."""
    assert least_audio(0.0, buffered=0.5, pace=0.1, playing=True) == 0.0
    alone = least_audio(0.4, buffered=0.0, pace=0.1, playing=False)
    assert alone > 0.4 + 0.02  # the others' 0.4 s, the margin, and its own next window
    assert alone == pytest.approx((0.4 + 0.02) / (1 - 2 * 0.1))
    assert least_audio(0.4, buffered=0.2, pace=0.1, playing=False) < alone
    assert least_audio(0.4, buffered=0.0, pace=None, playing=False) > alone  # slow guess


def test_a_playing_streams_window_is_done_before_its_listener_runs_out() -> None:
    """With 0.1 s left at a pace of 0.1, a window of more than a second would make the
    listener wait for it: the window is bounded by what the buffered audio pays for; the
    first window (nobody listens yet) is not."""
    bounded = least_audio(2.0, buffered=0.1, pace=0.1, playing=True)
    assert bounded == pytest.approx((0.1 - 0.02) / 0.1)
    assert least_audio(2.0, buffered=0.0, pace=0.1, playing=False) > 2.0

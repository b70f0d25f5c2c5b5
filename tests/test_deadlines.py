"""daemon.deadlines: which waiting render computes next. Plain values: times are seconds on
any clock, costs are a step's estimated seconds."""

from __future__ import annotations

from daemon.deadlines import Due, admitted, feasible, pick

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

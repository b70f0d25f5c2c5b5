"""daemon.synthesis.workers: renders take turns on the worker threads, park without holding one,
stop when closed and stay on one thread when alone. Plain generators stand in for syntheses here
(the machinery is generic); the fronts' tests run it with the real engine."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from waiting import until

from daemon.synthesis.workers import Render, Workers


def chunks(n: int, log: list[tuple[str, int, str]] | None = None, tag: str = "",
           finished: threading.Event | None = None) -> Iterator[int]:
    """n chunks, noting which thread made each and whether the generator was closed."""
    try:
        for i in range(n):
            if log is not None:
                log.append((tag, i, threading.current_thread().name))
            yield i
    finally:
        if finished is not None:
            finished.set()


async def take_all(render: Render[int]) -> list[int]:
    out = []
    try:
        while (item := await render.get()) is not None:
            out.append(item)
    finally:
        render.close()
    return out


@pytest.fixture
def workers() -> Iterator[Callable[[int], Workers]]:
    made: list[Workers] = []

    def make(n: int) -> Workers:
        made.append(Workers(n, name="test"))
        return made[-1]

    yield make
    for w in made:
        w.close(join=2.0)


async def test_a_render_yields_every_chunk_in_order_then_ends(workers) -> None:
    assert await take_all(Render(chunks(50), workers(2), limit=4)) == list(range(50))


async def test_renders_one_after_another_stay_on_one_thread(workers) -> None:
    """So that at two intra-op threads only one OpenMP team ever exists for them."""
    pool = workers(2)
    log: list[tuple[str, int, str]] = []
    for k in range(20):
        await take_all(Render(chunks(3, log, str(k)), pool, limit=2))
    assert len({name for _, _, name in log}) == 1, log


def test_when_free_runs_once_the_worker_is_idle_so_it_takes_what_follows(workers) -> None:
    """A render hands over its last item this way: the consumer starts the next render the
    moment it has it, and the worker that ran the last one must be idle by then."""
    pool = workers(2)
    ran: list[str] = []
    done = threading.Event()

    def second() -> bool:
        ran.append(threading.current_thread().name)
        done.set()
        return False

    def first(hand_over: Callable[[Callable[[], object]], None]) -> Callable[[], bool]:
        def step() -> bool:
            ran.append(threading.current_thread().name)
            hand_over(lambda: pool.dispatch(second))
            return False
        return step

    pool.dispatch(first(Workers.when_free))
    assert done.wait(5)
    assert ran[0] == ran[1], ran
    # Dispatched straight from the step instead, the other (idle) worker takes it.
    ran.clear()
    done.clear()
    pool.dispatch(first(lambda fn: fn()))
    assert done.wait(5)
    assert ran[0] != ran[1], ran


async def test_concurrent_renders_take_turns_chunk_by_chunk(workers) -> None:
    pool = workers(1)
    gate = threading.Event()
    busy = pool.call(gate.wait, 5)  # the worker is taken: both renders queue behind it
    log: list[tuple[str, int, str]] = []
    a = Render(chunks(20, log, "a"), pool, limit=100)
    b = Render(chunks(20, log, "b"), pool, limit=100)
    gate.set()
    assert await asyncio.wrap_future(busy)
    assert await asyncio.gather(take_all(a), take_all(b)) == [list(range(20))] * 2
    assert "".join(tag for tag, _, _ in log) == "ab" * 20


def slow_chunks(n: int, log: list[str], tag: str) -> Iterator[int]:
    """n chunks of 10 ms of work each, noting the order they were made in."""
    for i in range(n):
        time.sleep(0.01)
        log.append(tag)
        yield i


@pytest.mark.parametrize(("audio", "b_waits"), [(10.0, False), (0.001, True)])
async def test_a_new_stream_starts_unless_a_playing_one_would_run_out(
        workers, audio: float, b_waits: bool) -> None:
    """One worker. Stream a plays; b arrives. With seconds of audio out per chunk, a has time
    to spare and b's first chunk goes next; with a millisecond per chunk, a is always about
    to run out and keeps the worker until it is done."""
    pool = workers(1)
    log: list[str] = []
    a = Render(slow_chunks(20, log, "a"), pool, limit=100, seconds=lambda _: audio)
    assert await a.get() == 0  # a plays from its first chunk
    b = Render(slow_chunks(3, log, "b"), pool, limit=100, seconds=lambda _: audio)
    before = log.count("a")
    rest_a, all_b = await asyncio.gather(take_all(a), take_all(b))
    assert rest_a == list(range(1, 20)) and all_b == [0, 1, 2]
    a_before_b = log.index("b") - before
    if b_waits:
        assert log.index("b") > log.index("a", before) and "a" not in log[log.index("b"):]
    else:
        assert a_before_b <= 1, log


async def test_a_stream_that_cannot_fit_in_real_time_waits_and_is_counted(workers) -> None:
    """One worker; stream a needs all of it (10 ms of work per 10 ms of audio): b waits until
    a is done, and the workers say so meanwhile."""
    pool = workers(1)
    log: list[str] = []
    a = Render(slow_chunks(30, log, "a"), pool, limit=100, seconds=lambda _: 0.01)
    for i in range(3):  # a plays, and its pace is measured
        assert await a.get() == i
    b = Render(slow_chunks(2, log, "b"), pool, limit=100, seconds=lambda _: 0.01)
    await asyncio.sleep(0.05)
    assert pool.held == 1
    assert await take_all(a) == list(range(3, 30))
    assert await take_all(b) == [0, 1]
    assert log.index("b") > len(log) - 3 and pool.held == 0


async def test_a_young_stream_counts_at_the_pace_of_whole_windows(workers) -> None:
    """A stream's first windows are small and cost more per second of audio than the whole
    windows it settles into. Once the pool has measured whole windows, a young stream is
    counted at their pace: a second stream starts beside it instead of waiting until the
    first is done because its own small windows made it look like it needed the worker."""
    pool = workers(1)
    log: list[str] = []
    assert await take_all(Render(slow_chunks(4, log, "w"), pool, limit=100,
                                 seconds=lambda _: 1.0)) == [0, 1, 2, 3]
    assert pool.pace is not None and pool.pace < 0.05  # whole 1 s windows at 10 ms each
    # Windows of 20 ms at 10 ms each: half the worker by its own windows so far.
    a = Render(slow_chunks(40, log, "a"), pool, limit=100, seconds=lambda _: 0.02)
    for i in range(3):
        assert await a.get() == i
    assert a.rtf > 0.4 and a.need == pool.pace
    b = Render(slow_chunks(2, log, "b"), pool, limit=100, seconds=lambda _: 1.0)
    rest_a, all_b = await asyncio.gather(take_all(a), take_all(b))
    assert rest_a == list(range(3, 40)) and all_b == [0, 1]
    assert pool.held == 0
    assert "a" in log[log.index("b"):]  # b started while a was still playing


def timed_chunks(plan: list[tuple[float, float]]) -> Iterator[float]:
    """A chunk per (seconds of work, seconds of audio): its audio, after that much work."""
    for work, audio in plan:
        time.sleep(work)
        yield audio


async def test_a_chunk_a_helper_made_leaves_the_pace_to_windows_made_here(workers) -> None:
    """A stream given a helper process gets a helper's span as one long chunk that cost this
    worker nothing. It says nothing of the pace here: windows made here after it still count
    as whole, and the pool's pace follows them."""
    pool = workers(1)
    helped = [(0.01, 1.0), (0.01, 1.0), (0.0, 10.0), (0.01, 1.0)]
    assert await take_all(Render(timed_chunks(helped), pool, limit=100,
                                 seconds=lambda s: s)) == [1.0, 1.0, 10.0, 1.0]
    before = pool.pace  # 1 s windows at 10 ms each
    assert before is not None
    slower = [(0.1, 1.0)] * 6  # 100 ms per 1 s window now (a busy host, say)
    assert await take_all(Render(timed_chunks(slower), pool, limit=100,
                                 seconds=lambda s: s)) == [1.0] * 6
    assert pool.pace > before + 0.03  # frozen at ``before`` if the 10 s chunk had counted


async def test_a_parked_render_holds_no_thread(workers) -> None:
    """One worker: a render nobody reads stops after `limit` chunks, and another one runs."""
    pool = workers(1)
    log: list[tuple[str, int, str]] = []
    stalled = Render(chunks(1000, log, "stalled"), pool, limit=3)
    assert await asyncio.wait_for(take_all(Render(chunks(30), pool, limit=3)), 10) \
        == list(range(30))
    assert sum(tag == "stalled" for tag, _, _ in log) == 3
    # Taking one chunk lets it make one more, and no more than that.
    assert await stalled.get() == 0

    def made() -> int:
        return sum(tag == "stalled" for tag, _, _ in log)

    await until(lambda: made() >= 4, "four chunks made", 10)
    await asyncio.sleep(0.2)  # time for a fifth, were it not parked
    assert made() == 4
    stalled.close()


async def test_closing_stops_the_work_and_closes_the_generator_on_a_worker(workers) -> None:
    pool = workers(1)
    finished = threading.Event()
    log: list[tuple[str, int, str]] = []
    parked = Render(chunks(1000, log, "p", finished), pool, limit=2)
    assert await parked.get() == 0
    await asyncio.sleep(0.1)
    parked.close()
    assert await asyncio.to_thread(finished.wait, 5)
    assert len(log) <= 3  # the chunks it had made, not the thousand

    # Closed while it runs: the step under way is the last.
    gate = threading.Event()
    steps: list[str] = []

    def slow() -> Iterator[int]:
        try:
            for i in range(1000):
                steps.append(threading.current_thread().name)
                gate.wait(5)
                yield i
        finally:
            steps.append("closed on " + threading.current_thread().name)

    running = Render(slow(), pool, limit=1000)
    while not steps:
        await asyncio.sleep(0.01)
    running.close()
    gate.set()
    for _ in range(200):
        if steps[-1].startswith("closed"):
            break
        await asyncio.sleep(0.01)
    assert steps[-1] == "closed on test-0", steps
    assert len(steps) == 2, steps  # one chunk, then the close: nothing computed after it


async def test_an_error_in_the_computation_reaches_the_consumer_after_the_chunks_before(
        workers) -> None:
    def failing() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("no such speaker")

    render = Render(failing(), workers(1), limit=8)
    assert await render.get() == 1
    assert await render.get() == 2
    with pytest.raises(ValueError, match="no such speaker"):
        await render.get()
    render.close()


async def test_the_workers_go_on_after_a_failed_render(workers) -> None:
    pool = workers(1)

    def failing() -> Iterator[int]:
        raise RuntimeError("boom")
        yield 0  # pragma: no cover

    with pytest.raises(RuntimeError, match="boom"):
        await take_all(Render(failing(), pool, limit=2))
    assert await take_all(Render(chunks(3), pool, limit=2)) == [0, 1, 2]


async def test_call_runs_on_a_worker_and_returns_or_raises(workers) -> None:
    pool = workers(1)
    name = await asyncio.wrap_future(pool.call(lambda: threading.current_thread().name))
    assert name == "test-0"
    with pytest.raises(ZeroDivisionError):
        await asyncio.wrap_future(pool.call(lambda: 1 / 0))


async def test_after_close_a_render_fails_instead_of_waiting_forever(workers) -> None:
    pool = workers(1)
    pool.close(join=2.0)
    with pytest.raises(RuntimeError, match="shut down"):
        await asyncio.wait_for(Render(chunks(3), pool, limit=2).get(), 5)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.call(time.time)


def test_close_ends_the_threads(workers) -> None:
    pool = workers(3)
    threads = [w.thread for w in pool._workers]
    assert all(t.is_alive() for t in threads)
    pool.close(join=2.0)
    assert not any(t.is_alive() for t in threads)


def test_a_worker_for_each_core_a_synthesis_uses_unless_set() -> None:
    """Unset, a synthesis uses the cores up to four (its own lane and helper processes) and
    as many syntheses are rendered at once, one core each; set, both are as asked."""
    from daemon.synthesis.engine import cpu_plan
    from tts import default_threads

    assert cpu_plan(None, None) == (default_threads(), default_threads())
    assert cpu_plan(1, 4) == (1, 4)
    assert cpu_plan(3, None) == (3, 3)
    assert cpu_plan(None, 1) == (default_threads(), 1)


async def test_streams_starting_together_get_windows_that_last_through_the_others(
        catalog) -> None:
    """One worker, three streams of the long sentence asked for at once, the real engine.
    Alone, a stream starts with its small first window (the synthesizer's first window
    without helpers: 16 frames, about a fifth of a second); together, the first one's first
    window is never smaller; and whatever the windows, each stream's audio is the lone
    one's (same seed; to float rounding, as any two window plans)."""
    from sentences import LONG_SENTENCE

    from daemon.synthesis.engine import Engine, EngineSettings
    from tts import SynthesisOptions

    engine = Engine(catalog, EngineSettings(threads=1, workers=1))
    opts = SynthesisOptions(seed=7)

    async def one() -> list[np.ndarray]:
        return [c.samples async for c in engine.stream(LONG_SENTENCE, options=opts)]

    try:
        alone = await one()
        together = await asyncio.gather(one(), one(), one())
    finally:
        engine.close(join=2.0)
    rate = engine.audio_format().rate
    synth = catalog.synthesizer()
    assert len(alone[0]) <= (synth.lone_first_window + 1) * synth.model.config.hop_length
    # How much longer depends on what the others' first steps cost on this host (a fast one
    # may need no more); the rule itself, with given costs, is the test after this one.
    assert len(together[0][0]) >= len(alone[0])
    reference = np.concatenate(alone)
    assert len(reference) / rate > 5
    for chunks in together:
        joined = np.concatenate(chunks)
        assert len(joined) == len(reference)
        assert np.abs(joined - reference).max() < 1e-4


async def test_a_first_window_is_asked_to_last_while_the_others_start(workers) -> None:
    """The rule behind the test above, with the costs given rather than measured on this
    host: three streams start together, a new stream's first step estimated at 0.2 s. The
    first one's first window is asked to hold what lasts while the two others make theirs
    (``daemon.synthesis.deadlines.least_audio`` of 0.4 s ahead); a stream alone is asked nothing."""
    from daemon.synthesis.deadlines import least_audio

    pool = workers(1)
    pool.first_cost = 0.2  # the estimate the pool would have measured
    asked: dict[str, list[float | None]] = {"a": [], "b": [], "c": [], "alone": []}
    others_queued = threading.Event()

    def stream(tag: str) -> Callable[[Callable[[], float | None]], Iterator[int]]:
        def steps(demand: Callable[[], float | None]) -> Iterator[int]:
            if tag == "a":  # the others are queued before its first window is sized
                assert others_queued.wait(10)
            for i in range(2):
                asked[tag].append(demand())
                yield i
        return steps

    a = Render(stream("a"), pool, limit=100, seconds=lambda _: 0.1)
    b = Render(stream("b"), pool, limit=100, seconds=lambda _: 0.1)
    c = Render(stream("c"), pool, limit=100, seconds=lambda _: 0.1)
    others_queued.set()
    await asyncio.gather(take_all(a), take_all(b), take_all(c))
    first = asked["a"][0]
    assert first is not None
    assert first == pytest.approx(least_audio(2 * 0.2, 0.0, None, playing=False))
    assert first >= 2 * 0.2  # at least the others' first steps

    alone = Render(stream("alone"), pool, limit=100, seconds=lambda _: 0.1)
    await take_all(alone)
    assert asked["alone"][0] is None

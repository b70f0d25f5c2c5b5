"""The threads that run torch, and how a text's chunks get from them to the event loop.

Torch runs on a fixed set of worker threads and nowhere else. Each thread that runs torch at
two or more intra-op threads keeps its own OpenMP team, and once the process has more
OpenMP threads than cores, libgomp stops letting idle team threads spin between operations:
at ``voices.threads = 2`` on two cores, a second team made every operation 1.5-2x slower
(bench/README.md). So work goes to the idle worker that ran last: one request at a time
stays on one thread and one team.

A ``Render`` is one text's chunks. Each step computes one chunk on a worker and hands it to
the loop at once (``call_soon_threadsafe``); the worker goes on with the same render unless
another is waiting. Then ``daemon.synthesis.deadlines`` picks what goes next: a new stream's first
chunk unless that would make a playing stream run out of audio, else the playing stream
whose audio runs out first; a new stream waits while the playing ones leave no room for one
more in real time. A render whose consumer has ``limit`` chunks it has not taken yet (a
speaker playing in real time, a stalled client) is parked, holding no thread, until the
consumer takes one.

Chunks go from the worker to the loop directly, not through a thread per stream that waits
on the worker: such a thread's Python, running just as a request starts, takes a core from
the OpenMP team (bench/README.md has what that cost).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tts.native_names import name_native
from tts.options import Demand

from .deadlines import Due, admitted, least_audio, pick

log = logging.getLogger(__name__)

T = TypeVar("T")
Job = Callable[[], bool]  # runs one step; True: it has more to do right away
DueOf = Callable[[float], Due]  # a waiting job's state, given when it was queued

_DONE = object()
FIRST_COST = 0.05  # seconds: a first chunk's cost until one has been measured
_SMOOTHING = 0.3  # weight of the newest measurement in the running estimates
# Compute seconds per second of audio below which a step computed nothing here: its chunk
# was made by a helper process and handed on (a window takes 0.02 or more on any CPU).
_HANDED_ON = 0.005


@dataclass
class _Queued:
    job: Job
    due: DueOf | None
    queued: float

    def state(self, first_cost: float) -> Due:
        return self.due(self.queued) if self.due else Due(self.queued, first_cost)


class Workers:
    """``n`` threads taking turns over jobs, one step at a time."""

    def __init__(self, n: int, name: str = "herald-synth",
                 setup: Callable[[], object] | None = None) -> None:
        """``setup`` runs first on each worker thread (torch's settings are per thread)."""
        self._setup = setup
        self._lock = threading.Lock()
        self._waiting: list[_Queued] = []  # jobs no worker has taken yet
        self._closed = False
        self._n = n
        self._streams: set[Render[Any]] = set()  # renders playing now, parked or not
        self.first_cost = FIRST_COST  # seconds a render's first chunk takes, running estimate
        self.held = 0  # new streams waiting for room (see daemon.synthesis.deadlines.admitted)
        # The pace of whole windows (compute seconds per audio second), over every stream: a
        # stream's first windows are small and cost several times more per second of audio
        # than the windows it settles into, so admission counts a young stream at this pace.
        self.pace: float | None = None
        self._largest = 0.0  # the most audio one step has made: a whole window
        self._workers = [_Worker(self, f"{name}-{i}") for i in range(n)]
        # The last one to go idle is the first woken; worker 0 first of all.
        self._idle: list[_Worker] = self._workers[::-1]
        for w in self._workers:
            w.thread.start()
        # The threads are daemons so that an engine nobody closed cannot hold up the exit;
        # but one still alive while the interpreter tears torch down aborts the process
        # ("terminate called without an active exception"), so they are ended first.
        atexit.register(self.close, join=1.0)

    def dispatch(self, job: Job, due: DueOf | None = None) -> None:
        """Run ``job`` until it returns False; ``due`` tells the scheduler where it stands
        (a render's deadline; without it, a job goes in turn). Raises RuntimeError after
        ``close``."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the synthesis workers are shut down")
            self._waiting.append(_Queued(job, due, time.monotonic()))
            if self._idle:
                chosen = self._choose(self._idle[-1])
                if chosen is not None:
                    self._idle.pop().give(chosen)

    def call(self, fn: Callable[..., T], *args: object) -> Future[T]:
        """``fn(*args)`` on a worker (a voice loading, say), as a future."""
        future: Future[T] = Future()

        def once() -> bool:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # handed to whoever waits on the future
                    future.set_exception(e)
            return False

        self.dispatch(once)
        return future

    @staticmethod
    def when_free(fn: Callable[[], object]) -> None:
        """From a job's step: run ``fn`` once this worker is free again (idle, or on to its
        next step). A render hands over its last item, and parks, this way: its consumer
        may dispatch the next render (or this one again) the moment it sees either, and
        this worker must be idle by then to be the one that takes it."""
        _current.worker.after.append(fn)

    def close(self, join: float = 0.0) -> bool:
        """Stop the workers after their current step; waiting jobs are dropped. ``join``:
        seconds to wait for each thread to end. True if every one has ended."""
        with self._lock:
            self._closed = True
            self._waiting.clear()
            idle, self._idle = self._idle, []
        for w in idle:
            w.give(None)
        others = [w.thread for w in self._workers if w.thread is not threading.current_thread()]
        if join > 0:
            for thread in others:
                thread.join(join)
        return not any(thread.is_alive() for thread in others)

    def _next(self, worker: _Worker, job: Job, due: DueOf | None, again: bool
              ) -> _Queued | None:
        """What ``worker`` runs after a step of ``job``: the same job if it wants to go on
        and nobody waits, else what ``daemon.synthesis.deadlines.pick`` says; None: it goes idle."""
        with self._lock:
            if self._closed:
                return None
            if again and not self._waiting:
                same = _Queued(job, due, time.monotonic())
                worker.until = same.queued + same.state(self.first_cost).cost
                return same
            if again:
                self._waiting.append(_Queued(job, due, time.monotonic()))
            chosen = self._choose(worker)
            if chosen is None:
                self._idle.append(worker)
            return chosen

    def _choose(self, worker: _Worker) -> _Queued | None:
        """Takes the job ``worker`` runs next out of the waiting ones (under the lock)."""
        worker.until = 0.0
        if not self._waiting:
            return None
        states, rtfs = self._states()
        now = time.monotonic()
        i = pick(states, now, rtfs, self._n,
                 [w.until for w in self._workers if w is not worker])
        held = sum(1 for k, d in enumerate(states)
                   if k != i and d.runs_out is None and not admitted(d, rtfs, self._n))
        if held > self.held:
            log.info("synthesis: %d new stream(s) wait: the %d playing need %.0f%% of the "
                     "workers' time", held, len(rtfs), 100 * sum(rtfs) / self._n)
        self.held = held
        if i is None:
            return None
        worker.until = now + states[i].cost
        return self._waiting.pop(i)

    def work_ahead(self) -> float | None:
        """From a step: the seconds, per worker, of the steps waiting now that may run before
        this job's next one (new streams kept out by admission cannot); None if none
        waits."""
        with self._lock:
            if not self._waiting:
                return None
            states, rtfs = self._states()
            return sum(d.cost for d in states
                       if d.runs_out is not None or admitted(d, rtfs, self._n)) / self._n

    def _states(self) -> tuple[list[Due], list[float]]:
        """(Under the lock.) Where each waiting job stands, and the share of the workers each
        playing stream needs: what ``daemon.synthesis.deadlines`` decides from."""
        return ([q.state(self.first_cost) for q in self._waiting],
                [r.need for r in self._streams])

    def playing(self, render: Render[Any], now: bool) -> None:
        """A render started playing (its first chunk is out), or ended."""
        with self._lock:
            if now:
                self._streams.add(render)
            else:
                self._streams.discard(render)

    def first_step_took(self, seconds: float) -> None:
        self.first_cost += _SMOOTHING * (seconds - self.first_cost)

    def whole_window(self, seconds: float, rtf: float) -> bool:
        """Note a step's audio and pace; True if it was a whole window (as much audio as
        the largest step yet, within a tenth), whose pace then updates ``pace``."""
        with self._lock:
            self._largest = max(self._largest, seconds)
            if seconds < 0.9 * self._largest:
                return False
            self.pace = rtf if self.pace is None else self.pace + _SMOOTHING * (rtf - self.pace)
            return True


_current = threading.local()  # .worker: the _Worker running on this thread


class _Worker:
    def __init__(self, pool: Workers, name: str) -> None:
        self.pool = pool
        self.after: list[Callable[[], object]] = []
        # When its step should be done (monotonic seconds, the step's estimated cost); 0.0
        # idle. The scheduler counts on it for when this worker can take a playing stream's
        # next step (``daemon.synthesis.deadlines.feasible``).
        self.until = 0.0
        self._given: _Queued | None = None
        self._wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def give(self, job: _Queued | None) -> None:
        self._given = job
        self._wake.set()

    def _run(self) -> None:
        # Named for the OS; so are the threads torch starts from this one (an OpenMP team, the
        # process's sharing thread), since a Linux thread takes its creator's name.
        name_native()
        _current.worker = self
        if self.pool._setup is not None:
            self.pool._setup()
        job: _Queued | None = None
        while True:
            if job is None:
                self._wake.wait()
                self._wake.clear()
                job, self._given = self._given, None
                if job is None:
                    return  # closed
            try:
                again = job.job()
            except Exception:  # a bug in a job must not take the thread with it
                log.exception("synthesis worker: a job failed")
                again = False
            job = self.pool._next(self, job.job, job.due, again)
            after, self.after = self.after, []
            for fn in after:
                try:
                    fn()
                except Exception:
                    log.exception("synthesis worker: a job's hand-over failed")
            if job is None and self.pool._closed:
                return


class Render(Generic[T]):
    """One text's chunks, computed on the workers and taken on the loop with ``get``.

    Create it on the event loop; ``close`` it when done with it, whether or not it ran to
    the end: the generator is then closed on a worker, not on the loop. ``seconds`` (the
    audio a chunk holds) makes it a stream with deadlines (``daemon.synthesis.deadlines``); without
    it, it takes its turn.
    """

    def __init__(self, chunks: Iterator[T] | Callable[[Demand], Iterator[T]],
                 workers: Workers, limit: int,
                 seconds: Callable[[T], float] | None = None) -> None:
        # Given a function, the chunks are made with this render's demand on each window.
        self._chunks = chunks(self.demand) if callable(chunks) else chunks
        self._workers = workers
        self._limit = max(1, limit)
        self._seconds = seconds
        self._first_out: float | None = None  # when the first chunk went to the loop
        self._handed = 0.0  # seconds of audio handed to the loop
        self._cost: float | None = None  # seconds the next step should take
        self._last_seconds = 0.0  # audio in the last chunk
        self.rtf = 0.0  # seconds of computing per second of audio, running estimate
        self._steady: float | None = None  # the same, over whole windows only
        self._loop = asyncio.get_running_loop()
        self._ready: deque[object] = deque()  # handed over, not yet taken (loop side only)
        self._wake: asyncio.Future[None] | None = None
        self._lock = threading.Lock()
        self._ahead = 0  # chunks computed and not yet taken
        self._parked = False
        self._closed = False
        self._dispatch()

    async def get(self) -> T | None:
        """The next chunk; None at the end. Raises whatever the computation raised."""
        while not self._ready:
            self._wake = self._loop.create_future()
            await self._wake
        item = self._ready.popleft()
        with self._lock:
            self._ahead -= 1
            resume = self._parked and not self._closed
            if resume:
                self._parked = False
        if resume:
            self._dispatch()
        if item is _DONE:
            return None
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Stop computing: the step running now is the last."""
        with self._lock:
            self._closed = True
            parked, self._parked = self._parked, False
        if parked:
            self._dispatch()  # its step closes the generator, on a worker

    def _dispatch(self) -> None:
        try:
            self._workers.dispatch(self._step, self._due)
        except RuntimeError as e:  # shut down: say so rather than leave the consumer waiting
            self._hand_over(e)

    def _due(self, queued: float) -> Due:
        cost = self._workers.first_cost if self._cost is None else self._cost
        if self._seconds is None:
            return Due(queued, cost)
        runs_out = None if self._first_out is None else self._first_out + self._handed
        return Due(queued, cost, runs_out, self.need, stream=True)

    def _step(self) -> bool:
        """On a worker: one chunk, handed to the loop. True: compute the next one now."""
        if self._closed:
            self._end()
            return False
        item: object
        started = time.monotonic()
        try:
            item = next(self._chunks)
        except StopIteration:
            item = _DONE
        except BaseException as e:  # the consumer raises it
            item = e
        last = item is _DONE or isinstance(item, BaseException)
        if not last:
            self._measure(item, started)  # type: ignore[arg-type]
        with self._lock:
            self._ahead += 1
            closed = self._closed
            full = self._ahead >= self._limit
        if closed:
            self._end()
            return False
        # What lets the consumer dispatch this render again (its last item, or parking it)
        # waits until this worker is free, so that it is the one to take it.
        if last:
            self._workers.playing(self, False)
            Workers.when_free(lambda: self._hand_over(item))
            return False
        if not self._hand_over(item):  # the loop is gone: nobody listens
            self._end()
            return False
        if full:
            Workers.when_free(self._park)
            return False
        return True

    def _park(self) -> None:
        """Wait for the consumer, unless it has taken a chunk (or closed) meanwhile."""
        with self._lock:
            self._parked = self._ahead >= self._limit and not self._closed
            parked = self._parked
        if not parked:
            self._dispatch()

    def _measure(self, item: T, started: float) -> None:
        """What the step that made ``item`` cost, and the audio it holds."""
        now = time.monotonic()
        took = now - started
        if self._cost is None:
            self._workers.first_step_took(took)
        self._cost = took
        if self._seconds is None:
            return
        seconds = self._seconds(item)
        first = self._first_out is None
        if first:
            self._first_out = now
            self._workers.playing(self, True)
            # Its next step is counted at this one's time, encoder pass included: that
            # step also joins the rest of the sentence's prior, which the pool's pace over
            # whole windows leaves out.
        elif self._last_seconds > 0:
            # Windows grow (the synthesizer doubles them up to a largest): the next step
            # costs as much more as this one's audio grew over the one before.
            self._cost = took * min(2.0, max(1.0, seconds / self._last_seconds))
        self._last_seconds = seconds
        self._handed += seconds
        # The first step also ran the sentence's text encoder and durations, once: it says
        # nothing of the pace the stream needs from here on. Nor does a chunk a helper made:
        # taken as a window, one of its seconds of audio would stop every window made here
        # from counting as whole, and freeze the pool's pace.
        if seconds > 0 and not first and took >= _HANDED_ON * seconds:
            rtf = took / seconds
            self.rtf = rtf if self.rtf == 0.0 else self.rtf + _SMOOTHING * (rtf - self.rtf)
            if self._workers.whole_window(seconds, rtf):
                self._steady = rtf if self._steady is None else (
                    self._steady + _SMOOTHING * (rtf - self._steady))

    def demand(self) -> float | None:
        """From this render's step: the audio its window should hold to last while the others
        waiting take their turns (``tts.stream.Demand``); None when none waits."""
        ahead = self._workers.work_ahead()
        if ahead is None:
            return None
        buffered = 0.0
        if self._first_out is not None:
            buffered = max(0.0, self._first_out + self._handed - time.monotonic())
        return least_audio(ahead, buffered, self._steady or self._workers.pace,
                           playing=self._first_out is not None)

    @property
    def need(self) -> float:
        """The share of a worker this stream needs from here on to keep real time: its pace
        over whole windows; before it has made one, the pool's (its small first windows
        would overstate it several times, and keep new streams waiting for nothing)."""
        if self._steady is not None:
            return self._steady
        return self._workers.pace if self._workers.pace is not None else self.rtf

    def _end(self) -> None:
        self._workers.playing(self, False)
        close = getattr(self._chunks, "close", None)  # a generator's: its cleanup runs here
        if close is not None:
            close()

    def _hand_over(self, item: object) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._deliver, item)
            return True
        except RuntimeError:  # the loop is closed
            return False

    def _deliver(self, item: object) -> None:
        self._ready.append(item)
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

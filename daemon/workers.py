"""The threads that run torch, and how a text's chunks get from them to the event loop.

Torch runs on a fixed set of worker threads and nowhere else. Each thread that runs torch at
two or more intra-op threads keeps its own OpenMP team, and once the process has more
OpenMP threads than cores, libgomp stops letting idle team threads spin between operations:
at ``voices.threads = 2`` on two cores, a second team made every operation 1.5-2x slower
(bench/README.md). So work goes to the idle worker that ran last: one request at a time
stays on one thread and one team.

A ``Render`` is one text's chunks. Each step computes one chunk on a worker and hands it to
the loop at once (``call_soon_threadsafe``); the worker goes on with the same render unless
another is waiting, in which case the render queues behind it, so concurrent renders take
turns chunk by chunk. A render whose consumer has ``limit`` chunks it has not taken yet
(a speaker playing in real time, a stalled client) is parked, holding no thread, until the
consumer takes one.

Before this, a thread per stream asked a worker for each chunk, waited for it and passed it
to the loop: four thread wake-ups per chunk, and at two intra-op threads on two cores that
thread's Python, running just as a request started, took a core from the OpenMP team (the
short command's first audio 21-23 ms instead of 19 in one process; bench/README.md).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
Job = Callable[[], bool]  # runs one step; True: it has more to do right away

_DONE = object()


class Workers:
    """``n`` threads taking turns over jobs, one step at a time."""

    def __init__(self, n: int, name: str = "herald-synth") -> None:
        self._lock = threading.Lock()
        self._waiting: deque[Job] = deque()  # jobs no worker has taken yet
        self._closed = False
        self._workers = [_Worker(self, f"{name}-{i}") for i in range(n)]
        # The last one to go idle is the first woken; worker 0 first of all.
        self._idle: list[_Worker] = self._workers[::-1]
        for w in self._workers:
            w.thread.start()
        # The threads are daemons so that an engine nobody closed cannot hold up the exit;
        # but one still alive while the interpreter tears torch down aborts the process
        # ("terminate called without an active exception"), so they are ended first.
        atexit.register(self.close, join=1.0)

    def dispatch(self, job: Job) -> None:
        """Run ``job`` until it returns False. Raises RuntimeError after ``close``."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the synthesis workers are shut down")
            if self._idle:
                self._idle.pop().give(job)
            else:
                self._waiting.append(job)

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

    def _next(self, worker: _Worker, job: Job, again: bool) -> Job | None:
        """What ``worker`` runs after a step of ``job``: the same job if it wants to go on
        and nobody waits, else the longest-waiting job; None: it goes idle."""
        with self._lock:
            if self._closed:
                return None
            if again and not self._waiting:
                return job
            if again:
                self._waiting.append(job)
            if self._waiting:
                return self._waiting.popleft()
            self._idle.append(worker)
            return None


_current = threading.local()  # .worker: the _Worker running on this thread


class _Worker:
    def __init__(self, pool: Workers, name: str) -> None:
        self.pool = pool
        self.after: list[Callable[[], object]] = []
        self._given: Job | None = None
        self._wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def give(self, job: Job | None) -> None:
        self._given = job
        self._wake.set()

    def _run(self) -> None:
        _current.worker = self
        job: Job | None = None
        while True:
            if job is None:
                self._wake.wait()
                self._wake.clear()
                job, self._given = self._given, None
                if job is None:
                    return  # closed
            try:
                again = job()
            except Exception:  # a bug in a job must not take the thread with it
                log.exception("synthesis worker: a job failed")
                again = False
            job = self.pool._next(self, job, again)
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
    the end: the generator is then closed on a worker, not on the loop.
    """

    def __init__(self, chunks: Iterator[T], workers: Workers, limit: int) -> None:
        self._chunks = chunks
        self._workers = workers
        self._limit = max(1, limit)
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
            self._workers.dispatch(self._step)
        except RuntimeError as e:  # shut down: say so rather than leave the consumer waiting
            self._hand_over(e)

    def _step(self) -> bool:
        """On a worker: one chunk, handed to the loop. True: compute the next one now."""
        if self._closed:
            self._close_chunks()
            return False
        item: object
        try:
            item = next(self._chunks)
        except StopIteration:
            item = _DONE
        except BaseException as e:  # the consumer raises it
            item = e
        last = item is _DONE or isinstance(item, BaseException)
        with self._lock:
            self._ahead += 1
            closed = self._closed
            full = self._ahead >= self._limit
        if closed:
            self._close_chunks()
            return False
        # What lets the consumer dispatch this render again (its last item, or parking it)
        # waits until this worker is free, so that it is the one to take it.
        if last:
            Workers.when_free(lambda: self._hand_over(item))
            return False
        if not self._hand_over(item):  # the loop is gone: nobody listens
            self._close_chunks()
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

    def _close_chunks(self) -> None:
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

"""A second thread of this process that shares phases of tasks with the thread that runs
them: the text encoder's blocks of columns (``tts.vits.enc_p``) on the core a synthesis's
idle helper would otherwise leave unused, and a short sentence's flow made whole
(``tts.flow_shared``). It also takes one task to run while the caller goes on (``begin``):
the rest of a long sentence's durations while its first window is decoded (``tts.lanes``).

The encoder runs once per sentence, on its playing lane, before the sentence's first audio,
and no helper has anything to decode then. Its matrix products are large enough that two
threads of one process gain despite the interpreter's lock: each product releases it for its
whole length. Small operations between them contend for it, which is why the encoder's
attention goes through few (``tts.vits.enc_p._diagonals``).

* **Tasks are claimed, not assigned.** Each phase's tasks are free for either thread to
  take, the calling thread from the front, the second one from the back. A second thread
  that is slow to wake or was descheduled delays only a task it has already begun; the
  calling thread does the rest itself. With a fixed half each, every phase would wait for
  it, as intra-op threads do at their barriers (``tts.threads``).
* **Only while a core is free** (``tts.neighbours.core_free``). Beside a busy process the
  second thread mostly waits for a core, and sharing is a loss.
* **On two cores** (``SharingThread._apart``): for the call, the caller stays on its core
  and the second thread keeps off it. Left to Linux on a virtual machine, the two often
  took turns on one core, and sharing gained half as much.
* **A short poll before sleeping** (``SPIN``). A thread that sleeps on a lock between two
  phases is woken by the other a millisecond or more later on a virtual machine whose
  cores have been idle; a phase takes from a fraction of a millisecond to a few.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import cast

import torch

from .neighbours import core_free
from .threads import prepare_thread

SPIN = 0.002  # seconds a thread polls for the other's tasks of a phase before it sleeps
EXIT_WAIT = 5.0  # seconds the interpreter's exit waits for a task the second thread runs

Task = Callable[[], None]
Phases = Sequence[Sequence[Task]]
"""Phases in order: every task of a phase is done before any of the next begins; the
tasks within a phase are independent of one another."""


def in_order(phases: Phases) -> None:
    """Run ``phases`` on the calling thread alone."""
    for phase in phases:
        for task in phase:
            task()


class _Run:
    """One call's phases and how far each thread has got with them (under the lock)."""

    def __init__(self, phases: Phases, background: bool = False) -> None:
        self.phases = phases
        self.front = [0] * len(phases)  # the next task the calling thread would take
        self.back = [len(p) for p in phases]  # one past the last the second thread would
        self.done = [0] * len(phases)
        self.busy = 0  # tasks the second thread is running
        self.error: BaseException | None = None  # a task failed: nothing more begins
        self.background = background  # ``begin``'s: whoever finishes it lets the thread go

    def claim(self, k: int, front: bool) -> Task | None:
        if self.error is not None or self.front[k] >= self.back[k]:
            return None
        if front:
            self.front[k] += 1
            return self.phases[k][self.front[k] - 1]
        self.back[k] -= 1
        return self.phases[k][self.back[k]]

    def finished(self, k: int) -> bool:
        return self.error is not None or self.done[k] == len(self.phases[k])


class SharingThread:
    """The second thread (``run``); started when first needed, one call at a time."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._run: _Run | None = None
        self._serial = 0  # runs posted, so the second thread takes each one once
        self._in_use = False
        self._thread: threading.Thread | None = None
        self._owner = 0  # the process whose exit waits for the thread (``_quiesce``)
        self._closed = False  # the interpreter is exiting: the thread takes no more tasks
        self.shared = 0  # tasks the second thread ran (for tests and benchmarks)

    def run(self, phases: Phases) -> None:
        """Run ``phases`` here and on the second thread; return when all are done. A task
        that raises ends the call with its exception, once no task runs any more. A call
        made while another is running (another thread's), or while no core is free, runs in
        order on its own thread."""
        posted = self._open(phases)
        if posted is None:
            in_order(phases)
            return
        run, mask = posted
        try:
            self._work(run, front=True)
        finally:
            self._let_go(run)
            if mask is not None:
                _set_affinity(0, mask)
        if run.error is not None:
            raise run.error

    def _open(self, phases: Phases) -> tuple[_Run, set[int] | None] | None:
        """Post ``phases`` to the second thread with the two threads kept apart
        (``_apart``: the caller's affinity to restore is returned with the run); None while
        another call has the thread or no core is free."""
        with self._changed:
            if not self._take():
                return None
            run = _Run(phases)
            mask = self._apart()
            self._post(run)
        return run, mask

    def begin(self, task: Task) -> Callable[[], None]:
        """Begin ``task`` on the second thread while the caller goes on; returns what waits
        for it to end (raising what it raised). If the second thread has not taken it by
        then, the waiting thread runs it itself; if the thread is in use or no core is
        free, nothing begins and the wait runs it. Only the second thread is kept off the
        caller's core: the caller's own affinity is never changed, as nothing guarantees
        that the wait is ever called (a synthesis abandoned after its first window)."""
        with self._changed:
            run = _Run([[task]], background=True) if self._take() else None
            if run is not None:
                self._second_apart()
                self._post(run)
        if run is None:
            return task
        begun = run

        def wait() -> None:
            try:
                self._work(begun, front=True)
            finally:
                self._let_go(begun)
            if begun.error is not None:
                raise begun.error

        return wait

    def _let_go(self, run: _Run) -> None:
        """Once no task of ``run`` is running, the thread is free for the next call."""
        with self._changed:
            while run.busy:
                self._changed.wait()
            if self._run is run:
                self._run, self._in_use = None, False

    def _take(self) -> bool:
        """Under the lock: take the second thread for a call (started if need be); False
        while another call has it or no core is free."""
        if self._in_use or not core_free():
            return False
        self._in_use = True
        self._start()
        return True

    def _post(self, run: _Run) -> None:
        """Under the lock: hand ``run`` to the second thread."""
        self._run, self._serial = run, self._serial + 1
        self._changed.notify_all()

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._serve, name="herald-sharing",
                                            daemon=True)
            self._thread.start()
            if self._owner != os.getpid():
                self._owner = os.getpid()
                atexit.register(self._quiesce)

    def _quiesce(self) -> None:
        """At the interpreter's exit, let the second thread take no more tasks and wait a
        while for the one it runs. A daemon thread still inside a torch operation when the
        interpreter finalizes aborts the whole process: the operation has let go of the
        interpreter's lock, and a thread that asks for it back then is ended by unwinding
        C++ frames that must not unwind ("terminate called without an active exception").
        ``begin`` leaves such a task with no caller waiting for it when a synthesis is
        abandoned after its first window. A forked child inherits this handler but not the
        thread: there it does nothing."""
        if self._owner != os.getpid():
            return
        deadline = time.monotonic() + EXIT_WAIT
        with self._changed:
            self._closed = True
            while self._run is not None and self._run.busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(left)

    def _apart(self) -> set[int] | None:
        """Keep the two threads on two cores for this call: the caller on the one it runs
        on, the second thread on the others. Returns the caller's own affinity to restore
        (None if nothing was changed).

        Left to Linux on a virtual machine whose cores had been idle, the second thread was
        woken on the caller's core, or the caller was moved to the second thread's when it
        woke it (an idle virtual core that the host has descheduled looks busy to the
        guest), and the two threads took turns on one core: the long sentence's encoder
        took 58-64 ms shared after a 0.3 s pause, against 39-41 ms with the threads kept
        apart (70 ms on one thread)."""
        kept = self._second_apart()
        if kept is None:
            return None
        here, mask = kept
        return mask if _set_affinity(0, {here}) else None

    def _second_apart(self) -> tuple[int, set[int]] | None:
        """Keep the second thread off the core the caller runs on; returns that core and the
        process's affinity, or None if nothing was changed. ``begin`` leaves the caller's
        own affinity as it is: nothing guarantees that its wait is ever called."""
        assert self._thread is not None
        here, second = _current_cpu(), self._thread.native_id
        if here is None or second is None:
            return None
        try:
            mask = os.sched_getaffinity(0)
        except OSError:
            return None
        others = mask - {here}
        if not others or not _set_affinity(second, others):
            return None
        return here, mask

    def _serve(self) -> None:
        prepare_thread()
        seen = 0
        while True:
            with self._changed:
                while self._run is None or self._serial == seen:
                    self._changed.wait()
                run, seen = self._run, self._serial
            with torch.inference_mode():
                self._work(run, front=False)
            if run.background:
                self._let_go(run)
            del run  # nor does a finished run's task stay alive here until the next one

    def _work(self, run: _Run, front: bool) -> None:
        """Take tasks of each phase in turn until none is left, then wait for the phase's
        tasks the other thread took. The calling thread (``front``) re-raises a failure
        of its own; the second thread records it and goes back to waiting."""
        for k in range(len(run.phases)):
            while True:
                with self._changed:
                    task = None if self._closed and not front else run.claim(k, front)
                    if task is None:
                        break
                    if not front:
                        run.busy += 1
                failed: BaseException | None = None
                try:
                    task()
                except BaseException as e:
                    failed = e
                with self._changed:
                    if not front:
                        run.busy -= 1
                    if failed is None:
                        run.done[k] += 1
                        self.shared += not front
                    else:
                        run.error = run.error or failed
                    self._changed.notify_all()
                if failed is not None:
                    if front:
                        raise failed
                    return
            spin_until = time.perf_counter() + SPIN
            while not run.finished(k) and time.perf_counter() < spin_until:
                time.sleep(0)  # lets the other thread have the interpreter's lock
            with self._changed:
                while not run.finished(k):
                    if not front and run is not self._run:
                        return  # the caller has gone (it failed): nothing to wait for
                    self._changed.wait()
                if run.error is not None:
                    return


def _set_affinity(thread: int, cpus: set[int]) -> bool:
    """``sched_setaffinity`` for one thread (0: the caller); False where it is refused (a
    container's seccomp profile, a CPU just taken out of the cgroup's set)."""
    try:
        os.sched_setaffinity(thread, cpus)
    except OSError:
        return False
    return True


def _current_cpu() -> int | None:
    """The CPU the calling thread runs on now (glibc's ``sched_getcpu``), if known."""
    getcpu = _sched_getcpu()
    cpu = -1 if getcpu is None else int(getcpu())
    return cpu if cpu >= 0 else None


@functools.cache
def _sched_getcpu() -> Callable[[], int] | None:
    try:
        getcpu = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    getcpu.restype = ctypes.c_int
    return cast(Callable[[], int], getcpu)


_thread: SharingThread | None = None
_pid = 0


def sharing_thread() -> SharingThread:
    """This process's sharing thread (a forked child gets its own: threads do not survive a
    fork)."""
    global _thread, _pid
    if _thread is None or _pid != os.getpid():
        _thread, _pid = SharingThread(), os.getpid()
    return _thread

"""Whether processes other than this herald keep the machine's cores busy now.

Two choices depend on it. A sentence's text encoder is shared by two threads only while a
core is free (``core_free``, ``tts.sharing``), and the helpers get a text's work at once only
while no other process is runnable (``crowded``, ``tts.lanes``): beside a busy process both
are a loss, measured in bench/README.md ("Measurements behind the defaults").

A reading has two parts, because neither is right alone:

* **Runnable now**: Linux's count of runnable threads (``/proc/loadavg``) less this herald's
  own that are running or ready to (each thread's ``stat``). It is of this instant, but since
  Linux 6.12 (EEVDF's delayed dequeue) a thread that has just gone to sleep can stay counted
  as runnable for a tick or two while its own state says it sleeps. In a daemon the front's
  event loop, the MQTT client's thread and the sharing thread sleep every few milliseconds:
  logged in ``herald run`` on an idle host, 30 of the lanes' 48 readings over 26 long
  sentences said by this part alone that another process was runnable.
* **Busy lately**: the CPU time processes other than this herald used since a sample at least
  ``RECENT`` old (``/proc/stat``'s busy time less this process's and its helpers'). A thread
  that sleeps uses none; a busy process a core, or its share of one. Measured beside the
  long sentence at two lanes, over windows of 0.1 s: 0.32 of a core at the least beside one
  busy process, 0.23 at the most on an idle host (the counters move by ticks).

Another process is taken to be runnable when both parts say so. The second lags: a process
that has just begun is seen once it has used ``OTHERS_BUSY`` of a core over the window. Every
reading takes a sample, and so that the window is recent however long herald has been idle,
a thread of this process takes one every ``SAMPLE_EVERY`` from the first reading on.
Where the counts cannot be read, no core is taken to be busy.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Iterable

from .native_names import name_native

RECENT = 0.1  # the shortest window, in seconds, over which other processes' CPU is judged
OTHERS_BUSY = 0.3  # cores other processes must have kept busy over it to count as runnable
SAMPLE_EVERY = 0.5  # seconds between the sampling thread's samples
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

_own_helpers: set[int] = set()


def core_free() -> bool:
    """Whether no thread but the caller's could want the core a second thread of this
    process would run on: no helper process of this herald is runnable, and no other
    process is (both parts, above). A helper at work holds a core too. Measured beside one
    busy process, the long sentence's first audio came 6 ms later shared than on one
    thread; with this check it came as on one thread."""
    reading = _reading()
    return reading is None or (reading[0] == 0 and not reading[1])


def crowded() -> bool:
    """Whether a thread of a process other than this herald's (this process and its helper
    processes, ``count_as_own``) is runnable now. Then a helper handed work shares the
    cores with it and with the lane that handed it the work, which slows that lane several
    times (``tts.pace.CROWDED``); a helper already at work does not, and does not count."""
    reading = _reading()
    return reading is not None and reading[1]


def count_as_own(pid: int, own: bool = True) -> None:
    """Count the helper process ``pid`` as part of this herald, or (``own`` False, once it
    has ended) no longer. Its CPU time then moves from one side of ``_busy_lately``'s sum to
    the other, so the samples taken before are dropped."""
    with _samples.lock:
        if own:
            _own_helpers.add(pid)
        else:
            _own_helpers.discard(pid)
        _samples.taken.clear()


def _reading() -> tuple[int, bool] | None:
    """Runnable threads of this herald's helper processes, and whether another process is
    runnable (both parts, above); None where the counts cannot be read. Every reading takes
    a sample."""
    counts, lately = _runnable_counts(), _busy_lately()
    if counts is None:
        return None
    helpers, others = counts
    return helpers, others > 0 and lately


def _runnable_counts() -> tuple[int, int] | None:
    """Runnable threads of this herald's helper processes, and of processes other than this
    herald (Linux's count, which may include a thread of this herald that has just gone to
    sleep); None where the counts cannot be read."""
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        running -= _runnable("self")
    except (OSError, IndexError, ValueError):
        return None
    helpers = 0
    for pid in tuple(_own_helpers):  # a helper may end meanwhile
        with contextlib.suppress(OSError):
            helpers += _runnable(str(pid))
    return helpers, running - helpers


def _runnable(pid: str) -> int:
    """Runnable threads of the process ``pid`` (``/proc/PID/task``)."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                n += f.read().rpartition(b")")[2].split()[0] == b"R"
        except OSError:
            continue  # the thread has ended
    return n


def _busy_lately() -> bool:
    """Whether processes other than this herald kept at least ``OTHERS_BUSY`` of a core
    busy since the newest sample at least ``RECENT`` old; True where there is none yet, as
    then the count of runnable threads is all there is to go by."""
    cores = _samples.others_cores()
    return cores is None or cores >= OTHERS_BUSY


class _Samples:
    """This machine's busy CPU time and this herald's, sampled over time, and the thread that
    samples them (started by the first reading in each process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken: deque[tuple[float, float, float]] = deque()  # (when, machine, herald)
        self.pid = 0  # the process the sampling thread runs in

    def others_cores(self) -> float | None:
        """Cores other processes kept busy, on average, since the newest sample at least
        ``RECENT`` old; None where there is no such sample or nothing can be read."""
        self._ensure_sampler()
        now = _sample()
        if now is None:
            return None
        with self.lock:
            base = self._add(now)
        if base is None:
            return None
        (t0, machine0, herald0), (t1, machine1, herald1) = base, now
        return ((machine1 - machine0) - (herald1 - herald0)) / (t1 - t0)

    def _add(self, sample: tuple[float, float, float]) -> tuple[float, float, float] | None:
        """Under the lock: keep ``sample`` and return the newest sample at least ``RECENT``
        older, dropping those older than that one."""
        taken = self.taken
        while len(taken) >= 2 and sample[0] - taken[1][0] >= RECENT:
            taken.popleft()
        base = taken[0] if taken and sample[0] - taken[0][0] >= RECENT else None
        taken.append(sample)
        return base

    def _ensure_sampler(self) -> None:
        if self.pid == os.getpid():
            return
        with self.lock:
            if self.pid == os.getpid():
                return
            self.pid = os.getpid()
            self.taken.clear()  # a forked child's samples are its parent's
        threading.Thread(target=self._sample_every, args=(self.pid,), name="herald-load",
                         daemon=True).start()

    def _sample_every(self, pid: int) -> None:
        name_native()
        while self.pid == pid:
            time.sleep(SAMPLE_EVERY)
            sample = _sample()
            if sample is not None:
                with self.lock:
                    self._add(sample)


_samples = _Samples()


def _sample() -> tuple[float, float, float] | None:
    """(now, CPU seconds the machine spent busy, CPU seconds this herald spent)."""
    when = time.monotonic()
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(v) for v in f.readline().split()[1:8]]
    except (OSError, ValueError):
        return None
    if len(fields) < 7:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields
    machine = (user + nice + system + irq + softirq) / _TICK
    return when, machine, cpu_seconds(tuple(_own_helpers))


def cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds this process and the processes ``pids`` have used so far: this one's to
    the nanosecond, the others' in clock ticks (``/proc/PID/stat``); one that has ended
    adds nothing."""
    total = time.process_time()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().rpartition(b")")[2].split()
            total += (int(stat[11]) + int(stat[12])) / _TICK  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total


def _after_fork() -> None:
    """In a forked child: the parent's lock may have been held at the fork, and its samples
    and sampling thread are not the child's."""
    global _samples
    _samples = _Samples()


os.register_at_fork(after_in_child=_after_fork)

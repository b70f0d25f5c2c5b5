"""The intra-op threads a synthesis runs on, and how they wait for each other.

torch's intra-op parallelism (OpenMP, libgomp here) splits each operation between its
threads and waits for all of them at the operation's end. libgomp's threads wait by spinning,
up to 300 000 rounds, before they sleep: on free cores that is what makes thousands of small
operations fast. When another process holds one of the cores, though, a spinning thread
burns the time slice its partner needs, every operation's end waits for the scheduler, and a
two-thread synthesis collapses to several times slower than one thread (bench/README.md,
"Measurements behind the defaults"). Sleeping at once instead (``OMP_WAIT_POLICY=passive``,
or spinning some 100 rounds) turns it around: the threads then use a core only while they
compute, and two of them beat one thread by far beside busy processes. On an idle machine long
spinning is the faster.

libgomp reads its wait policy once, at start-up, but it spins only 100 rounds (its
"throttled" count) whenever it manages more threads than there are cores. So a
``ThreadGovernor`` keeps an idle OpenMP team of its own in existence (``ShortWaits``) while
other processes are using the cores, and ends it when they stop: measured from ``/proc/stat``
(the CPU time every process used, steal time from the hypervisor included, minus this
process's own) over the last half second or so, at every chunk, so a load that comes or goes
mid-sentence changes the next chunk, not the next request.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch

from .cpu import usable_threads
from .memory import bound_kernel_cache, pin_mmap_threshold, release_startup_code

T = TypeVar("T")

BUSY = 0.25  # cores other processes use from which waits are kept short ...
IDLE = 0.1  # ... and below which they spin long again
SMOOTHING = 0.5  # seconds: the time constant of the others' load average
MIN_INTERVAL = 0.05  # seconds: shorter intervals than this are added to the next one


def cores() -> int:
    """CPU cores this process may run on (its affinity, e.g. a systemd ``CPUAffinity``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_threads() -> int:
    """Intra-op threads when none are configured: two where there are two cores or more.

    A lone synthesis at 2 threads runs ~1.5x faster than at 1 on free cores and, with short
    waits, ~2x faster beside a busy process; beyond 2 it gains little, and the cores left
    over serve concurrent requests better as more workers.
    """
    return min(2, cores())


def short_waits(others: float, now: bool, busy: float = BUSY, idle: float = IDLE) -> bool:
    """Whether the threads should wait briefly, given the cores ``others`` use and whether
    they do ``now`` (the two thresholds keep it from flapping around one value)."""
    return others >= (idle if now else busy)


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU counters at one moment, in seconds."""

    wall: float  # monotonic clock
    busy: float  # CPU time all processes used, every core (steal included)
    ours: float  # CPU time this process used


def read_cpu() -> CpuSample | None:
    """Now's counters; None where ``/proc/stat`` cannot be read (not Linux)."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != b"cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is within user already)
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    return CpuSample(time.monotonic(), busy, time.process_time())


class OthersLoad:
    """The cores other processes have been using, as a running average over about
    ``SMOOTHING`` seconds, updated whenever it is read."""

    def __init__(self, read: Callable[[], CpuSample | None] = read_cpu,
                 smoothing: float = SMOOTHING) -> None:
        self._read = read
        self._smoothing = smoothing
        self._last = read()
        self.cores = 0.0

    def update(self) -> float:
        now = self._read()
        last = self._last
        if now is None or last is None:
            return self.cores
        span = now.wall - last.wall
        if span < MIN_INTERVAL:
            return self.cores
        others = max(0.0, ((now.busy - last.busy) - (now.ours - last.ours)) / span)
        weight = 1.0 - math.exp(-span / self._smoothing)
        self.cores += weight * (others - self.cores)
        self._last = now
        return self.cores


class ShortWaits:
    """An idle OpenMP team on a thread of its own: while it exists, libgomp manages more
    threads than there are cores and every team's threads spin only briefly before they
    sleep. Ending the thread ends the team, and long spinning is back."""

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._end: threading.Event | None = None

    @property
    def on(self) -> bool:
        return self._end is not None

    def set(self, on: bool) -> None:
        if on == self.on:
            return
        if not on:
            assert self._end is not None
            self._end.set()
            self._end = None
            return
        end, ready = threading.Event(), threading.Event()

        def hold() -> None:
            torch.set_num_threads(self._threads)
            torch.ones(1 << 18).mul_(2)  # big enough for torch to split it: the team forms
            ready.set()
            end.wait()

        threading.Thread(target=hold, name="herald-short-waits", daemon=True).start()
        ready.wait(5)
        self._end = end


class ThreadGovernor:
    """Runs each chunk's computation on ``threads`` intra-op threads of the thread computing
    it (OpenMP's thread count belongs to the calling thread), their waits short while other
    processes use the cores (``short_waits``)."""

    def __init__(self, threads: int, load: OthersLoad | None = None,
                 waits: ShortWaits | None = None) -> None:
        self.threads = threads
        self._load = load or OthersLoad()
        self.waits = waits or ShortWaits(max(2, threads))
        self._lock = threading.Lock()
        self._mine = threading.local()  # .threads: what torch was last set to on this thread

    def before_chunk(self) -> None:
        if getattr(self._mine, "threads", None) != self.threads:
            torch.set_num_threads(self.threads)
            self._mine.threads = self.threads
        if self.threads < 2:
            return  # one thread waits for nobody
        with self._lock:
            self.waits.set(short_waits(self._load.update(), self.waits.on))

    def govern(self, chunks: Iterator[T]) -> Iterator[T]:
        """``chunks``, each computed as ``before_chunk`` sets it up."""
        while True:
            self.before_chunk()
            try:
                item = next(chunks)
            except StopIteration:
                return
            yield item


_governor_lock = threading.Lock()
_governor: ThreadGovernor | None = None  # None: torch's own setting, untouched


def set_threads(n: int | None) -> None:
    """Intra-op threads for every synthesis in this process: ``n``, or (None)
    ``default_threads()``, fewer where this machine cannot run that many (``tts.cpu``);
    ``ThreadGovernor`` keeps their waits right for the load.

    Also pins glibc's mmap threshold, bounds oneDNN's kernel cache and drops the library
    code only start-up ran (``tts.memory``): every process that synthesizes calls this
    first, before it loads a voice.
    """
    global _governor
    n = usable_threads(n or default_threads())
    with _governor_lock:
        if _governor is None or _governor.threads != n:
            if _governor is not None:
                _governor.waits.set(False)
            _governor = ThreadGovernor(n)
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        pin_mmap_threshold()
        bound_kernel_cache()
        release_startup_code()


def governed(chunks: Iterator[T]) -> Iterator[T]:
    """``chunks`` computed on the threads ``set_threads`` asked for (as they come, where it
    was never called)."""
    g = _governor
    return chunks if g is None else g.govern(chunks)

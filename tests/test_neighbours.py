"""Whether other processes keep the cores busy (``tts.neighbours``): a real busy process is
seen, a thread of this herald that Linux still counts as runnable after it slept is not
taken for one, and the window the CPU time is judged over is recent and this herald's own."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from busy_process import busy_process
from waiting import until_now

import tts.neighbours as neighbours


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[float, float, float]]]:
    """Samples (when, the machine's busy CPU seconds, this herald's) taken from a list, and
    fresh sample history: what the rule makes of them does not depend on the host."""
    samples: list[tuple[float, float, float]] = []
    monkeypatch.setattr(neighbours, "_samples", neighbours._Samples())
    monkeypatch.setattr(neighbours._samples, "_ensure_sampler", lambda: None)
    monkeypatch.setattr(neighbours, "_sample", lambda: samples.pop(0))
    yield samples


def test_a_busy_process_is_seen_and_then_neither_core_is_free() -> None:
    """Beside a process that keeps a core busy, a helper handed work would share the cores
    with it and with the lane (``crowded``), and a second thread would wait for a core
    (``core_free``). It is runnable, and it keeps using CPU time, so both parts say so."""
    with busy_process() as busy:
        until_now(lambda: neighbours.crowded() and not neighbours.core_free()
                  and (neighbours._samples.others_cores() or 0.0) >= neighbours.OTHERS_BUSY,
                  "the busy process to be seen")
        assert neighbours._runnable(str(busy.pid)) == 1  # runnable, if not running


def test_a_helper_of_this_herald_is_not_another_process_but_holds_a_core() -> None:
    """A helper process at work is this herald's: its runnable thread is taken off the
    count of others (``count_as_own``), but a second thread would still share a core with
    it, so no core is free. Counting it, or no longer, drops the samples taken before: its
    CPU time moves from one side of the sum to the other."""
    with busy_process() as busy:
        neighbours.count_as_own(busy.pid)
        try:
            assert busy.pid in neighbours._own_helpers and not neighbours._samples.taken
            assert neighbours._runnable_counts() is not None
            until_now(lambda: not neighbours.core_free(), "the helper to hold its core")
            counts = neighbours._runnable_counts()
            assert counts is not None and counts[0] == 1
        finally:
            neighbours.count_as_own(busy.pid, own=False)
    assert busy.pid not in neighbours._own_helpers and not neighbours._samples.taken


def test_a_thread_of_this_herald_counted_after_it_slept_is_not_another_process(
        monkeypatch: pytest.MonkeyPatch, scripted: list[tuple[float, float, float]]) -> None:
    """Since Linux 6.12 a thread that has just gone to sleep can stay in the count of
    runnable threads for a tick or two. Counted so, one more thread is runnable than any
    process has; if this herald used all the machine's busy CPU time lately, no other
    process is taken to be runnable. One that used a core of it is."""
    monkeypatch.setattr(neighbours, "_runnable_counts", lambda: (0, 1))  # a sleeper counted
    # 0.2 s apart: the machine kept 2 cores busy, this herald 2 (others none) or 1 of them.
    scripted += [(10.0, 100.0, 50.0), (10.2, 100.4, 50.4), (10.4, 100.8, 50.6),
                 (10.6, 101.2, 51.0), (10.8, 101.6, 51.2)]
    assert neighbours.crowded()  # no window yet: the count is all there is
    assert not neighbours.crowded()  # this herald's own CPU time: a sleeper, not a process
    assert neighbours.crowded()  # another process used a core
    assert neighbours.core_free()
    assert not neighbours.core_free()


def test_others_are_judged_over_the_newest_window_at_least_recent_long(
        scripted: list[tuple[float, float, float]]) -> None:
    """The window ends now and begins at the newest sample at least ``RECENT`` old, so a
    process that has just stopped or begun weighs as much as it does lately, and the
    samples before that one are dropped."""
    r = neighbours.RECENT
    scripted += [(0.0, 0.0, 0.0),  # long ago: nobody else busy since
                 (100.0, 150.0, 50.0),  # another process kept a core busy for 100 s
                 (100.0 + 0.4 * r, 150.0 + 0.8 * r, 50.0 + 0.8 * r),  # herald on both cores
                 (100.0 + 1.6 * r, 150.0 + 3.2 * r, 50.0 + 2.0 * r)]
    taken = neighbours._samples
    assert taken.others_cores() is None  # nothing to compare with
    assert taken.others_cores() == pytest.approx(1.0)  # over the 100 s
    # less than RECENT later: still from the first sample, the newest that old
    assert taken.others_cores() == pytest.approx(100.0 / (100.0 + 0.4 * r))
    # from the sample before, 1.2 RECENT back: the machine kept 2 cores busy, herald 1
    assert taken.others_cores() == pytest.approx(1.0)
    assert [s[0] for s in taken.taken] == [100.0 + 0.4 * r, 100.0 + 1.6 * r]


def test_a_thread_keeps_a_recent_sample_while_nothing_reads() -> None:
    """However long herald has been idle, the window at a text's start is recent: a thread
    takes a sample every ``SAMPLE_EVERY`` from the first reading on."""
    neighbours.crowded()
    first = neighbours._samples.taken[-1][0]
    until_now(lambda: neighbours._samples.taken[-1][0] > first, "the thread's next sample")
    [sampler] = [t for t in threading.enumerate() if t.name == "herald-load"]
    comm = Path(f"/proc/self/task/{sampler.native_id}/comm")
    assert comm.read_text().strip() == "herald-load"  # as ``top -H`` shows it


def test_a_forked_child_has_its_own_samples() -> None:
    """A helper is forked from a process whose sampling thread may hold the lock: the child
    starts afresh, and its first reading starts its own thread."""
    neighbours.crowded()
    code = (
        "import os, sys\n"
        "import tts.neighbours as n\n"
        "n.crowded()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = not n._samples.taken and n._samples.pid == 0\n"
        "    n.crowded()\n"
        "    ok = ok and n._samples.pid == os.getpid() and len(n._samples.taken) == 1\n"
        "    os._exit(0 if ok else 1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(os.waitstatus_to_exitcode(status))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def test_reading_the_load_and_naming_threads_load_no_torch() -> None:
    """A fleet satellite's thread pools name their threads with what the sampling thread
    uses, and a satellite loads no model: neither may bring in torch."""
    code = ("import sys\nimport daemon.thread_pools\nimport tts.neighbours as n\n"
            "n.crowded()\nsys.exit('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr or "torch was imported"

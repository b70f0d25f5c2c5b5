"""``@pytest.mark.alone``: a test that measures time closely runs with no neighbour.

README's test command runs the suite on two pytest-xdist workers: most tests wait on real
time (audio played at its pace, brokers, timeouts), not on the CPU, and share the machine
well. A few measure what a busy neighbour would change (a start time to 10 ms, a first
audio within a second, a page that must play while the audio streams). Those are marked
``alone``: such a test waits until the other worker's current test has ended, and the other
worker starts no test until it is over, so it runs as it would in a serial run. Its
thresholds stay what they are.

The lock is a readers-writer lock on files that every worker of one run shares: each test
holds ``room`` shared, an ``alone`` test holds it exclusive. ``gate`` keeps a waiting
``alone`` test from being starved: it is taken before ``room`` and, by an ``alone`` test,
held until it ends, so the other worker queues behind it instead of slipping in between.
The lock is taken outside the whole test (setup, call, teardown) and outside
pytest-timeout's watch, so waiting for a neighbour never counts against a test's timeout.
Without xdist (one process runs every test in turn) it does nothing.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import IO

import pytest


def _lock_dir() -> Path | None:
    """The directory of this run's lock files: None outside an xdist worker."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return Path(tempfile.gettempdir()) / f"herald-tests-{run}" if run else None


_files: tuple[IO[str], IO[str]] | None = None  # gate and room, open for the whole session


def _locks(directory: Path) -> tuple[IO[str], IO[str]]:
    global _files
    if _files is None:
        directory.mkdir(exist_ok=True)
        _files = (open(directory / "gate", "a"), open(directory / "room", "a"))  # noqa: SIM115
    return _files


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, object, object]:
    directory = _lock_dir()
    if directory is None:
        return (yield)
    gate, room = _locks(directory)
    alone = item.get_closest_marker("alone") is not None
    fcntl.flock(gate, fcntl.LOCK_EX)
    fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    if not alone:
        fcntl.flock(gate, fcntl.LOCK_UN)
    try:
        return (yield)
    finally:
        fcntl.flock(room, fcntl.LOCK_UN)
        fcntl.flock(gate, fcntl.LOCK_UN)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Each worker closes its files and removes them; the other keeps using the ones it has
    open (only it runs tests now), and the last one to end removes the directory."""
    directory = _lock_dir()
    if directory is None or _files is None:
        return
    for f in _files:
        f.close()
    for name in ("gate", "room"):
        (directory / name).unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:  # the other worker's files are still there
        pass

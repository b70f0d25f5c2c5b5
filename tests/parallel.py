"""How the suite shares two cores on two pytest-xdist workers (README's test command),
a test module to each at a time (``--dist loadfile``), since most tests wait on real time
(audio played at its pace, brokers, timeouts) rather than on the CPU. Without xdist (one
process runs every test in turn) nothing here does anything.

Order: a module with a ``slow`` test is handed out first, then the others as xdist orders
them (most tests first). The longest tests are single ones (the soak, the back-to-back
bursts, the MQTT flood); handed out last, as xdist's own order would, one of them kept a
worker busy for minutes after the other had run out of work.

``@pytest.mark.alone``: a few tests measure what a busy neighbour would change (a start time
to 10 ms, a first audio within a second, a page that must still be playing when Stop is
clicked). Such a test waits until the other worker's current test has ended, and the other
worker starts no test until it is over, so it runs as in a serial run, its thresholds as
they are. The lock is a readers-writer lock on files that the workers of one run share:
each test holds ``room`` shared, an ``alone`` test holds it exclusive. ``gate`` keeps a
waiting ``alone`` test from being starved: it is taken before ``room`` and, by an ``alone``
test, held until it ends, so the other worker queues behind it instead of slipping in
between. The lock is taken outside the whole test (setup, call, teardown) and outside
pytest-timeout's watch, so waiting for a neighbour never counts against a test's timeout.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import IO

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, hand modules out in the order of the collection (below), not by count."""
    if getattr(config.option, "dist", "no") != "no":
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker: modules with a ``slow`` test first, then by their number of tests, most
    first (xdist's own order); the tests of a module keep their order. Every worker sorts
    the same collection the same way, as xdist requires."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    count: dict[str, int] = {}
    slow: set[str] = set()
    for item in items:
        module = item.nodeid.split("::")[0]
        count[module] = count.get(module, 0) + 1
        if item.get_closest_marker("slow") is not None:
            slow.add(module)
    first_seen = {m: i for i, m in enumerate(count)}

    def key(item: pytest.Item) -> tuple[bool, int, int]:
        module = item.nodeid.split("::")[0]
        return module not in slow, -count[module], first_seen[module]

    items.sort(key=key)  # stable: each module's tests stay in their order


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

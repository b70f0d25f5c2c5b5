"""herald's pools name their threads for the OS, where ``top -H`` and the soak read them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from daemon.thread_pools import SIZES, pool
from tts.native_names import name_native


def _os_name() -> str:
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()


@pytest.mark.parametrize("name", sorted(SIZES))
def test_a_pools_threads_carry_its_name_whole(name: str) -> None:
    assert len(name.encode()) <= 15  # what the OS keeps of a name
    executor = pool(name)
    try:
        assert executor.submit(_os_name).result(timeout=10) == name
    finally:
        executor.shutdown()


def test_a_thread_named_for_the_os_keeps_the_first_15_bytes() -> None:
    got: list[str] = []

    def run() -> None:
        name_native()
        got.append(_os_name())

    t = threading.Thread(target=run, name="herald-a-long-thread-name")
    t.start()
    t.join(10)
    assert got == ["herald-a-long-t"]

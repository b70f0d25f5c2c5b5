"""Waiting in a test for what the code under test does in its own time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

GUARD = 60.0  # seconds: a hang guard, never a performance threshold


async def until(condition: Callable[[], object], what: str, timeout: float = GUARD) -> None:
    """Until ``condition()`` is true; after ``timeout`` seconds the test fails, saying
    ``what`` it waited for."""
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"waited {timeout:g} s for {what}") from None


def until_now(condition: Callable[[], object], what: str, timeout: float = GUARD) -> None:
    """``until`` for a test with no event loop: polls ``condition()`` from this thread."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}")
        time.sleep(0.02)

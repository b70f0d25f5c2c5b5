"""Waiting in a test for what the code under test does in its own time."""

from __future__ import annotations

import asyncio
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

"""The functions that hear of a change (an event, a latency record, the device state, the
status, the voices, the fleet's presence), called in the order they were added.

A listener that raises is logged and the rest are still called: one listener's bug (a
front's publish, a speaker's volume) must never keep the others from hearing of a change,
nor fail the code that made it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Generic, ParamSpec

P = ParamSpec("P")


class Listeners(Generic[P]):
    """``failed`` is the line logged (with the traceback, on ``log``, the logger of the module
    that owns the change) when a listener raises; with ``log_args`` it is a %-format of the
    listener's arguments (the scheduler's event payload)."""

    def __init__(self, log: logging.Logger, failed: str, log_args: bool = False) -> None:
        self._log = log
        self._failed = failed
        self._log_args = log_args
        self._fns: list[Callable[P, object]] = []

    def add(self, fn: Callable[P, object]) -> None:
        self._fns.append(fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for fn in self._fns:
            try:
                fn(*args, **kwargs)
            except Exception:
                self._logged(*args)

    async def notify(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """As a call, but a listener may also be a coroutine function: its result is awaited,
        and what it raises is logged the same way."""
        for fn in self._fns:
            try:
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                self._logged(*args)

    def _logged(self, *args: object) -> None:
        if self._log_args:
            self._log.exception(self._failed, *args, stacklevel=3)
        else:
            self._log.exception(self._failed, stacklevel=3)

"""What herald is doing now, whatever front the work came from: the one source of the MQTT
``status`` (and Home Assistant's State, Time to first audio and Real-time factor sensors) and
of the line ``systemctl status`` shows.

Every front's work goes through the scheduler, which knows what runs and what waits. Every
latency record, from any front, becomes ``last_latency``. Listeners hear of each change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..listeners import Listeners
from .metrics import LatencyRecord
from .state import DeviceState

log = logging.getLogger(__name__)

Listener = Callable[[], None]


class Status:
    def __init__(self, state: DeviceState, version: str) -> None:
        self.state = state
        self.version = version
        # The speaker/network scheduler (daemon.jobs.scheduler.Scheduler), once the service has one.
        self.scheduler: Any | None = None
        self.last_latency: dict[str, Any] | None = None
        self._listeners: Listeners[[]] = Listeners(log, "status listener failed")
        state.add_listener(lambda _: self.changed())

    def add_listener(self, fn: Listener) -> None:
        self._listeners.add(fn)

    def changed(self) -> None:
        self._listeners()

    # ------------------------------------------------------------------ what changes it

    def latency(self, record: LatencyRecord) -> None:
        """A metrics listener: every front's latency record is the last latency."""
        self.last_latency = record.as_dict()
        self.changed()

    # ------------------------------------------------------------------ reading it

    def problem(self) -> str | None:
        """Why herald is not healthy now (work in hand that isn't progressing), or None."""
        return self.scheduler.problem() if self.scheduler is not None else None

    def snapshot(self) -> dict[str, Any]:
        """``{state, queue, current_id, voice, volume, version, last_latency}``."""
        snap: dict[str, Any] = (self.scheduler.snapshot() if self.scheduler is not None else
                                {"state": "idle", "queue": 0, "current_id": None})
        return {**snap, **self.state.as_dict(), "version": self.version,
                "last_latency": self.last_latency}

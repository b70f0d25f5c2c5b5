"""How many connections a front keeps open, and the one log line and count for each it closes
because the client was too slow, idle, or one too many (HTTP and Wyoming, the fronts clients
connect to).

Every open connection costs a file descriptor and some memory, and only the client decides how
long it keeps one; so each of these fronts caps the connections it serves at once
(``max_connections``) and times out a request that arrives too slowly or a connection that
sits idle. A connection over the cap is still accepted, told "busy" in its protocol's way and
closed, so its client learns why and when to retry instead of seeing a reset or a hang.
"""

from __future__ import annotations

import logging
import time

from ..jobs.metrics import Metrics

log = logging.getLogger("herald.connections")

# A flood over the cap is logged as one line per this many seconds, not one per connection.
REFUSALS_LOGGED_EVERY = 10.0


class Connections:
    """One front's open connections: the first ``limit`` are served, the rest refused."""

    def __init__(self, front: str, limit: int, setting: str, metrics: Metrics) -> None:
        self.front = front
        self.limit = limit
        self.setting = setting  # the key that sets ``limit``, for messages
        self.metrics = metrics
        self.served = 0  # admitted and still open
        self._unlogged = 0  # refusals since the last one logged
        self._logged_at = -REFUSALS_LOGGED_EVERY

    def open(self) -> bool:
        """Count a connection that was just accepted: True if it may be served, False if it
        is over the cap (refuse it, then call ``close(False)`` once it is gone)."""
        self.metrics.connections.labels(self.front).inc()
        if self.served >= self.limit:
            return False
        self.served += 1
        return True

    def close(self, served: bool) -> None:
        self.metrics.connections.labels(self.front).dec()
        if served:
            self.served -= 1

    @property
    def busy_text(self) -> str:
        return (f"herald is serving {self.limit} connections already ({self.setting}); "
                "retry in a moment")

    def refused(self, peer: str) -> None:
        """Count a connection refused over the cap; log it, or summarize a flood of them."""
        self.metrics.connections_closed.labels(self.front, "busy").inc()
        now = time.monotonic()
        if now - self._logged_at < REFUSALS_LOGGED_EVERY:
            self._unlogged += 1
            return
        more = (f" (and {self._unlogged} more since the last such line)"
                if self._unlogged else "")
        log.warning("refused %s: %d connections are open, the most %s allows%s",
                    peer, self.limit, self.setting, more)
        self._unlogged = 0
        self._logged_at = now

    def closed_for(self, reason: str, peer: str, why: str) -> None:
        """Count and log, once, a connection closed for ``reason`` (header, body, read: a
        request sent too slowly; idle: nothing sent for too long)."""
        self.metrics.connections_closed.labels(self.front, reason).inc()
        level = logging.INFO if reason == "idle" else logging.WARNING
        log.log(level, "closed %s: %s", peer, why)

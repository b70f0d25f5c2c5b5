"""The embedded broker: with no ``mqtt.host`` configured, herald brings its own.

So ``herald run`` works on a fresh machine: amqtt serves MQTT 3.1.1 on 127.0.0.1 (loopback
only; anonymous access is fine there) inside herald's own event loop. It keeps nothing across
restarts; a home with other MQTT devices should run Mosquitto and set ``mqtt.host``.

amqtt (0.11.2 to at least 0.12.1) has a race that herald works around here rather than pin
an older amqtt: when a client connects, the broker walks its table of *every* client's topic
filters and sends the new client the retained messages matching each, awaiting each send
while still iterating the table. A subscription made by another client during that await
adds to the table and the walk fails with "dictionary changed size during iteration"; asyncio
then closes the new client's connection, and whatever it published or was owed meanwhile is
lost (QoS 0 silently). The same walk also hands a new client retained messages on topics it
never subscribed to. ``_PatchedBroker`` walks a snapshot of the table, and sends a client
only the retained messages of its own subscriptions, as MQTT says.

An error inside amqtt's per-client or delivery tasks would otherwise reach the log only as
asyncio's generic "Unhandled exception in client_connected_cb" (the client then silently
gone), or not until the failed task is garbage-collected (the message silently undelivered):
``_PatchedBroker`` says in herald's log what was lost and what to do.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from contextlib import suppress
from functools import cache
from typing import Any

from ..errors import HeraldError

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
AMQTT_LOGGERS = ("amqtt", "transitions")
REPORT_EVERY = 60.0  # seconds: a failure that repeats is logged with its count this often


class BrokerError(HeraldError):
    """The embedded broker could not start; the message says what to do."""


def port_in_use(port: int, host: str = HOST) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


class EmbeddedBroker:
    name = "broker"

    def __init__(self, port: int) -> None:
        self.port = port
        self._broker: Any = None

    async def start(self) -> None:
        if port_in_use(self.port):
            raise BrokerError(
                f"cannot start the embedded MQTT broker: {HOST}:{self.port} is already in use "
                "(another broker?); herald will try to connect to it. Set mqtt.host to use "
                "that broker on purpose, or mqtt.port to run the embedded one elsewhere")
        for name in AMQTT_LOGGERS:  # per-packet chatter at INFO
            logging.getLogger(name).setLevel(logging.WARNING)
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{HOST}:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin":
                        {"allow_anonymous": True}},
        }
        self._broker = patched_broker_class()(config)
        try:
            await self._broker.start()
        except Exception as e:
            self._broker = None
            raise BrokerError(f"the embedded MQTT broker failed to start on {HOST}:{self.port}: "
                              f"{e}") from e
        log.info("embedded MQTT broker (MQTT 3.1.1) listening on %s:%d; set mqtt.host to use "
                 "your own broker", HOST, self.port)

    async def stop(self) -> None:
        if self._broker is not None:
            broker, self._broker = self._broker, None
            await broker.shutdown()


class _SnapshotDict(dict):  # type: ignore[type-arg]
    """A dict whose iteration walks a copy of its keys (or items, values): a coroutine that
    awaits inside ``for ... in`` over it never sees it change size under it."""

    def __iter__(self) -> Any:
        return iter(list(super().__iter__()))

    def keys(self) -> Any:
        return list(super().keys())

    def items(self) -> Any:
        return list(super().items())

    def values(self) -> Any:
        return list(super().values())


class _FailureReport:
    """One log line per kind of failure inside the broker, then at most one a minute with
    how many more there were: a broken broker must not flood the log."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def __call__(self, what: str, e: BaseException) -> None:
        now = time.monotonic()
        last = self._last.get(what)
        if last is not None and now - last < REPORT_EVERY:
            self._since[what] = self._since.get(what, 0) + 1
            return
        more = self._since.pop(what, 0)
        self._last[what] = now
        log.error("embedded MQTT broker: %s after an internal error (%s: %s)%s; if it "
                  "recurs, run Mosquitto and set mqtt.host", what, type(e).__name__, e,
                  f", {more} more since the last report" if more else "",
                  exc_info=last is None)


@cache
def patched_broker_class() -> type:
    """amqtt's ``Broker`` with the two fixes of the module docstring (imported on first use:
    a herald with its own broker configured never loads amqtt)."""
    from amqtt.broker import Broker

    class _PatchedBroker(Broker):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # amqtt's attribute, untyped there
            self._subscriptions = _SnapshotDict(self._subscriptions)  # type: ignore[has-type]
            self._report = _FailureReport()

        async def _client_connected(self, listener_name: str, reader: Any, writer: Any
                                    ) -> None:
            try:
                await super()._client_connected(listener_name, reader, writer)
            except Exception as e:
                self._report("a client was disconnected (what it sent or was owed since "
                             "is lost)", e)
                with suppress(Exception):
                    await writer.close()

        async def _run_broadcast(self, running_tasks: Any) -> None:
            try:
                await super()._run_broadcast(running_tasks)
            except Exception as e:
                self._report("a message was not delivered to every subscriber", e)

        async def _publish_retained_messages_for_subscription(
                self, subscription: tuple[str, int], session: Any) -> None:
            subscribers = self._subscriptions.get(subscription[0], ())
            if any(s.client_id == session.client_id for s, _ in subscribers):
                await super()._publish_retained_messages_for_subscription(subscription,
                                                                          session)

    return _PatchedBroker

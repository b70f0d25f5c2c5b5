"""A node's connection to the fleet: one paho client (``<mqtt.client_id>-fleet``, MQTT 5,
clean start, session expiry 0), this node's retained presence with the last will saying
``offline``, and the dispatch of every fleet message to the part that takes it.

Every part of a node's fleet role (the worker, the pool of jobs this node owns, the player of
the audio addressed to it, its groups) shares this one connection: one client id per node, so
no two connections of one node throw each other off the broker. Each part names the topics it
takes (``handle``); paho's thread only hands messages to the event loop, where the parts see
them in the order the broker sent them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt

from ..fronts.mqtt.connection import Connection
from ..settings import Settings
from .messages import Presence
from .topics import FleetTopics

log = logging.getLogger(__name__)

CLIENT_SUFFIX = "-fleet"  # the fleet connection's client id: mqtt.client_id + this


@dataclass(frozen=True)
class FleetMessage:
    topic: str
    payload: bytes
    retained: bool


Handler = Callable[[FleetMessage], bool]  # True: taken (no other part sees it)


class FleetLink:
    """The fleet connection of one node. ``presence()`` describes the node (its voices, slots
    and groups): published, retained, on every connect and whenever ``announce`` is called."""

    name = "fleet"

    def __init__(self, settings: Settings, topics: FleetTopics,
                 presence: Callable[[], Presence]) -> None:
        self.settings = settings
        self.topics = topics
        self._presence = presence
        self._handlers: list[Handler] = []
        self._standing: list[str] = []  # subscribed on every connect
        self._on_connect: list[Callable[[], None]] = []
        self._conn: Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ wiring (before start)

    def handle(self, handler: Handler, *subscriptions: str) -> None:
        """``handler`` sees every message no part before it took; ``subscriptions`` are held
        for as long as the node runs."""
        self._handlers.append(handler)
        self._standing += [s for s in subscriptions if s not in self._standing]

    def on_connect(self, fn: Callable[[], None]) -> None:
        """``fn`` runs on the loop after every (re)connect, once presence is published."""
        self._on_connect.append(fn)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        s = self.settings
        offline = Presence(state="offline", role=s.node.role).to_json()
        self._conn = Connection("MQTT (fleet)", s.mqtt, s.mqtt.host, s.client_id + CLIENT_SUFFIX,
                                lambda: list(self._standing), self._call, self._on_message,
                                self._connected, (self.topics.node(), offline, 1, True),
                                clean=True)
        log.info("fleet: joining %s on %s:%d as %s (%s)", self.topics.base, s.mqtt.host,
                 s.mqtt.port, self._conn.client_id, s.node.role)
        self._conn.start()

    async def stop(self) -> None:
        """Say ``offline`` (briefly waiting for the broker to take it), then disconnect."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.connected:
            offline = Presence(state="offline", role=self.settings.node.role).to_json()
            info = conn.publish(self.topics.node(), offline, 1, True)
            try:
                if info is not None:
                    await asyncio.to_thread(info.wait_for_publish, 2.0)
            except (RuntimeError, ValueError) as e:
                log.warning("fleet: could not say offline before leaving: %s", e)
        await conn.stop()

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.connected

    # ------------------------------------------------------------------ while running

    def publish(self, topic: str, payload: bytes | str, qos: int = 1,
                retain: bool = False) -> mqtt.MQTTMessageInfo | None:
        """Publish (QoS 1 waits in paho while the broker is away); None once stopped."""
        return self._conn.publish(topic, payload, qos, retain) if self._conn else None

    def subscribe(self, *topics: str) -> None:
        if self._conn is not None:
            self._conn.subscribe(*topics)

    def unsubscribe(self, *topics: str) -> None:
        if self._conn is not None:
            self._conn.unsubscribe(*topics)

    def announce(self) -> None:
        """Publish this node's presence again (its voices or groups changed)."""
        if self.connected:
            self.publish(self.topics.node(), self._presence().to_json(), 1, True)

    # ------------------------------------------------------------------ paho thread -> loop

    def _call(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed under us: shutting down
            pass

    def _on_message(self, msg: mqtt.MQTTMessage) -> None:
        self._call(self._dispatch, FleetMessage(msg.topic, bytes(msg.payload), bool(msg.retain)))

    def _dispatch(self, msg: FleetMessage) -> None:
        for handler in self._handlers:
            try:
                if handler(msg):
                    return
            except Exception:
                log.exception("fleet: handling a message on %s failed", msg.topic)
                return
        log.debug("fleet: nobody takes %s", msg.topic)

    def _connected(self) -> None:
        self.announce()
        for fn in self._on_connect:
            try:
                fn()
            except Exception:
                log.exception("fleet: a part failed after the connect")

"""A node's one connection to the fleet: ``<mqtt.client_id>-fleet``, MQTT 5, clean start,
session expiry 0, its retained presence with the ``offline`` last will, and the dispatch of
every message to the part that subscribed to it (the worker, and on a node that plays, the
pool and the receiver).

A clean session that ends with the connection is what makes the share group fair: a node
that is gone is out of it at once, so the broker gives jobs only to workers that are there,
and nothing queues for a dead node. After a reconnect every subscription is made again
(``Connection`` keeps them).

paho's network thread only hands each message to the loop (``call_soon_threadsafe``); the
handlers run on the loop and must not block it either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt

from ..mqtt.connection import Connection, call_soon
from ..settings import Settings
from .messages import Presence, VoiceInfo
from .topics import FleetTopics

log = logging.getLogger(__name__)

FLEET_CLIENT_SUFFIX = "-fleet"  # the fleet connection's client id: mqtt.client_id + this
QOS = 1  # every fleet message

Handler = Callable[[str, bytes], None]  # (topic, payload), on the loop


def _plain(filter_: str) -> str:
    """A subscription filter as the topics it matches are named (no ``$share/<group>/``)."""
    if filter_.startswith("$share/"):
        return filter_.split("/", 2)[2]
    return filter_


class FleetLink:
    """The fleet connection of one node. Parts ``subscribe`` filters with a handler each
    (a ``$share/...`` filter too) and ``publish``; what the node offers is in ``voices``,
    ``slots`` and ``groups``, published as its presence (``publish_presence`` after a
    change)."""

    name = "fleet connection"

    def __init__(self, settings: Settings, version: str) -> None:
        self.settings = settings
        self.topics = FleetTopics.from_settings(settings)
        self.version = version
        self.voices: list[VoiceInfo] = []
        self.slots = 0
        self.groups: list[str] = list(settings.fleet.groups) if settings.node.plays else []
        self.client_id = settings.client_id + FLEET_CLIENT_SUFFIX
        self._handlers: dict[str, Handler] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Connection | None = None
        # Whether the message being handled now came with the retain flag (the fleet's
        # command topics refuse such a message, as the device's do: daemon.fleet.groups).
        self.retained = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        s = self.settings
        self._loop = asyncio.get_running_loop()
        will = (self.topics.node(), self.presence("offline").to_json(), QOS, True)
        self._conn = Connection("MQTT (fleet)", s.mqtt, s.mqtt.host, self.client_id,
                                list, self._call, self._on_message, self._connected, will,
                                clean=True)
        self._conn.subscribe(*self._handlers)
        log.info("fleet: connecting to %s:%d as %s (MQTT 5, clean session), fleet topic %s, "
                 "role %s", s.mqtt.host, s.mqtt.port, self.client_id, self.topics.base,
                 s.node.role)
        self._conn.start()

    async def stop(self) -> None:
        """Say ``offline`` (waiting briefly for the broker to take it), then disconnect."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.connected:
            info = conn.publish(self.topics.node(), self.presence("offline").to_json(), QOS,
                                True)
            try:
                if info is not None:
                    await asyncio.to_thread(info.wait_for_publish, 2.0)
            except (RuntimeError, ValueError) as e:
                log.warning("fleet: could not publish offline before leaving: %s", e)
        await conn.stop()
        log.info("fleet: disconnected")

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.connected

    # ------------------------------------------------------------------ messages

    def subscribe(self, filter_: str, handler: Handler) -> None:
        """Hand every message matching ``filter_`` to ``handler`` until ``unsubscribe``
        (QoS 1; made again after a reconnect). Call on the loop."""
        self._handlers[filter_] = handler
        if self._conn is not None:
            self._conn.subscribe(filter_)

    def unsubscribe(self, *filters: str) -> None:
        for f in filters:
            self._handlers.pop(f, None)
        if self._conn is not None:
            self._conn.unsubscribe(*filters)

    def publish(self, topic: str, payload: bytes | str, retain: bool = False
                ) -> mqtt.MQTTMessageInfo | None:
        """QoS 1, from any thread; waits in paho while disconnected (dropped before
        ``start`` and after ``stop``)."""
        if self._conn is None:
            return None
        return self._conn.publish(topic, payload, QOS, retain)

    def presence(self, state: str = "online") -> Presence:
        return Presence(state="online" if state == "online" else "offline",
                        role=self.settings.node.role, version=self.version,
                        voices=list(self.voices), slots=self.slots, groups=list(self.groups))

    def publish_presence(self) -> None:
        self.publish(self.topics.node(), self.presence().to_json(), retain=True)

    # ------------------------------------------------------------------ paho thread

    def _on_message(self, msg: mqtt.MQTTMessage) -> None:
        self._call(self._dispatch, msg.topic, bytes(msg.payload), bool(msg.retain))

    def _call(self, fn: Any, *args: Any) -> None:
        call_soon(self._loop, fn, *args)

    # ------------------------------------------------------------------ event loop

    def _connected(self) -> None:
        self.publish_presence()

    def _dispatch(self, topic: str, payload: bytes, retained: bool = False) -> None:
        self.retained = retained
        handled = False
        for filter_, handler in list(self._handlers.items()):
            plain = _plain(filter_)
            if plain == topic or ("+" in plain or "#" in plain) and mqtt.topic_matches_sub(
                    plain, topic):
                handled = True
                try:
                    handler(topic, payload)
                except Exception:  # one part's bug must not stop the others' messages
                    log.exception("fleet: handling a message on %s failed", topic)
        if not handled:
            log.debug("fleet: nothing subscribed to %s any more; dropped", topic)

"""The MQTT session: herald's connections to the broker, publishing, and the dispatch of
every message to the extension that takes it (commands, discovery, Hermes).

Two connections (``connection``), each a persistent session under a fixed client id: the
main one (``mqtt.client_id``) takes every command and publishes everything, with the last
will; the second (the same id with ``-stream`` appended) takes ``say/stream``. A client that
floods ``say/stream`` faster than herald reads it fills the broker's queue for the second
connection only, so a ``stop`` or a ``say`` still arrives at once on the first. The stream
connection also takes ``stop``: that copy arrives in order with the pieces, and stops a
stream whose first piece was published before the stop but was still queued behind others
when the main connection's copy came (see ``commands``).

paho's callbacks do nothing but drop what an extension says to drop (a flood's pieces, in
the network thread, so they never queue up on the event loop), stamp the arrival time and
hand the message to the asyncio loop with ``call_soon_threadsafe``; parsing, validation and
queueing happen on the loop, and the synthesis in the engine's threads, so no network thread
ever waits on anything.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import paho.mqtt.client as mqtt

from ...context import Context
from ...jobs.metrics import LatencyRecord, Timeline
from ...jobs.request import Code, Limits, RequestError
from ...jobs.scheduler import Scheduler
from ...logs import request_context
from ...mqtt.connection import Connection, call_soon
from ...mqtt.reassembly import RecentIds
from ...mqtt.retained import RetainedRefusals, refusal
from ...mqtt.topics import AVAILABILITY_OFFLINE, AVAILABILITY_ONLINE, Topics, check_publish_topic
from ...settings import MqttSettings
from .commands import Commands
from .discovery import Discovery
from .extension import Extension, Message, Route
from .hermes import Hermes

log = logging.getLogger(__name__)

STREAM_CLIENT_SUFFIX = "-stream"  # the say/stream connection's client id: mqtt.client_id + this


class MqttFront:
    name = "mqtt"

    def __init__(self, settings: MqttSettings, ctx: Context, topics: Topics, client_id: str,
                 scheduler: Scheduler | None = None, host: str | None = None) -> None:
        self.settings = settings
        self.ctx = ctx
        self.topics = topics
        self.client_id = client_id
        self.scheduler = scheduler
        self.host = host or settings.host or "127.0.0.1"
        self.seen = RecentIds()  # request ids taken, on every topic: none is spoken twice
        self._retained = RetainedRefusals()
        self._main: Connection | None = None
        self._stream: Connection | None = None  # say/stream (and stop again)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._discovery = Discovery(self) if settings.discovery.enabled else None
        # More discovery messages, by topic (a fleet member's announcement groups).
        self.discovery_extra: Callable[[], list[tuple[str, dict[str, Any]]]] = list
        wanted: list[Extension | None] = [Commands(self), self._discovery,
                                          Hermes(self) if settings.hermes.enabled else None]
        self._wanted = [e for e in wanted if e is not None]
        self.extensions: list[Extension] = []  # the ones that started
        if scheduler:
            scheduler.add_listener(self._on_event)
        ctx.metrics.add_listener(self._on_latency)
        # Device state, work on every front, every latency record: each republishes the status.
        ctx.status.add_listener(self.publish_status)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the MQTT front is not started"
        return self._loop

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for ext in self._wanted:
            try:
                ext.start()
            except Exception:
                log.exception("MQTT: %s failed to start; the rest keeps serving", ext.name)
                continue
            self.extensions.append(ext)
        self._main = Connection("MQTT", self.settings, self.host, self.client_id,
                                self._main_topics, self._call,
                                lambda msg: self._on_message(msg, False),
                                self._connected, self.topics.will())
        if self._stream_topics():
            self._stream = Connection("MQTT (say/stream)", self.settings, self.host,
                                      self.client_id + STREAM_CLIENT_SUFFIX,
                                      self._stream_topics, self._call,
                                      lambda msg: self._on_message(msg, True))
        log.info("MQTT: connecting to %s:%d as %s%s (MQTT %s), base topic %s", self.host,
                 self.settings.port, self.client_id,
                 f" and {self._stream.client_id}" if self._stream else "",
                 self.settings.protocol, self.topics.base)
        self._main.start()  # and the stream connection once it is up (``_connected``)

    async def stop(self) -> None:
        """Publish ``offline`` (waiting briefly for the broker to take it), then disconnect."""
        for ext in reversed(self.extensions):
            try:
                ext.stop()
            except Exception:
                log.exception("MQTT: %s failed to stop", ext.name)
        if self._main is None:
            return
        if self._main.connected:
            info = self.publish(self.topics.availability, AVAILABILITY_OFFLINE, 1, True)
            try:
                if info is not None:
                    await asyncio.to_thread(info.wait_for_publish, 2.0)
            except (RuntimeError, ValueError) as e:
                log.warning("MQTT: could not publish offline before leaving: %s", e)
        await asyncio.gather(*(conn.stop() for conn in self._connections()))
        self._main = self._stream = None
        log.info("MQTT: disconnected")

    def _connections(self) -> list[Connection]:
        return [c for c in (self._main, self._stream) if c is not None]

    def _stream_topics(self) -> list[str]:
        return [t for ext in self.extensions for t in ext.stream_subscriptions()]

    def _main_topics(self) -> list[str]:
        return [t for ext in self.extensions for t in ext.subscriptions()]

    @property
    def connected(self) -> bool:
        """Whether the main connection (commands, availability, events) is up."""
        return self._main is not None and self._main.connected

    @property
    def stream_connected(self) -> bool:
        """Whether the say/stream connection is up."""
        return self._stream is not None and self._stream.connected

    # ------------------------------------------------------------------ publishing

    def publish(self, topic: str, payload: bytes | str, qos: int = 1,
                retain: bool = False) -> mqtt.MQTTMessageInfo | None:
        """Publish from any thread; QoS >= 1 messages wait in paho while disconnected. Every
        topic is checked (under a microsecond: not worth a caller-side shortcut)."""
        check_publish_topic(topic)
        client = self._main.client if self._main is not None else None
        if client is None:
            return None
        return client.publish(topic, payload, qos, retain)

    def publish_status(self) -> None:
        self.publish(self.topics.status, json.dumps(self.ctx.status.snapshot()), 1, True)

    def publish_discovery(self) -> None:
        if self._discovery is not None:
            self._discovery.publish()

    def publish_event(self, payload: dict[str, Any]) -> None:
        """One event on the device's event topic (the scheduler's, or another part's)."""
        self.publish(self.topics.event, json.dumps(payload), 1, False)

    def error(self, topic: str, message: str, request_id: str | None = None,
              code: Code = "bad-request") -> None:
        """Log a refused message and answer it with an ``error`` event carrying the same code
        every front uses (``daemon.jobs.request.Code``)."""
        with request_context(request_id):
            log.warning("MQTT %s: %s", topic, message)
        self.ctx.metrics.request(self.name, "rejected")
        ev: dict[str, Any] = {"event": "error"}
        if request_id is not None:
            ev["id"] = request_id
        ev["error"] = message
        ev["code"] = code
        ev["topic"] = topic
        self.publish_event(ev)

    # ------------------------------------------------------------------ paho threads

    def _on_message(self, msg: mqtt.MQTTMessage, via_stream: bool) -> None:
        topic, payload = msg.topic, bytes(msg.payload)
        for ext in self.extensions:
            if ext.drop(topic, payload):
                return
        self._call(self._dispatch, Message(topic, payload, msg.retain, Timeline(), via_stream))

    def _call(self, fn: Any, *args: Any) -> None:
        call_soon(self._loop, fn, *args)

    # ------------------------------------------------------------------ event loop

    def _connected(self) -> None:
        """The main connection is up (again) and subscribed: announce ourselves. The first
        time, open the stream connection too: one that cannot connect at all (no broker,
        bad TLS or credentials) is reported once, by the main connection."""
        if self._stream is not None and self._stream.client is None:
            self._stream.start()
        self.publish(self.topics.availability, AVAILABILITY_ONLINE, 1, True)
        self.publish_status()
        for ext in self.extensions:
            ext.connected()

    def _route(self, topic: str) -> Route | None:
        for ext in self.extensions:
            route = ext.route(topic)
            if route is not None:
                return route
        return None

    def _dispatch(self, msg: Message) -> None:
        route = self._route(msg.topic)
        if route is None:
            log.debug("MQTT: ignoring message on %s", msg.topic)
            return
        if msg.retained and not route.retained_ok:
            self.refuse_retained(msg)
            return
        try:
            route.handle(msg)
        except RequestError as e:
            self.error(msg.topic, str(e), e.id, e.code)
        except Exception as e:
            log.exception("MQTT: handling a message on %s failed", msg.topic)
            self.error(msg.topic, f"internal error: {e}", code="synthesis-failed")

    # --- what the extensions share

    def refuse_retained(self, msg: Message) -> None:
        """A retained command is never executed; reported once (see ``retained``)."""
        if self._retained.first(msg.topic, msg.payload):
            self.error(msg.topic, refusal(msg.topic))

    def limits(self) -> Limits:
        """The request limits and defaults for a request arriving now."""
        sinks = self.scheduler.available_sinks() if self.scheduler else ()
        default = ("speaker",) if "speaker" in sinks else ("mqtt",)
        return Limits(self.settings.max_text, default, self.resolve_voice,
                      self.ctx.voice_list.check_speaker, self.settings.max_age)

    def resolve_voice(self, name: str | None) -> str:
        """A voice name or language; none: the default set on ``set/voice``."""
        return self.ctx.voice_list.resolve_voice(name, default=self.ctx.state.voice)

    def scheduler_for(self, request_id: str | None = None) -> Scheduler:
        """The scheduler, or the error a request gets when there is none."""
        if self.scheduler is None:
            raise RequestError("this herald has no scheduler (speaker and MQTT audio are "
                               "both off)", request_id)
        return self.scheduler

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- outputs

    def _on_event(self, ev: dict[str, Any]) -> None:
        self.publish_event(ev)
        for ext in self.extensions:
            ext.on_event(ev)
        self.publish_status()

    def _on_latency(self, rec: LatencyRecord) -> None:
        self.publish(self.topics.latency, json.dumps(rec.as_dict()), 1, False)


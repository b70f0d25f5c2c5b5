"""The MQTT session: the client, its persistent session, publishing, and the dispatch of
every message to the extension that takes it (commands, discovery, Hermes).

paho runs its network loop in its own thread (``loop_start``). Its callbacks do nothing but
stamp the arrival time and hand the message to the asyncio loop with
``call_soon_threadsafe``; parsing, validation and queueing happen on the loop, and the
synthesis in the engine's threads, so the network thread never waits on anything.

The session is persistent (a fixed client id; MQTT 5 ``clean_start=False`` with a session
expiry, or MQTT 3.1.1 ``clean_session=False``), so QoS 1 requests sent while herald or the
broker was away are delivered when it comes back. paho reconnects with backoff; every
(re)connect resubscribes and republishes availability, status and discovery.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import sys
import threading
from collections.abc import Coroutine
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from ...context import Context
from ...logcontext import request_context
from ...metrics import LatencyRecord, Timeline
from ...request import Limits, RequestError
from ...scheduler import Scheduler
from ...settings import MqttSettings
from ...topics import AVAILABILITY_OFFLINE, AVAILABILITY_ONLINE, Topics, check_publish_topic
from .commands import Commands
from .discovery import Discovery
from .extension import Extension, Message, Route
from .hermes import Hermes
from .reassembly import RecentIds
from .retained import RetainedRefusals, refusal

log = logging.getLogger(__name__)

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
        self.connected = False
        self.seen = RecentIds()  # request ids taken, on every topic: none is spoken twice
        self._retained = RetainedRefusals()
        self._client: mqtt.Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._was_connected = False
        self._connect_failures = 0
        self._refused = ""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._discovery = Discovery(self) if settings.discovery.enabled else None
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
        v5 = self.settings.protocol == "5"
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                             clean_session=None if v5 else False)
        client.will_set(*self.topics.will())
        if self.settings.username:
            client.username_pw_set(self.settings.username, self.settings.password)
        tls = self.settings.tls
        if tls.enabled:
            client.tls_set(ca_certs=str(tls.ca) if tls.ca else None,
                           certfile=str(tls.cert) if tls.cert else None,
                           keyfile=str(tls.key) if tls.key else None)
            client.tls_insecure_set(tls.insecure)
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        client.max_queued_messages_set(10_000)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_connect_fail = self._on_connect_fail
        client.on_message = self._on_message
        if v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = self.settings.session_expiry
            client.connect_async(self.host, self.settings.port, self.settings.keepalive,
                                 clean_start=False, properties=props)
        else:
            client.connect_async(self.host, self.settings.port, self.settings.keepalive)
        self._client = client
        client.loop_start()
        log.info("MQTT: connecting to %s:%d as %s (MQTT %s), base topic %s", self.host,
                 self.settings.port, self.client_id, self.settings.protocol, self.topics.base)

    async def stop(self) -> None:
        """Publish ``offline`` (waiting briefly for the broker to take it), then disconnect."""
        self._stopping = True
        for ext in reversed(self.extensions):
            try:
                ext.stop()
            except Exception:
                log.exception("MQTT: %s failed to stop", ext.name)
        client = self._client
        if client is None:
            return
        if self.connected:
            info = client.publish(self.topics.availability, AVAILABILITY_OFFLINE, 1, True)
            try:
                await asyncio.to_thread(info.wait_for_publish, 2.0)
            except (RuntimeError, ValueError) as e:
                log.warning("MQTT: could not publish offline before leaving: %s", e)
        client.disconnect()
        # paho's thread may be inside a connect attempt (up to its 5 s timeout): wait in a
        # daemon thread of our own, so a slow broker can't hold up the process exit.
        if not await _run_in_daemon_thread(client.loop_stop, 3.0):
            log.warning("MQTT: the network thread did not stop within 3 s; leaving it")
        self._client = None
        log.info("MQTT: disconnected")

    # ------------------------------------------------------------------ publishing

    def publish(self, topic: str, payload: bytes | str, qos: int = 1,
                retain: bool = False) -> mqtt.MQTTMessageInfo | None:
        """Publish from any thread; QoS >= 1 messages wait in paho while disconnected. Every
        topic is checked (under a microsecond: not worth a caller-side shortcut)."""
        check_publish_topic(topic)
        if self._client is None:
            return None
        return self._client.publish(topic, payload, qos, retain)

    def publish_status(self) -> None:
        self.publish(self.topics.status, json.dumps(self.ctx.status.snapshot()), 1, True)

    def publish_discovery(self) -> None:
        if self._discovery is not None:
            self._discovery.publish()

    def _event(self, payload: dict[str, Any]) -> None:
        self.publish(self.topics.event, json.dumps(payload), 1, False)

    def error(self, topic: str, message: str, request_id: str | None = None) -> None:
        """Log a refused message and answer it with an ``error`` event."""
        with request_context(request_id):
            log.warning("MQTT %s: %s", topic, message)
        self.ctx.metrics.request(self.name, "rejected")
        ev: dict[str, Any] = {"event": "error"}
        if request_id is not None:
            ev["id"] = request_id
        ev["error"] = message
        ev["topic"] = topic
        self._event(ev)

    # ------------------------------------------------------------------ paho thread

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: mqtt.ConnectFlags,
                    reason: Any, properties: Any) -> None:
        if reason.is_failure:
            # Once per reason (paho retries with backoff): the log must not fill up.
            if str(reason) != self._refused:
                self._refused = str(reason)
                log.error("MQTT: broker %s:%d refused the connection: %s (check "
                          "mqtt.username, mqtt.password, mqtt.client_id and mqtt.protocol); "
                          "retrying with backoff", self.host, self.settings.port, reason)
            return
        self._refused = ""
        self._call(self._connected, flags.session_present)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any,
                       properties: Any) -> None:
        was_connected, self.connected = self.connected, False
        if was_connected and not self._stopping:
            log.warning("MQTT: lost the broker at %s:%d (%s); reconnecting with backoff",
                        self.host, self.settings.port, reason)

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self._connect_failures += 1
        if self._connect_failures != 1 and self._connect_failures % 20 != 0:
            return
        # paho calls this from inside its ``except OSError`` around the connect, so the error
        # in hand says why. A failed TLS handshake is a configuration problem, not a broker
        # that is down: say which settings to check.
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLError):
            log.error("MQTT: TLS with the broker at %s:%d failed (attempt %d): %s (check "
                      "mqtt.tls.ca, mqtt.tls.cert and mqtt.tls.key, and that mqtt.host is a "
                      "name in the broker's certificate); retrying", self.host,
                      self.settings.port, self._connect_failures, error)
        else:
            log.warning("MQTT: cannot reach the broker at %s:%d (attempt %d); retrying "
                        "(is it running? see mqtt.host / mqtt.port)", self.host,
                        self.settings.port, self._connect_failures)

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        topic, payload = msg.topic, bytes(msg.payload)
        for ext in self.extensions:
            if ext.drop(topic, payload):
                return
        self._call(self._dispatch, Message(topic, payload, msg.retain, Timeline()))

    def _call(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed under us: shutting down
            pass

    # ------------------------------------------------------------------ event loop

    def _connected(self, session_present: bool) -> None:
        if self._client is None or self._stopping:
            return
        self.connected = True
        self._connect_failures = 0
        log.info("MQTT: connected to %s:%d (%s session)%s", self.host, self.settings.port,
                 "resumed" if session_present else "new",
                 ", again" if self._was_connected else "")
        self._was_connected = True
        topics = [t for ext in self.extensions for t in ext.subscriptions()]
        if self.settings.protocol == "5":
            # Retain As Published: a retained command keeps its flag live and when queued in
            # the session, so it is refused like the stored copy; Retain Handling 1: a
            # resumed session does not get the stored copy on top of the queued one.
            options = SubscribeOptions(qos=1, retainAsPublished=True,
                                       retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
            self._client.subscribe([(t, options) for t in topics])
        else:
            self._client.subscribe([(t, 1) for t in topics])
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
            self.error(msg.topic, str(e), e.id)
        except Exception as e:
            log.exception("MQTT: handling a message on %s failed", msg.topic)
            self.error(msg.topic, f"internal error: {e}")

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
                      self.ctx.engine.check_speaker, self.settings.max_age)

    def resolve_voice(self, name: str | None) -> str:
        """A voice name or language; none: the default set on ``set/voice``."""
        return self.ctx.engine.resolve_voice(name, default=self.ctx.state.voice)

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
        self._event(ev)
        for ext in self.extensions:
            ext.on_event(ev)
        self.publish_status()

    def _on_latency(self, rec: LatencyRecord) -> None:
        self.publish(self.topics.latency, json.dumps(rec.as_dict()), 1, False)


async def _run_in_daemon_thread(fn: Any, timeout: float) -> bool:
    """Run a blocking call off the loop; True if it returned within ``timeout``."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def target() -> None:
        try:
            fn()
        finally:
            try:
                loop.call_soon_threadsafe(done.set)
            except RuntimeError:  # the loop is gone: nobody is waiting any more
                pass

    threading.Thread(target=target, daemon=True, name="herald-mqtt-stop").start()
    try:
        await asyncio.wait_for(done.wait(), timeout)
        return True
    except TimeoutError:
        return False

"""One connection to the broker: a paho client with herald's settings (protocol, persistent
session, credentials, TLS, reconnect backoff), its log lines, and its subscriptions.

The MQTT front opens two of them (``daemon.fronts.mqtt.front``): the main one, and one that
takes only ``say/stream``, so that a flood of stream pieces queues at the broker for that
connection alone. Everything here holds for both, so both behave the same towards the broker.

paho runs each client's network loop in a thread of its own (``loop_start``). Its callbacks
do nothing but hand what happened to the asyncio loop (``call``); subscribing and logging
the connection happen there.

A fleet node (``daemon.fleet``) opens one more, ``clean``: a new session on every connect
that ends with the connection (session expiry 0), so a node that is gone leaves its share
groups at once and nothing queues for it. Its per-job topics come and go while it runs
(``subscribe``/``unsubscribe``); a ``$share/<group>/<topic>`` filter is subscribed like any
other, and the broker gives each message on it to one member of the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from ..settings import MqttSettings
from .topics import check_publish_topic

log = logging.getLogger(__name__)

Will = tuple[str, str, int, bool]


class Connection:
    """A paho client for one client id. ``label`` starts its log lines (which connection);
    ``call`` runs a function on the event loop from any thread; ``on_message`` runs in
    paho's network thread for every message; ``on_connected`` on the loop after every
    (re)connect, once the subscriptions (``topics()``, and those added with ``subscribe``)
    are sent. ``clean``: a clean start with session expiry 0 (MQTT 5) instead of the
    persistent session."""

    def __init__(self, label: str, settings: MqttSettings, host: str, client_id: str,
                 topics: Callable[[], list[str]], call: Callable[..., None],
                 on_message: Callable[[mqtt.MQTTMessage], None],
                 on_connected: Callable[[], None] | None = None,
                 will: Will | None = None, clean: bool = False) -> None:
        self.label = label
        self.settings = settings
        self.host = host
        self.client_id = client_id
        self.connected = False
        self.client: mqtt.Client | None = None
        self._topics = topics
        self._call = call
        self._on_message = on_message
        self._on_connected = on_connected
        self._will = will
        self.clean = clean
        self._runtime: dict[str, None] = {}  # subscribed with subscribe(), in order
        self._stopping = False
        self._was_connected = False
        self._connect_failures = 0
        self._refused = ""

    def start(self) -> None:
        """Create the client and start connecting (in paho's thread, with backoff)."""
        if self._stopping:
            return
        s = self.settings
        v5 = s.protocol == "5"
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                             clean_session=None if v5 else self.clean)
        if self._will is not None:
            client.will_set(*self._will)
        if s.username:
            client.username_pw_set(s.username, s.password)
        if s.tls.enabled:
            client.tls_set(ca_certs=str(s.tls.ca) if s.tls.ca else None,
                           certfile=str(s.tls.cert) if s.tls.cert else None,
                           keyfile=str(s.tls.key) if s.tls.key else None)
            client.tls_insecure_set(s.tls.insecure)
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        client.max_queued_messages_set(10_000)
        client.on_socket_open = _no_delay
        client.on_connect = self._paho_connect
        client.on_disconnect = self._paho_disconnect
        client.on_connect_fail = self._paho_connect_fail
        client.on_message = lambda c, u, msg: self._on_message(msg)
        if v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = 0 if self.clean else s.session_expiry
            client.connect_async(self.host, s.port, s.keepalive, clean_start=self.clean,
                                 properties=props)
        else:
            client.connect_async(self.host, s.port, s.keepalive)
        self.client = client
        client.loop_start()

    def subscribe(self, *topics: str) -> None:
        """Subscribe to ``topics`` now (if connected) and after every reconnect, until
        ``unsubscribe``. Call on the event loop; paho only queues the packet."""
        new = [t for t in topics if t not in self._runtime]
        for t in new:
            self._runtime[t] = None
        if new and self.connected and self.client is not None:
            self._send_subscribe(self.client, new)

    def unsubscribe(self, *topics: str) -> None:
        """Undo ``subscribe`` for ``topics``."""
        gone = [t for t in topics if t in self._runtime]
        for t in gone:
            del self._runtime[t]
        if gone and self.connected and self.client is not None:
            self.client.unsubscribe(gone)

    def publish(self, topic: str, payload: bytes | str, qos: int = 1,
                retain: bool = False) -> mqtt.MQTTMessageInfo | None:
        """Publish from any thread (checked topic); QoS >= 1 waits in paho while
        disconnected. None before ``start`` and after ``stop``."""
        check_publish_topic(topic)
        client = self.client
        if client is None:
            return None
        return client.publish(topic, payload, qos, retain)

    async def stop(self) -> None:
        """Disconnect and stop paho's thread (``publish`` what must go out before this)."""
        self._stopping = True  # and a start() still to come is not made
        client = self.client
        if client is None:
            return
        client.disconnect()
        # paho's thread may be inside a connect attempt (up to its 5 s timeout): wait in a
        # daemon thread of our own, so a slow broker can't hold up the process exit.
        if not await _run_in_daemon_thread(client.loop_stop, 3.0):
            log.warning("%s: the network thread did not stop within 3 s; leaving it",
                        self.label)
        self.client = None

    # ------------------------------------------------------------------ paho thread

    def _paho_connect(self, client: mqtt.Client, userdata: Any, flags: mqtt.ConnectFlags,
                      reason: Any, properties: Any) -> None:
        if reason.is_failure:
            # Once per reason (paho retries with backoff): the log must not fill up.
            if str(reason) != self._refused:
                self._refused = str(reason)
                log.error("%s: broker %s:%d refused the connection as %s: %s (check "
                          "mqtt.username, mqtt.password, mqtt.client_id and mqtt.protocol, "
                          "and the broker's ACL for this client id); retrying with backoff",
                          self.label, self.host, self.settings.port, self.client_id, reason)
            return
        self._refused = ""
        self._call(self._connected, flags.session_present)

    def _paho_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any,
                         properties: Any) -> None:
        was_connected, self.connected = self.connected, False
        if was_connected and not self._stopping:
            log.warning("%s: lost the broker at %s:%d (%s); reconnecting with backoff",
                        self.label, self.host, self.settings.port, reason)

    def _paho_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self._connect_failures += 1
        if self._connect_failures != 1 and self._connect_failures % 20 != 0:
            return
        # paho calls this from inside its ``except OSError`` around the connect, so the error
        # in hand says why. A failed TLS handshake is a configuration problem, not a broker
        # that is down: say which settings to check.
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLError):
            log.error("%s: TLS with the broker at %s:%d failed (attempt %d): %s (check "
                      "mqtt.tls.ca, mqtt.tls.cert and mqtt.tls.key, and that mqtt.host is a "
                      "name in the broker's certificate); retrying", self.label, self.host,
                      self.settings.port, self._connect_failures, error)
        else:
            log.warning("%s: cannot reach the broker at %s:%d (attempt %d); retrying "
                        "(is it running? see mqtt.host / mqtt.port)", self.label, self.host,
                        self.settings.port, self._connect_failures)

    # ------------------------------------------------------------------ event loop

    def _connected(self, session_present: bool) -> None:
        client = self.client
        if client is None or self._stopping:
            return
        self.connected = True
        self._connect_failures = 0
        log.info("%s: connected to %s:%d as %s (%s session)%s", self.label, self.host,
                 self.settings.port, self.client_id, "resumed" if session_present else "new",
                 ", again" if self._was_connected else "")
        self._was_connected = True
        topics = list(dict.fromkeys([*self._topics(), *self._runtime]))
        if topics:
            self._send_subscribe(client, topics)
        if self._on_connected is not None:
            self._on_connected()


    def _send_subscribe(self, client: mqtt.Client, topics: list[str]) -> None:
        if self.settings.protocol == "5":
            # Retain As Published: a retained command keeps its flag live and when queued in
            # the session, so it is refused like the stored copy; Retain Handling 1: a
            # resumed session does not get the stored copy on top of the queued one. (No
            # Local stays off: MQTT 5 forbids it on a $share filter.)
            options = SubscribeOptions(qos=1, retainAsPublished=True,
                                       retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
            client.subscribe([(t, options) for t in topics])
        else:
            client.subscribe([(t, 1) for t in topics])


def call_soon(loop: asyncio.AbstractEventLoop | None, fn: Any, *args: Any) -> None:
    """Run ``fn(*args)`` on ``loop`` from any thread (a paho callback hands off with it);
    nothing once the loop is gone or closing: herald is shutting down."""
    if loop is None or loop.is_closed():
        return
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop closed under us
        pass


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
        async with asyncio.timeout(timeout):
            await done.wait()
        return True
    except TimeoutError:
        return False


def _no_delay(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    """Send every packet as soon as it is written (paho leaves Nagle's algorithm on).

    With it on, a packet waits while the one before it is unacknowledged, and a broker
    acknowledges a QoS 0 publish only with TCP's delayed ACK, up to 40 ms on Linux: an audio
    stream's first chunk, right behind its ``start``, would come that much later."""
    with contextlib.suppress(OSError, AttributeError):  # not a TCP socket: nothing to do
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

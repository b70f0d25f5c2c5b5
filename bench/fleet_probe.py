"""The fleet benchmark's one MQTT client (MQTT 5, like the nodes): it sends the requests and
records, with the wall-clock time each arrived, what the benchmark reads on the broker:

* every node's availability and fleet presence (to know the fleet is up);
* every node's latency records (``herald/<device>/latency``), the groups' events, and the
  nodes' own events while it follows them (``follow("events", True)``);
* each group stream's ``start`` (its ``play_at``) and the first chunk of every stream, group
  or device: when the broker delivered it to one more subscriber, beside the satellites;
* while it follows ``device_audio``, every chunk of the satellites' own streams (the
  concurrent-streams test: when each chunk came, to see whether it came in time);
* Mosquitto's ``$SYS`` counters of what it delivered.

It counts what it received itself (messages, and bytes as MQTT 5 PUBLISH packets), so that
the broker's figures can be given without the benchmark's own subscription.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from bench.fleet_rig import FLEET

SYS_TOPICS = {"$SYS/broker/publish/messages/sent": "messages",
              "$SYS/broker/publish/bytes/sent": "payload_bytes",
              "$SYS/broker/bytes/sent": "bytes"}


@dataclass
class Counters:
    """Mosquitto's cumulative delivery counters, as of ``at`` (when they arrived here)."""

    messages: int = 0  # PUBLISH packets sent to subscribers
    payload_bytes: int = 0  # their payloads
    bytes: int = 0  # every byte sent (PUBLISH headers and topics, acknowledgements, pings)
    at: float = 0.0  # when the oldest of the three values arrived


@dataclass
class Received:
    """What this client received (the benchmark's own share of the broker's counters)."""

    messages: int = 0
    payload_bytes: int = 0
    bytes: int = 0


@dataclass
class Probe:
    port: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    online: set[str] = field(default_factory=set)  # devices whose availability is online
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)  # online, with voices
    latency: dict[tuple[str, str], tuple[dict[str, Any], float]] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    starts: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)
    first_chunk: dict[str, float] = field(default_factory=dict)  # job -> arrival
    # job -> [(arrival, seq, bytes)] while following the satellites' own audio
    chunks: dict[str, list[tuple[float, int, int]]] = field(
        default_factory=lambda: defaultdict(list))
    counters: Counters = field(default_factory=Counters)
    _counter_at: dict[str, float] = field(default_factory=dict)  # each value's arrival
    received: Received = field(default_factory=Received)

    def __post_init__(self) -> None:
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="herald-fleet-bench",
                                  protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self._acked: set[int] = set()  # subscriptions the broker has confirmed (their mid)
        self.client.on_subscribe = self._on_subscribe
        self.client.connect("127.0.0.1", self.port, keepalive=60)
        self.client.loop_start()
        self._following: set[str] = set()
        topics = ["herald/+/availability", f"{FLEET}/nodes/+", "herald/+/latency",
                  f"{FLEET}/group/+/event", f"{FLEET}/group/+/audio/+/start",
                  f"{FLEET}/group/+/audio/+/chunk/0", f"{FLEET}/device/+/audio/+/chunk/0",
                  *SYS_TOPICS]
        self._subscribe([(t, 1) for t in topics])

    def _subscribe(self, topics: list[tuple[str, int]]) -> None:
        _, mid = self.client.subscribe(topics)
        self.wait(lambda: mid in self._acked, 10, "the broker's SUBACK")

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, *rest: Any) -> None:
        with self.cond:
            self._acked.add(mid)
            self.cond.notify_all()

    def follow(self, what: str, on: bool) -> None:
        """Subscribe to (or leave) ``events`` (every node's events) or ``device_audio``
        (every chunk of the satellites' own streams), which only some tests need: the
        rest of the time the broker does not send them here."""
        topic = {"events": "herald/+/event", "device_audio": f"{FLEET}/device/+/audio/#"}[what]
        with self.cond:
            (self._following.add if on else self._following.discard)(what)
        if on:
            self._subscribe([(topic, 1)])
        else:
            self.client.unsubscribe(topic)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()

    # ------------------------------------------------------------------ receiving

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        now = time.time()
        topic, payload = msg.topic, bytes(msg.payload)
        with self.cond:
            self._count(topic, payload, msg.qos)
            parts = topic.split("/")
            if topic in SYS_TOPICS:
                setattr(self.counters, SYS_TOPICS[topic], int(payload))
                self._counter_at[topic] = now
                if len(self._counter_at) == len(SYS_TOPICS):
                    self.counters.at = min(self._counter_at.values())
            elif parts[-1] == "availability":
                (self.online.add if payload == b"online" else self.online.discard)(parts[1])
            elif topic.startswith(f"{FLEET}/nodes/"):
                presence = json.loads(payload) if payload else {}
                if presence.get("state") == "online" and presence.get("voices"):
                    self.workers[parts[-1]] = presence  # its voices, slots, ...
                else:
                    self.workers.pop(parts[-1], None)
            elif parts[-1] == "latency":
                rec = json.loads(payload)
                self.latency[(parts[1], rec["id"])] = (rec, now)
            elif parts[-1] == "event":
                device = parts[-2] if topic.startswith(f"{FLEET}/group/") else parts[1]
                self.events.append((device, json.loads(payload), now))
            elif "/audio/" in topic:
                self._audio(parts, payload, now)
            self.cond.notify_all()

    def _audio(self, parts: list[str], payload: bytes, now: float) -> None:
        # F/group/<g>/audio/<job>/start, F/<group|device>/<x>/audio/<job>/chunk/<seq>
        if parts[-1] == "start":
            self.starts.setdefault(parts[-2], (json.loads(payload), now))
        elif parts[-2] == "chunk":
            job, seq = parts[-3], int(parts[-1])
            if seq == 0:
                self.first_chunk.setdefault(job, now)
            if parts[-6] == "device" and "device_audio" in self._following:
                got = self.chunks[job]
                if not any(s == seq for _, s, _ in got[-3:]):  # two subscriptions match 0
                    got.append((now, seq, len(payload)))

    def _count(self, topic: str, payload: bytes, qos: int) -> None:
        rest = 2 + len(topic.encode()) + (2 if qos else 0) + 1 + len(payload)
        header = 1 + next(n for n in (1, 2, 3, 4) if rest < 128 ** n)
        self.received.messages += 1
        self.received.payload_bytes += len(payload)
        self.received.bytes += header + rest

    # ------------------------------------------------------------------ waiting

    def wait(self, pred: Callable[[], Any], timeout: float, what: str) -> Any:
        with self.cond:
            value = self.cond.wait_for(pred, timeout)
        if not value:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        return value

    def snapshot(self) -> tuple[Counters, Received]:
        """The broker's counters as of an update that came after this call (Mosquitto
        publishes them every second), and what this client had received by then."""
        asked = time.time()
        self.wait(lambda: self.counters.at > asked + 0.05, 5.0, "Mosquitto's $SYS counters")
        with self.cond:
            c, r = self.counters, self.received
            return (Counters(c.messages, c.payload_bytes, c.bytes, c.at),
                    Received(r.messages, r.payload_bytes, r.bytes))

    # ------------------------------------------------------------------ sending

    def publish(self, topic: str, payload: dict[str, Any]) -> float:
        """Publish (QoS 1); the wall-clock time it was handed to the client."""
        t = time.time()
        self.client.publish(topic, json.dumps(payload), qos=1)
        return t

    def record(self, device: str, request_id: str) -> dict[str, Any] | None:
        with self.cond:
            got = self.latency.get((device, request_id))
        return got[0] if got else None

"""The tests' MQTT client: a paho client that records everything herald publishes, the way
an automation (or Home Assistant) sees it, and helpers to wait for events and audio.

Every test that runs ``herald run`` against a real broker talks to it through this class.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

DEVICE = "testdev"  # the device_id of the heralds the tests start
BASE = f"herald/{DEVICE}"
WAIT = 90.0  # hang guard for anything herald has to synthesize


@dataclass
class Msg:
    topic: str
    payload: bytes
    retain: bool
    at: float

    def json(self) -> Any:
        return json.loads(self.payload)


class Client:
    """A paho client that records everything under herald's base topic.

    ``ca``: connect over TLS, trusting that CA (the broker's certificate must name
    127.0.0.1)."""

    def __init__(self, port: int, client_id: str = "", clean: bool = True,
                 topics: tuple[str, ...] = (f"{BASE}/#", "homeassistant/#", "hermes/tts/#"),
                 ca: Path | None = None) -> None:
        self.msgs: list[Msg] = []
        self.cond = threading.Condition()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=mqtt.MQTTv311, clean_session=clean)
        if ca is not None:
            self.c.tls_set(ca_certs=str(ca))
        self.c.reconnect_delay_set(1, 2)
        subscribed = threading.Event()
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe([(t, 1) for t in topics])
        self.c.on_subscribe = lambda *a: subscribed.set()
        self.c.on_message = self._on_message
        self.c.connect("127.0.0.1", port, keepalive=10)
        self.c.loop_start()
        assert subscribed.wait(10), "test client could not subscribe"

    def _on_message(self, c: Any, u: Any, m: mqtt.MQTTMessage) -> None:
        with self.cond:
            self.msgs.append(Msg(m.topic, m.payload, bool(m.retain), time.monotonic()))
            self.cond.notify_all()

    def publish(self, topic: str, payload: bytes | str, qos: int = 1,
                retain: bool = False) -> None:
        full = topic if topic.startswith(("herald/", "homeassistant/", "hermes/")) else (
            f"{BASE}/{topic}")
        info = self.c.publish(full, payload, qos, retain)
        if self.c.is_connected():
            info.wait_for_publish(10)

    def say(self, **fields: Any) -> str:
        self.publish("say", json.dumps(fields))
        return str(fields.get("id"))

    def wait(self, pred: Callable[[list[Msg]], Any], timeout: float = WAIT,
             what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                result = pred(self.msgs)
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"timed out waiting for {what}; last messages: "
                                f"{[(m.topic, m.payload[:80]) for m in self.msgs[-8:]]}")
                self.cond.wait(left)

    def wait_online(self, timeout: float = 60.0, what: str = "herald online") -> None:
        """Until herald's availability says ``online`` (the retained one counts)."""
        self.wait(lambda ms: any(m.topic == f"{BASE}/availability" and m.payload == b"online"
                                 for m in ms), timeout, what)

    def events(self, rid: str | None = None) -> list[dict[str, Any]]:
        with self.cond:
            evs = [m.json() for m in self.msgs if m.topic == f"{BASE}/event"]
        return [e for e in evs if rid is None or e.get("id") == rid]

    def wait_event(self, rid: str, kinds: tuple[str, ...] = ("finished", "stopped", "error"),
                   timeout: float = WAIT) -> dict[str, Any]:
        def done(msgs: list[Msg]) -> Any:
            for m in msgs:
                if m.topic == f"{BASE}/event":
                    ev = m.json()
                    if ev.get("id") == rid and ev.get("event") in kinds:
                        return ev
            return None
        return self.wait(done, timeout, f"{kinds} for {rid}")

    def audio(self, rid: str) -> tuple[dict[str, Any], bytes, dict[str, Any]]:
        """start JSON, the chunks joined in seq order, stop JSON."""
        self.wait(lambda ms: any(m.topic == f"{BASE}/audio/{rid}/stop" for m in ms),
                  what=f"audio stop of {rid}")
        with self.cond:
            mine = [m for m in self.msgs if m.topic.startswith(f"{BASE}/audio/{rid}/")]
        start = next(m.json() for m in mine if m.topic.endswith("/start"))
        stop = next(m.json() for m in mine if m.topic.endswith("/stop"))
        chunks = sorted((int(m.topic.rsplit("/", 1)[1]), m.payload) for m in mine
                        if "/chunk/" in m.topic)
        assert [seq for seq, _ in chunks] == list(range(len(chunks))), "missing chunks"
        return start, b"".join(p for _, p in chunks), stop

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()

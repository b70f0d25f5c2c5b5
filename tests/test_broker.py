"""The embedded broker (herald's zero-config default) under a burst of clients.

``herald run`` with no ``mqtt.host`` serves MQTT itself through amqtt. Many clients at once
connecting and subscribing, while messages flow through it, once made amqtt drop a client
("dictionary changed size during iteration", see daemon/broker.py) and lose what it published
and was owed. Here: herald is speaking to the network (its audio chunks flow through the
broker), a publisher streams numbered QoS 0 messages, and a burst of clients connects at once:
half new (clean session, each subscribing to a filter of its own as well as to what everyone
subscribes to), half persistent sessions coming back (their retained messages are re-sent while
the others subscribe). Every client must stay connected and get every message from its first
to the last, herald's log must stay free of errors, and the utterance must arrive whole.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from audio_checks import assert_speech, pcm16
from conftest import free_port
from herald_process import start_herald
from mqtt_client import BASE, DEVICE, Client
from paho.mqtt.enums import CallbackAPIVersion

from daemon.broker import EmbeddedBroker, patched_broker_class

BURST = 40  # clients connecting at once; the race showed with a dozen
FLOW = "flow"
ELSEWHERE = "elsewhere/retained"  # retained, and subscribed to by the observer only
TEXT = ("The embedded broker keeps every client connected while many of them arrive at "
        "once, and every message reaches everyone who subscribed to it.")


@dataclass
class Peer:
    """One client of the burst: what it got and whether the broker ever dropped it."""

    client_id: str
    clean: bool
    own: str  # a topic filter only this client subscribes to
    connects: int = 0
    drops: int = 0
    subscribed: threading.Event = field(default_factory=threading.Event)
    flow: list[int] = field(default_factory=list)
    topics: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    c: Any = None

    def start(self, port: int) -> None:
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                        protocol=mqtt.MQTTv311, clean_session=self.clean)
        c.reconnect_delay_set(1, 2)

        def on_connect(cl: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
            self.connects += 1
            cl.subscribe([(f"{BASE}/#", 0), (FLOW, 0), (self.own, 0)])

        def on_disconnect(cl: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
            if not rc.is_failure:
                return  # our own disconnect at the end
            self.drops += 1

        def on_message(cl: Any, u: Any, m: mqtt.MQTTMessage) -> None:
            with self.lock:
                self.topics.add(m.topic)
                if m.topic == FLOW:
                    self.flow.append(int(m.payload))

        c.on_connect, c.on_disconnect, c.on_message = on_connect, on_disconnect, on_message
        c.on_subscribe = lambda *a: self.subscribed.set()
        c.connect_async("127.0.0.1", port, keepalive=30)
        c.loop_start()
        self.c = c

    def close(self) -> None:
        if self.c is not None:
            self.c.disconnect()
            self.c.loop_stop()


def publish_flow(port: int, stop: threading.Event, sent: list[int]) -> None:
    """Numbered QoS 0 messages on FLOW, one per millisecond or so, until ``stop``; then the
    last number at QoS 1, so it is known to have reached the broker."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        n = 0
        while not stop.is_set():
            c.publish(FLOW, str(n), 0)
            sent.append(n)
            n += 1
            time.sleep(0.001)
        c.publish(FLOW, str(n), 1).wait_for_publish(30)
        sent.append(n)
    finally:
        c.disconnect()
        c.loop_stop()


def test_burst_of_clients_through_the_embedded_broker(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "herald.toml"
    config.write_text(f'device_id = "{DEVICE}"\n[mqtt]\nhost = ""\nport = {port}\n'
                      "[mqtt.discovery]\nenabled = false\n"
                      "[speaker]\nenabled = false\n[wyoming]\nenabled = false\n"
                      "[http]\nenabled = false\n")
    herald = start_herald(config, tmp_path / "herald.log")
    peers = [Peer(f"burst{i}", clean=i % 2 == 0, own=f"own/{i}/#") for i in range(BURST)]
    observer: Client | None = None
    try:
        herald.wait_log("embedded MQTT broker")  # not a bare TCP probe: amqtt logs those
        observer = Client(port, topics=(f"{BASE}/#", "elsewhere/#"))
        observer.wait_online(what="online via the embedded broker")
        observer.c.publish(ELSEWHERE, b"not for the burst", 1, True).wait_for_publish(10)
        # The persistent half has been here before: their subscriptions are in the broker.
        for p in peers:
            if not p.clean:
                p.start(port)
        for p in peers:
            if not p.clean:
                assert p.subscribed.wait(20), f"{p.client_id} could not subscribe"
                p.close()
                p.subscribed.clear()
                p.connects = 0

        stop, sent = threading.Event(), []
        flow = threading.Thread(target=publish_flow, args=(port, stop, sent))
        flow.start()
        try:
            observer.say(id="burst-say", text=TEXT, sinks=["mqtt"])
            time.sleep(0.2)  # messages are flowing when the burst arrives
            for p in peers:
                p.start(port)
            deadline = time.monotonic() + 60
            for p in peers:
                assert p.subscribed.wait(max(0.1, deadline - time.monotonic())), (
                    f"{p.client_id} never got its subscription acknowledged:\n{herald.tail()}")
            time.sleep(0.5)
        finally:
            stop.set()
            flow.join(60)
        last = sent[-1]
        deadline = time.monotonic() + 90  # amqtt is slow: it catches up at its own pace
        while time.monotonic() < deadline and any(last not in p.flow[-1:] for p in peers):
            time.sleep(0.2)

        assert observer.wait_event("burst-say")["event"] == "finished"
        _, pcm, _ = observer.audio("burst-say")
        assert_speech(pcm16(pcm), 22050, min_seconds=3.0)
        dropped = [f"{p.client_id} ({'clean' if p.clean else 'persistent'}): connected "
                   f"{p.connects} time(s), dropped {p.drops}"
                   for p in peers if p.drops or p.connects != 1]
        assert not dropped, "\n".join(dropped) + f"\n{herald.tail()}"
        log = herald.output()
        for bad in ("Traceback", "Unhandled exception", "RuntimeError", "ERROR"):
            assert bad not in log, f"{bad!r} in herald's log:\n{herald.tail()}"
        for p in peers:
            with p.lock:
                got, topics = list(p.flow), set(p.topics)
            assert got and got == list(range(got[0], last + 1)), (
                f"{p.client_id}: {len(got)} messages, not every one from {got[:1]} to {last}")
            assert f"{BASE}/availability" in topics, f"{p.client_id}: no retained availability"
            assert ELSEWHERE not in topics, (
                f"{p.client_id} got a retained message on a topic it never subscribed to")
        assert herald.proc.poll() is None, herald.tail()
        assert herald.terminate() == 0, herald.tail()
    finally:
        for p in peers:
            p.close()
        if observer is not None:
            observer.close()
        herald.kill()


async def test_an_internal_broker_error_reaches_the_log(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A failure inside amqtt (injected here: the race above is gone) is reported in herald's
    log by what it cost, and the broker goes on serving the others."""
    cls = patched_broker_class()
    matches, authenticate = cls._matches, cls._authenticate

    def poisoned_matches(self: Any, topic: str, a_filter: str) -> bool:
        if topic == "poison":
            raise RuntimeError("injected delivery failure")
        return bool(matches(self, topic, a_filter))

    async def poisoned_authenticate(self: Any, session: Any, listener: Any) -> bool:
        if session.client_id == "poison":
            raise RuntimeError("injected session failure")
        return bool(await authenticate(self, session, listener))

    monkeypatch.setattr(cls, "_matches", poisoned_matches)
    monkeypatch.setattr(cls, "_authenticate", poisoned_authenticate)
    broker = EmbeddedBroker(free_port())
    await broker.start()
    received: list[bytes] = []
    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    c.on_message = lambda cl, u, m: received.append(m.payload)
    try:
        await asyncio.to_thread(c.connect, "127.0.0.1", broker.port)
        c.loop_start()
        c.subscribe("#", 0)
        await asyncio.sleep(0.3)
        c.publish("poison", b"lost", 1)
        c.publish("fine", b"delivered", 1)
        bad = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="poison",
                          protocol=mqtt.MQTTv311)
        bad.connect_async("127.0.0.1", broker.port)
        bad.loop_start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                received and "client was disconnected" in caplog.text):
            await asyncio.sleep(0.1)
        bad.loop_stop()
        assert received == [b"delivered"]
        errors = [r.getMessage() for r in caplog.records
                  if r.name == "daemon.broker" and r.levelno == logging.ERROR]
        assert any("a message was not delivered to every subscriber" in m
                   and "injected delivery failure" in m for m in errors), errors
        assert any("a client was disconnected" in m and "injected session failure" in m
                   for m in errors), errors
        assert all("run Mosquitto and set mqtt.host" in m for m in errors), errors
    finally:
        c.loop_stop()
        c.disconnect()
        await broker.stop()

"""The embedded broker (herald's zero-config default) under a burst of clients.

``herald run`` with no ``mqtt.host`` serves MQTT itself through amqtt. Many clients at once
connecting and subscribing, while messages flow through it, once made amqtt drop a client
("dictionary changed size during iteration", see daemon/mqtt/broker.py) and lose what it published
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
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from audio_checks import assert_speech, pcm16
from conftest import free_port
from herald_process import start_herald
from mqtt_client import BASE, DEVICE, Client
from paho.mqtt.enums import CallbackAPIVersion

from bench.mqtt_burst import burst
from daemon.mqtt.broker import EmbeddedBroker

BURST = 40  # clients connecting at once; the race showed with a dozen
ELSEWHERE = "elsewhere/retained"  # retained, and subscribed to by the observer only
TEXT = ("The embedded broker keeps every client connected while many of them arrive at "
        "once, and every message reaches everyone who subscribed to it.")


def test_burst_of_clients_through_the_embedded_broker(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "herald.toml"
    config.write_text(f'device_id = "{DEVICE}"\n[mqtt]\nhost = ""\nport = {port}\n'
                      "[mqtt.discovery]\nenabled = false\n"
                      "[speaker]\nenabled = false\n[wyoming]\nenabled = false\n"
                      "[http]\nenabled = false\n")
    herald = start_herald(config, tmp_path / "herald.log")
    observer: Client | None = None
    try:
        herald.wait_log("embedded MQTT broker")  # not a bare TCP probe: amqtt logs those
        observer = Client(port, topics=(f"{BASE}/#", "elsewhere/#"))
        observer.wait_online(what="online via the embedded broker")
        observer.c.publish(ELSEWHERE, b"not for the burst", 1, True).wait_for_publish(10)
        speaking = observer  # herald's audio chunks flow through the broker meanwhile
        b = burst(port, BURST, (f"{BASE}/#",),
                  during=lambda: speaking.say(id="burst-say", text=TEXT, sinks=["mqtt"]))

        assert not b.unacknowledged, f"never acknowledged: {b.unacknowledged}\n{herald.tail()}"
        dropped = [f"{p.client_id} ({'clean' if p.clean else 'persistent'}): connected "
                   f"{p.connects} time(s), dropped {p.drops}" for p in b.dropped()]
        assert not dropped, "\n".join(dropped) + f"\n{herald.tail()}"
        log = herald.output()
        for bad in ("Traceback", "Unhandled exception", "RuntimeError", "ERROR"):
            assert bad not in log, f"{bad!r} in herald's log:\n{herald.tail()}"
        for p in b.peers:
            assert p.gaps(b.last) == 0, f"{p.client_id}: {p.gaps(b.last)} messages lost"
            assert f"{BASE}/availability" in p.seen, f"{p.client_id}: no retained availability"
            assert ELSEWHERE not in p.seen, (
                f"{p.client_id} got a retained message on a topic it never subscribed to")
        assert observer.wait_event("burst-say")["event"] == "finished"
        _, pcm, _ = observer.audio("burst-say")
        assert_speech(pcm16(pcm), 22050, min_seconds=3.0)
        assert herald.proc.poll() is None, herald.tail()
        assert herald.terminate() == 0, herald.tail()
    finally:
        if observer is not None:
            observer.close()
        herald.kill()


async def test_an_internal_broker_error_reaches_the_log(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A failure inside amqtt (injected here: the race above is gone) is reported in herald's
    log by what it cost, and the broker goes on serving the others."""
    from daemon.mqtt.broker import patched_broker_class  # here: the burst test runs without it

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
                  if r.name == "daemon.mqtt.broker" and r.levelno == logging.ERROR]
        assert any("a message was not delivered to every subscriber" in m
                   and "injected delivery failure" in m for m in errors), errors
        assert any("a client was disconnected" in m and "injected session failure" in m
                   for m in errors), errors
        assert all("run Mosquitto and set mqtt.host" in m for m in errors), errors
    finally:
        c.loop_stop()
        c.disconnect()
        await broker.stop()

"""A ``say/stream`` flood against ``herald run`` on a real Mosquitto: 100,000 pieces of one
stream, published as fast as a paho client can from another process. The stream is refused
once it passes ``mqtt.max_text``; what comes after must be summarized (a handful of error
events, not one per piece), and a ``say`` and a ``stop`` sent in the middle of the flood
must still be handled within a second. A stop must also stop a stream whose first piece was
queued behind such a flood when the stop came.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Broker, start_broker
from herald_process import HeraldProcess, herald_env, mqtt_only_config, start_herald
from mqtt_client import BASE, DEVICE, Client

PIECES = 100_000
FLOOD_ID = "flood"

# Slow: 100,000 pieces, then the summary of the dropped ones. Alone: the flooder, Mosquitto
# and herald fill both cores, and a command's answer within a second (measured in the module's
# fixture) would have a neighbour's share of them added.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

# The flooder: a separate process, so that its publishing does not compete for this
# process's GIL with the client that measures herald's answers. QoS 1 as an automation would
# send, without a network thread and with paho's inflight window opened wide, so that it
# publishes as fast as it can.
FLOODER = """
import json, sys, time
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
port, topic, n, rid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
c.max_inflight_messages_set(0)
c.max_queued_messages_set(0)
c.connect("127.0.0.1", port)
while not c.is_connected():
    c.loop(0.1)
start = time.monotonic()
for i in range(n):
    piece = {"id": rid, "seq": i, "text": "word "}
    if i == 0:
        piece["sinks"] = ["mqtt"]
    c.publish(topic, json.dumps(piece), 1)  # without a network thread: written right here
    if i % 100 == 0:
        c.loop(0)  # read the broker's acknowledgements
        while len(c._out_messages) > 30000:  # paho's message ids wrap at 65535
            c.loop(0.01)
    if i == n // 2:
        print("half", flush=True)
info = c.publish(topic, json.dumps({"id": rid, "seq": n, "text": "", "final": True}), 1)
while not info.is_published():
    c.loop(0.1)
print(f"done {time.monotonic() - start:.1f}", flush=True)
c.disconnect()
"""


@dataclass
class Flood:
    """What one flood showed: every event herald published, herald's log, and how long the
    say and the stop sent in its middle took to be handled (None: not within 60 s)."""

    events: list[dict[str, Any]]
    log: str
    say_latency: float | None
    stop_latency: float | None
    alive: bool


def _handled_after(c: Client, rid: str, kinds: tuple[str, ...], sent: float) -> float | None:
    deadline = time.monotonic() + 60
    with c.cond:
        while time.monotonic() < deadline:
            for m in c.msgs:
                if m.topic == f"{BASE}/event" and m.at >= sent:
                    ev = m.json()
                    if ev.get("id") == rid and ev["event"] in kinds:
                        return m.at - sent
            c.cond.wait(0.1)
    return None


def _herald(directory: Path, port: int, mqtt: str = "") -> tuple[HeraldProcess, Client]:
    """An MQTT-only herald on the broker at ``port``, and a client that records its events
    (online once this returns)."""
    config = directory / "herald.toml"
    config.write_text(mqtt_only_config(DEVICE, port, mqtt))
    herald = start_herald(config, directory / "herald.log", herald_env())
    c = Client(port, topics=(f"{BASE}/event", f"{BASE}/availability"))
    try:
        c.wait_online()
    except BaseException:
        c.close()
        herald.kill()
        raise
    return herald, c


def _flood(port: int, pieces: int, rid: str) -> subprocess.Popen[str]:
    """Start the flooder on herald's say/stream; returns once it has published half."""
    flooder = subprocess.Popen([sys.executable, "-c", FLOODER, str(port), f"{BASE}/say/stream",
                                str(pieces), rid], stdout=subprocess.PIPE, text=True)
    assert flooder.stdout is not None
    if flooder.stdout.readline().strip() != "half":
        flooder.kill()
        pytest.fail("the flooder failed")
    return flooder


@pytest.fixture(scope="module")
def flood(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flood]:
    tmp = tmp_path_factory.mktemp("flood")
    broker = start_broker(tmp / "broker")
    herald, c = _herald(tmp, broker.port, "stream_timeout = 5")
    flooder = None
    try:
        flooder = _flood(broker.port, PIECES, FLOOD_ID)
        assert flooder.stdout is not None
        # Mid-flood: a say must be queued, and then a stop must cut the stream.
        sent = time.monotonic()
        c.say(id="probe", text="Still here.", sinks=["mqtt"])
        say_latency = _handled_after(c, "probe", ("queued", "error"), sent)
        sent = time.monotonic()
        c.publish("stop", b"")
        stop_latency = _handled_after(c, FLOOD_ID, ("stopped", "finished"), sent)
        done = flooder.stdout.readline()
        assert done.startswith("done"), "the flooder did not finish"
        assert flooder.wait(30) == 0
        print(f"flood: {done.strip()} s; say queued after {say_latency} s, stop handled "
              f"after {stop_latency} s")
        # The dropped pieces are reported as counts, at growing intervals (5 s, 10 s, ...).
        c.wait(lambda ms: any(m.topic == f"{BASE}/event" and "dropped" in m.json().get(
            "error", "") for m in ms), 70, "a summary of the dropped pieces")
        yield Flood(c.events(), herald.output(), say_latency, stop_latency,
                    herald.proc.poll() is None)
    finally:
        if flooder is not None:
            flooder.kill()
        c.close()
        herald.kill()
        broker.stop()
        print(herald.tail())


def test_a_stream_flood_costs_a_handful_of_error_events_not_one_per_piece(
        flood: Flood) -> None:
    errors = [e for e in flood.events if e["event"] == "error"]
    assert 1 <= len(errors) <= 10, (len(errors), errors[:3])
    assert all(e.get("id") == FLOOD_ID for e in errors), errors
    assert any("dropped" in e["error"] for e in errors), errors
    assert "longer than 10000 characters" in errors[-1]["error"]
    assert flood.log.count("WARNING") <= 10
    assert flood.alive


@pytest.mark.timed  # the promise is in seconds: a command is not queued behind the flood
def test_a_say_and_a_stop_during_a_stream_flood_are_handled_within_a_second(
        flood: Flood) -> None:
    assert flood.say_latency is not None and flood.say_latency < 1.0, flood.say_latency
    assert flood.stop_latency is not None and flood.stop_latency < 1.0, flood.stop_latency
    assert [e["event"] for e in flood.events if e.get("id") == "probe"].count("queued") == 1


def test_a_stop_stops_a_stream_that_was_queued_behind_a_flood_and_spares_the_next(
        broker: Broker, tmp_path: Path) -> None:
    """The stream's first piece is published before the stop, but waits behind a backlog of
    another stream's pieces on herald's say/stream connection, while the stop arrives at
    once on the main connection. The stop must still stop it (the copy of the stop on the
    stream connection, in order with the pieces), without an error event, and a stream
    published after the stop must be spoken."""
    herald, c = _herald(tmp_path, broker.port)
    flooder = None
    try:
        # Below the broker's max_queued_messages (conftest): none of it is dropped there.
        flooder = _flood(broker.port, 9000, "backlog")
        assert flooder.stdout is not None
        assert flooder.stdout.readline().startswith("done"), "the flooder did not finish"
        c.publish("say/stream", json.dumps({"id": "queued-behind", "seq": 0, "final": True,
                                            "text": "Never spoken.", "sinks": ["mqtt"]}))
        c.publish("stop", json.dumps({"id": "queued-behind"}))
        c.publish("say/stream", json.dumps({"id": "after-stop", "seq": 0, "final": True,
                                            "text": "Spoken.", "sinks": ["mqtt"]}))
        assert c.wait_event("after-stop")["event"] == "finished"
        # The scenario happened: the main connection's copy came before the stream.
        herald.wait_log("nothing has id queued-behind yet")
        # Queued (and started at once: nothing else waits for the network lane), then
        # stopped in the same turn of herald's loop: not spoken, and no error.
        events = [e["event"] for e in c.events("queued-behind")]
        assert events in (["queued", "stopped"], ["queued", "started", "stopped"]), events
        assert flooder.wait(30) == 0
    finally:
        if flooder is not None:
            flooder.kill()
        c.close()
        herald.kill()

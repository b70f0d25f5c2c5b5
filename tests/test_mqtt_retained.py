"""A retained command present while herald was away, against a real Mosquitto.

The broker delivers it twice over: once queued in herald's persistent session, and once as
the stored retained copy on subscribing. Neither may be spoken, and the refusal is reported
once. With MQTT 3.1.1 only the stored copy is recognisable (the protocol clears the flag on
everything else), which a fresh session gets on subscribing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Broker
from herald_process import HeraldProcess, herald_env, mqtt_only_config, start_herald
from mqtt_client import BASE, DEVICE, Client

REFUSED = "retained command refused"


def _start(tmp_path: Path, broker: Broker, name: str, extra: str = "") -> HeraldProcess:
    config = tmp_path / f"{name}.toml"
    config.write_text(mqtt_only_config(DEVICE, broker.port, extra))
    return start_herald(config, tmp_path / f"{name}.log", herald_env())


def _online(broker: Broker, herald: HeraldProcess) -> Client:
    """A client once this herald is online (its own 'online', after it subscribed)."""
    c = Client(broker.port, topics=(f"{BASE}/event", f"{BASE}/availability"))
    herald.wait_log("MQTT: connected to")
    c.wait(lambda ms: any(m.topic == f"{BASE}/availability" and m.payload == b"online"
                          and not m.retain for m in ms), 60, "herald online")
    return c


@pytest.mark.slow  # three herald runs, one after the other
def test_a_retained_say_sent_while_herald_was_away_is_not_spoken_and_reported_once(
        broker: Broker, tmp_path: Path) -> None:
    first = _start(tmp_path, broker, "first")
    try:
        _online(broker, first).close()  # its session (and subscriptions) now exist
        assert first.terminate() == 0
    finally:
        first.kill()
    sender = Client(broker.port, topics=(f"{BASE}/event",))
    say = json.dumps({"id": "while-away", "text": "Never.", "sinks": ["mqtt"]})
    sender.publish("say", say, qos=1, retain=True)
    sender.close()

    again = _start(tmp_path, broker, "again")
    fresh311: HeraldProcess | None = None
    try:
        c = _online(broker, again)
        try:
            assert "(resumed session)" in again.wait_log("MQTT: connected to")
            c.say(id="after", text="Only this.", sinks=["mqtt"])
            assert c.wait_event("after")["event"] == "finished"
            assert c.events("while-away") == [], "the retained say was executed"
            assert " while-away queued " not in again.output()
            assert again.output().count(REFUSED) == 1, again.tail()
        finally:
            c.close()
        assert again.terminate() == 0

        # MQTT 3.1.1, a new session: the broker's stored copy comes flagged, and is refused.
        fresh311 = _start(tmp_path, broker, "fresh311",
                          'protocol = "3.1.1"\nclient_id = "herald-311"')
        c = _online(broker, fresh311)
        try:
            c.say(id="after311", text="Only this.", sinks=["mqtt"])
            assert c.wait_event("after311")["event"] == "finished"
            assert c.events("while-away") == []
            assert fresh311.output().count(REFUSED) == 1, fresh311.tail()
        finally:
            c.close()
    finally:
        again.kill()
        if fresh311 is not None:
            fresh311.kill()
        cleaner = Client(broker.port, topics=(f"{BASE}/event",))
        cleaner.publish("say", b"", retain=True)
        cleaner.close()

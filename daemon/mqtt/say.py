"""``herald say --mqtt HOST[:PORT] TEXT``: ask a running herald to speak, wait for the outcome.

Publishes a QoS 1 ``say`` with a fresh id and follows that id on the ``event`` topic:
``queued`` proves a daemon is listening, ``finished`` / ``stopped`` / ``error`` end the wait.
MQTT 3.1.1, so it works with the embedded broker as well as with Mosquitto.
"""

from __future__ import annotations

import json
import queue
import sys
import time
from collections.abc import Mapping
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from ..jobs.request import new_id
from ..settings import Settings

ANSWER_TIMEOUT = 10.0  # seconds to hear `queued` from a daemon
CHARS_PER_SECOND = 5.0  # generous speaking budget beyond the answer


def split_host_port(value: str, default_port: int = 1883) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or "]" in port:
        return value, default_port
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise ValueError(f"--mqtt {value!r}: expected HOST or HOST:PORT") from None


def publish_say(host_port: str, settings: Settings, device_id: str | None, text: str,
                voice: str | None, timeout: float | None = None, text_format: str = "text",
                fields: Mapping[str, Any] | None = None) -> int:
    """0 when the daemon finished speaking; 1 on error/stop/timeout; 2 when unreachable.
    The topics come from ``settings`` (the daemon's configuration: ``mqtt.base_topic``,
    ``device_id``) as the daemon derives them; ``device_id`` names another daemon.
    ``fields``: more `say` JSON fields (speaker, rate, noise_scale, noise_w)."""
    try:
        host, port = split_host_port(host_port)
    except ValueError as e:
        print(f"herald say: {e}", file=sys.stderr)
        return 2
    topics = settings.topics(device_id)
    rid = new_id()
    events: queue.Queue[dict[str, Any]] = queue.Queue()
    subscribed = queue.Queue[bool]()

    def on_connect(client: mqtt.Client, userdata: Any, flags: Any, reason: Any,
                   properties: Any) -> None:
        if reason.is_failure:
            events.put({"event": "connect-failed", "error": str(reason)})
            return
        client.subscribe(topics.event, qos=1)

    def on_subscribe(client: mqtt.Client, userdata: Any, mid: int, reasons: Any,
                     properties: Any) -> None:
        subscribed.put(True)

    def on_message(client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            ev = json.loads(msg.payload)
        except ValueError:
            return
        if isinstance(ev, dict) and ev.get("id") == rid:
            events.put(ev)

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"herald-say-{rid}",
                         protocol=mqtt.MQTTv311)
    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    try:
        client.connect(host, port, keepalive=30)
    except OSError as e:
        print(f"herald say: cannot reach the MQTT broker at {host}:{port}: {e}", file=sys.stderr)
        return 2
    client.loop_start()
    try:
        try:
            subscribed.get(timeout=ANSWER_TIMEOUT)
        except queue.Empty:
            print(f"herald say: the broker at {host}:{port} did not answer", file=sys.stderr)
            return 2
        payload: dict[str, Any] = {"id": rid, "text": text, "ts": time.time()}
        if voice:
            payload["voice"] = voice
        if text_format != "text":
            payload["format"] = text_format
        payload.update(fields or {})
        client.publish(topics.say, json.dumps(payload), qos=1)
        deadline = time.monotonic() + ANSWER_TIMEOUT
        answered = False
        budget = timeout if timeout is not None else 30.0 + len(text) / CHARS_PER_SECOND
        while True:
            try:
                ev = events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                if not answered:
                    print(f"herald say: no herald answered on {topics.say} within "
                          f"{ANSWER_TIMEOUT:g} s: is it running, and is --device-id right?",
                          file=sys.stderr)
                else:
                    print(f"herald say: {rid} did not finish within {budget:.0f} s",
                          file=sys.stderr)
                return 1
            kind = ev.get("event")
            if kind == "connect-failed":
                print(f"herald say: the broker refused the connection: {ev.get('error')}",
                      file=sys.stderr)
                return 2
            if not answered:
                answered = True
                deadline = time.monotonic() + budget
            if kind == "finished":
                print(f"herald: {rid} finished")
                return 0
            if kind in ("stopped", "error"):
                detail = f": {ev['error']}" if ev.get("error") else ""
                print(f"herald: {rid} {kind}{detail}", file=sys.stderr)
                return 1
    finally:
        client.disconnect()
        client.loop_stop()

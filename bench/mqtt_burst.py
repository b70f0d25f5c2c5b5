"""Many MQTT clients arriving at once while messages flow: what dropped clients of amqtt
(daemon/mqtt/broker.py). Shared by tests/test_broker.py and bench/abuse.py.

A publisher streams numbered QoS 0 messages; meanwhile ``n`` clients connect together, half
new (clean session, each with a filter of its own besides the shared ones), half persistent
sessions coming back (the broker re-sends their retained messages while the others
subscribe). Each records whether the broker ever dropped it and what it got.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

FLOW = "flow"


@dataclass
class Peer:
    """One client of the burst: what it got and whether the broker ever dropped it."""

    client_id: str
    clean: bool
    topics: tuple[str, ...]  # filters it subscribes to (QoS 0), FLOW among them
    connects: int = 0
    drops: int = 0
    subscribed: threading.Event = field(default_factory=threading.Event)
    flow: list[int] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # topics it got anything on
    lock: threading.Lock = field(default_factory=threading.Lock)
    c: Any = None

    def start(self, port: int) -> None:
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                        protocol=mqtt.MQTTv311, clean_session=self.clean)
        c.reconnect_delay_set(1, 2)

        def on_connect(cl: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
            self.connects += 1
            cl.subscribe([(t, 0) for t in self.topics])

        def on_disconnect(cl: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
            if rc.is_failure:  # not our own disconnect at the end
                self.drops += 1

        def on_message(cl: Any, u: Any, m: mqtt.MQTTMessage) -> None:
            with self.lock:
                self.seen.add(m.topic)
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
            self.c = None

    def gaps(self, last: int) -> int:
        """Messages missing between the first it got and ``last``."""
        with self.lock:
            got = list(self.flow)
        if not got:
            return last + 1
        return (last - got[0] + 1) - len(set(got) & set(range(got[0], last + 1)))


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


@dataclass
class Burst:
    peers: list[Peer]
    last: int  # the flow's last number
    unacknowledged: list[str]  # clients whose subscription never got its SUBACK

    def dropped(self) -> list[Peer]:
        return [p for p in self.peers if p.drops or p.connects != 1]


def burst(port: int, n: int, shared: tuple[str, ...], during: Any = None,
          guard: float = 60.0) -> Burst:
    """Run the burst against the broker on ``port``; ``shared``: filters every client
    subscribes to besides FLOW and its own; ``during()`` runs once the flow has started.
    Returns when every client has the flow's last message or ``guard`` has passed; the
    clients are closed."""
    peers = [Peer(f"burst{i}", clean=i % 2 == 0, topics=(*shared, FLOW, f"own/{i}/#"))
             for i in range(n)]
    try:
        for p in peers:  # the persistent half has been here before
            if not p.clean:
                p.start(port)
        for p in peers:
            if not p.clean:
                p.subscribed.wait(guard / 3)
                p.close()
                p.subscribed.clear()
                p.connects = 0
        stop, sent = threading.Event(), list[int]()
        flow = threading.Thread(target=publish_flow, args=(port, stop, sent))
        flow.start()
        try:
            if during is not None:
                during()
            time.sleep(0.2)  # messages are flowing when the burst arrives
            for p in peers:
                p.start(port)
            deadline = time.monotonic() + guard
            for p in peers:
                p.subscribed.wait(max(0.1, deadline - time.monotonic()))
            time.sleep(0.5)
        finally:
            stop.set()
            flow.join(guard)
        last = sent[-1]
        deadline = time.monotonic() + guard  # amqtt catches up at its own pace
        while time.monotonic() < deadline and any(last not in p.flow[-1:] for p in peers):
            time.sleep(0.2)
        return Burst(peers, last, [p.client_id for p in peers if not p.subscribed.is_set()])
    finally:
        for p in peers:
            p.close()

"""The running fleet as the fleet benchmark (``bench.fleet``) drives it: the rig's
processes (``bench.fleet_rig``) seen through the benchmark's MQTT client
(``bench.fleet_probe``): which workers run, the satellites by name, requests and their ids,
and what each node reported about one of them."""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.engine import LONG, SHORT
from bench.fleet_probe import Probe
from bench.fleet_rig import FLEET, Node, Rig
from daemon.fleet.topics import FleetTopics
from daemon.mqtt.topics import Topics

TEXTS = {"short": SHORT, "long": LONG}
WAIT = 120.0  # seconds: hang guard for anything the fleet has to do
START_WAIT = 180.0  # seconds for 50 satellites and a worker to come up on a busy host
TOPICS = FleetTopics(FLEET, "bench")


def med(xs: list[float]) -> float | None:
    """The median to 0.1; None for no figures at all."""
    return round(statistics.median(xs), 1) if xs else None


def say_topic(device: str) -> str:
    return Topics(f"herald/{device}", device, "homeassistant").say


class Fleet:
    """The running fleet: the rig's processes, seen through the probe."""

    def __init__(self, rig: Rig, probe: Probe, levels: list[int]) -> None:
        self.rig, self.probe, self.levels = rig, probe, levels
        width = len(str(max(levels)))
        self.satellites = [f"sat{i:0{width}d}" for i in range(1, max(levels) + 1)]
        self.workers: list[str] = []
        self.worker_slots: dict[str, int] = {}  # as configured (0: herald's default)
        self.fresh: set[str] = set()  # workers that have not synthesized anything yet
        self.n = 0  # request ids
        self.failures: list[dict[str, Any]] = []  # requests a satellite did not play

    def rid(self, what: str) -> str:
        self.n += 1
        return f"{what}-{self.n}"

    def node(self, device: str) -> Node:
        return self.rig.nodes[device]

    def start_satellites(self) -> None:
        for i, sat in enumerate(self.satellites, 1):
            self.rig.start(sat, "satellite", [f"g{n}" for n in self.levels if n >= i])
        self.probe.wait(lambda: self.probe.online >= set(self.satellites), START_WAIT,
                        "every satellite online")

    def set_workers(self, count: int, slots: int = 0, wait: bool = True) -> None:
        """``count`` workers running, with ``slots`` (0: herald's default); workers with
        other slots are restarted, and those started are ``fresh`` until warmed up. With
        ``wait``, until every one takes jobs."""
        for w in list(self.workers):
            if len(self.workers) > count or self.worker_slots.get(w) != slots:
                self.rig.stop(w)
                self.workers.remove(w)
                def gone(w: str = w) -> bool:
                    return w not in self.probe.workers

                self.probe.wait(gone, WAIT, f"{w} gone")
        while len(self.workers) < count:
            name = next(f"w{i}" for i in range(1, 10) if f"w{i}" not in self.workers)
            self.rig.start(name, "worker", slots=slots)
            self.workers.append(name)
            self.fresh.add(name)
        self.worker_slots = {w: slots for w in self.workers}
        if wait:
            self.probe.wait(lambda: set(self.probe.workers) == set(self.workers), START_WAIT,
                            f"worker(s) {', '.join(self.workers)} taking jobs")

    def worker_record(self, rid: str) -> dict[str, Any]:
        """The latency record of the worker that synthesized ``rid``."""
        def found() -> dict[str, Any] | None:
            return next((r for w in self.workers if (r := self.probe.record(w, rid))), None)
        return self.probe.wait(found, WAIT, f"a worker's record of {rid}")  # type: ignore[no-any-return]

    def failed(self, rid: str, devices: list[str], records: dict[str, dict[str, Any]]
               ) -> None:
        """Satellites whose request ``rid`` did not end well: noted, with their log's
        warnings about it, and left out of the figures."""
        for d in devices:
            self.failures.append({"id": rid, "device": d, "outcome": records[d]["outcome"],
                                  "log": self.node(d).trouble(rid)[:3]})

    def queued_at(self, device: str, rid: str) -> float:
        node = self.node(device)
        return self.probe.wait(lambda: node.queued_at(rid), 10.0,  # type: ignore[no-any-return]
                               f"{device}'s log line for {rid}")

    def say_at_once(self, sats: list[str], text: str, kind: str, follow: str
                    ) -> tuple[float, dict[str, str], dict[str, dict[str, Any]]]:
        """Each of ``sats`` is asked to say ``text`` on its own topic, one publish after the
        other, while the probe follows ``follow``; when the first went out, each one's
        request id and, once all have ended, each one's latency record."""
        rids = {s: self.rid(kind) for s in sats}
        self.probe.follow(follow, True)
        try:
            t0 = time.time()
            for s in sats:
                self.probe.publish(say_topic(s), {"id": rids[s], "text": text})
            records = {s: self.records([s], rids[s])[s] for s in sats}
            if follow == "events":  # a request's event comes after its record
                ended = {rids[s] for s in sats if records[s]["outcome"] != "ok"}
                self.probe.wait(lambda: ended <= {e.get("id") for _, e, _ in self.probe.events
                                                  if e.get("event") in ("error", "stopped")},
                                10.0, "the events of the requests that failed")
            return t0, rids, records
        finally:
            self.probe.follow(follow, False)

    def records(self, devices: list[str], rid: str) -> dict[str, dict[str, Any]]:
        self.probe.wait(lambda: all(self.probe.record(d, rid) for d in devices), WAIT,
                        f"{rid}'s latency records from {len(devices)} satellite(s)")
        return {d: self.probe.record(d, rid) for d in devices}  # type: ignore[misc]

"""The fleet benchmark's job latency and fan-out (``bench.fleet`` says what each figure
is): group announcements and a satellite's own ``say``, timed from what each satellite
reports, and what Mosquitto, the workers and each member spent per announcement."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.engine import COOL_DOWN, SHORT
from bench.fleet_home import TEXTS, TOPICS, WAIT, Fleet, med, say_topic
from bench.fleet_probe import Counters, Received
from bench.fleet_rig import cpu_seconds

IDLE_SECONDS = 3.0  # the broker's own idle cost is measured over this long


def announcement(fl: Fleet, n: int, text: str) -> dict[str, Any]:
    """One group announcement to the n members of level n."""
    rid, members = fl.rid("g"), fl.satellites[:n]
    t0 = fl.probe.publish(TOPICS.group_say(f"g{n}"), {"id": rid, "text": text})
    records = fl.records(members, rid)
    start = fl.probe.wait(lambda: fl.probe.starts.get(rid), WAIT, f"{rid}'s start")[0]
    chunk_ms = start["chunk_samples"] / start["rate"] * 1000
    played = [d for d in members if records[d]["outcome"] == "ok"]
    fl.failed(rid, [d for d in members if d not in played], records)
    first = [(fl.queued_at(d, rid) - t0) * 1000 for d in played]
    skews = [records[d]["start_skew_ms"] for d in played]
    play = [(start["play_at"] + s / 1000 - t0) * 1000 for s in skews]
    worker = fl.worker_record(rid)
    return {"first": first, "play": play, "skews": skews, "failed": len(members) - len(played),
            "probe": (fl.probe.first_chunk[rid] - t0) * 1000,
            "worker_first": worker["first_audio_ms"], "worker_rtf": worker["rtf"],
            "audio_ms": worker["audio_ms"], "chunks": -(-worker["audio_ms"] // chunk_ms)}


def own_say(fl: Fleet, text: str) -> dict[str, Any]:
    """One satellite's own say (the first satellite's)."""
    rid, sat = fl.rid("o"), fl.satellites[0]
    t0 = fl.probe.publish(say_topic(sat), {"id": rid, "text": text})
    rec = fl.records([sat], rid)[sat]
    ok = rec["outcome"] == "ok"
    if not ok:
        fl.failed(rid, [sat], {sat: rec})
    first = [(fl.queued_at(sat, rid) - t0) * 1000 + rec["first_audio_ms"]] if ok else []
    worker = fl.worker_record(rid)
    return {"first": first, "play": first, "skews": [], "failed": int(not ok),
            "probe": (fl.probe.first_chunk[rid] - t0) * 1000,
            "worker_first": worker["first_audio_ms"], "worker_rtf": worker["rtf"],
            "audio_ms": worker["audio_ms"]}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of each round's median and slowest satellite."""
    failed = sum(r["failed"] for r in rounds)
    rounds = [r for r in rounds if r["first"]] or rounds[:0]
    spread = [max(r["skews"]) - min(r["skews"]) for r in rounds if r["skews"]]
    return {
        "probe_first_chunk_ms": med([r["probe"] for r in rounds]),
        "satellite_first_ms": med([statistics.median(r["first"]) for r in rounds]),
        "satellite_first_slowest_ms": med([max(r["first"]) for r in rounds]),
        "playback_ms": med([statistics.median(r["play"]) for r in rounds]),
        "playback_slowest_ms": med([max(r["play"]) for r in rounds]),
        "start_skew_ms": med([statistics.median(r["skews"]) for r in rounds if r["skews"]]),
        "start_skew_spread_ms": med(spread),
        "worker_first_ms": med([r["worker_first"] for r in rounds]),
        "worker_rtf": round(statistics.median(r["worker_rtf"] for r in rounds), 3)
        if rounds else None,
        "audio_ms": med([r["audio_ms"] for r in rounds]),
        "failed": failed,  # satellites that did not play it, over the rounds
    }


@contextmanager
def fanout_cost(fl: Fleet, idle: dict[str, float], out: dict[str, Any], members: list[str],
                count: int) -> Iterator[None]:
    """What the block cost, per announcement (``count``): Mosquitto's CPU time and what it
    delivered, without this benchmark's own subscription and without its idle cost
    (``idle``: per second); the workers' CPU time, and each member's (``members``)."""
    nodes = [*fl.workers, *members]
    c0, r0 = fl.probe.snapshot()
    cpu0, ticks0 = fl.rig.broker_cpu()
    nodes0 = {d: cpu_seconds(fl.node(d).proc.pid)[1] for d in nodes}
    yield
    time.sleep(0.3)  # the last states and statuses are on their way
    c1, r1 = fl.probe.snapshot()
    cpu1, ticks1 = fl.rig.broker_cpu()
    spent = {d: (cpu_seconds(fl.node(d).proc.pid)[1] - nodes0[d]) * 1000 / count
             for d in nodes}
    seconds = c1.at - c0.at
    delivered = delivery(c0, c1, r0, r1)
    out |= {
        "broker_cpu_ms": round((cpu1 - cpu0 - idle["cpu"] * seconds) * 1000 / count, 2),
        "broker_cpu_stat_ms": round((ticks1 - ticks0) * 1000 / count, 1),
        "messages": round((delivered["messages"] - idle["messages"] * seconds) / count, 1),
        "payload_kb": round((delivered["payload_bytes"] - idle["payload_bytes"] * seconds)
                            / count / 1000, 1),
        "kb": round((delivered["bytes"] - idle["bytes"] * seconds) / count / 1000, 1),
        "worker_cpu_ms": round(sum(spent[w] for w in fl.workers), 1),
        "satellite_cpu_ms": med([spent[m] for m in members]),
        "satellite_cpu_max_ms": round(max(spent[m] for m in members), 1),
    }


def delivery(c0: Counters, c1: Counters, r0: Received, r1: Received) -> dict[str, int]:
    """What the broker delivered between two snapshots to everyone but this benchmark."""
    return {k: getattr(c1, k) - getattr(c0, k) - (getattr(r1, k) - getattr(r0, k))
            for k in ("messages", "payload_bytes", "bytes")}


def idle_cost(fl: Fleet) -> dict[str, float]:
    """The broker's CPU seconds and deliveries per second while nobody asks anything."""
    c0, r0 = fl.probe.snapshot()
    cpu0, _ = fl.rig.broker_cpu()
    time.sleep(IDLE_SECONDS)
    c1, r1 = fl.probe.snapshot()
    cpu1, _ = fl.rig.broker_cpu()
    seconds = c1.at - c0.at
    return {"cpu": (cpu1 - cpu0) / seconds} | {
        k: v / seconds for k, v in delivery(c0, c1, r0, r1).items()}


def latency_level(fl: Fleet, n: int, repeats: int, idle: dict[str, float]
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, fanout = [], []
    announcement(fl, n, SHORT)  # the group's first use
    for label, text in TEXTS.items():
        rounds: list[dict[str, Any]] = []
        cost: dict[str, Any] = {"workers": len(fl.workers), "satellites": n, "text": label}
        with fanout_cost(fl, idle, cost, fl.satellites[:n], repeats):
            for _ in range(repeats):
                time.sleep(COOL_DOWN)
                rounds.append(announcement(fl, n, text))
        cost["audio_chunks"] = statistics.median(r["chunks"] for r in rounds)
        fanout.append(cost)
        rows.append({"workers": len(fl.workers), "satellites": n, "kind": "group",
                     "text": label, **summary(rounds)})
        own = []
        for _ in range(repeats):
            time.sleep(COOL_DOWN)
            own.append(own_say(fl, text))
        rows.append({"workers": len(fl.workers), "satellites": n, "kind": "own",
                     "text": label, **summary(own)})
    return rows, fanout

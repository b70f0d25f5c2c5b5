"""Fleet benchmark: workers and satellites (issue 19) on one Mosquitto, on loopback.

Starts Mosquitto (MQTT 5), workers (``node.role = "worker"``, one torch thread each: one
worker is one core) and lightweight satellites (``node.role = "satellite"``: no model, no
HTTP, no Wyoming, the speaker on ALSA's ``null`` device), each a ``herald run`` of its own.
Satellite i is a member of the group of every level at or above i (with levels 1 10 50:
sat01 is in g1, g10 and g50; sat11 only in g50), so one set of processes serves every level.
Then, for 1 and 2 workers:

* **job latency**, the short command and the long sentence of ``bench.engine``: a group
  announcement (``F/group/<g>/say``) to the n satellites of a level, and one satellite's own
  ``say``. Times from the publish, taken from what each satellite reports itself:
  - *audio at the satellite*: for an announcement, when its scheduler took the stream in,
    i.e. when its ``start`` came, which the worker sends together with chunk 0 (its log's
    ``queued from fleet`` line, to the millisecond); for its own ``say``, when its first
    audio reached the speaker (its log's ``queued from mqtt`` line plus its latency record's
    ``first_audio_ms``);
  - *playback start*: for an announcement, ``play_at`` (the stream's ``start``) plus the
    member's ``start_skew_ms`` (its latency record, the device's own estimate); for an own
    ``say``, the same as its first audio (it plays as soon as audio comes);
  - beside them, chunk 0 at this benchmark's own subscription (one more subscriber of the
    stream) and the worker's latency record (job received -> first chunk sent; rtf);
* **the broker's fan-out**: Mosquitto's CPU time (``/proc/<pid>/schedstat``, to the
  nanosecond; ``/proc/<pid>/stat`` agrees at its 10 ms resolution) and what it delivered
  (its ``$SYS`` counters) per announcement, without this benchmark's own subscription and
  without what it does while idle; beside it, the CPU time (``/proc/<pid>/stat``) the
  workers and each member spent on it (all on one host here: the members' time is taken
  from the workers' cores);
* **jobs per second**: k satellites each send the short command at once; jobs done per
  second (until the last worker's latency record), the first audio at each satellite, jobs
  refused (the workers' ``fleet.slots`` as configured, herald's default unless ``--slots``);
* **concurrent streams**: N satellites each ask for the long sentence at once; a chunk that
  comes after the audio before it ran out is a gap (timed at this benchmark's subscription
  to the satellites' audio: the null device takes audio as fast as it comes, so the
  satellites' own underrun counts do not say whether the stream was in time). Each stream
  is played twice over on paper: from its first chunk (as a satellite plays its own
  ``say``), and from ``--buffer-ms`` after it (as a group announcement is played,
  ``fleet.sync_delay`` after its first chunk), which a momentary delay does not break but a
  worker that falls behind does. The workers run with ``fleet.slots`` = the largest N, so
  no stream is refused; but a worker's engine holds a new stream back while the ones
  playing need its time (README, "How streaming works"): such a stream has no gap, it
  starts late. A count of streams is kept in real time when, in the median round, every
  stream's first chunk came within ``--start-ms`` and, played the second way, none has a
  gap over ``--gap-ms``.

Medians over ``--repeats``; the host's load average before and after (a shared host's
figures move with it). ``--json`` prints one object.

    .venv/bin/python -m bench.fleet [--workers 1 2] [--satellites 1 10 50] [--repeats 5]
        [--bursts 1 5 10 25 50] [--streams 1 2 3 4 6 8 10 12] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.engine import COOL_DOWN, LONG, SHORT
from bench.fleet_probe import Counters, Probe, Received
from bench.fleet_report import print_report
from bench.fleet_rig import FLEET, Node, Rig, cpu_seconds
from bench.listening import played
from daemon.fleet.topics import FleetTopics
from daemon.topics import Topics

TEXTS = {"short": SHORT, "long": LONG}
WAIT = 120.0  # seconds: hang guard for anything the fleet has to do
START_WAIT = 180.0  # seconds for 50 satellites and a worker to come up on a busy host
IDLE_SECONDS = 3.0  # the broker's own idle cost is measured over this long
TOPICS = FleetTopics(FLEET, "bench")


def med(xs: list[float]) -> float | None:
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
        self.n = 0  # request ids

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

    def set_workers(self, count: int, slots: int = 0) -> None:
        """``count`` workers running, with ``slots`` (0: herald's default); workers with
        other slots are restarted."""
        for w in list(self.workers):
            if len(self.workers) > count or self.worker_slots.get(w) != slots:
                self.rig.stop(w)
                self.workers.remove(w)
                self.probe.wait(lambda w=w: w not in self.probe.workers, WAIT, f"{w} gone")
        while len(self.workers) < count:
            name = next(f"w{i}" for i in range(1, 10) if f"w{i}" not in self.workers)
            self.rig.start(name, "worker", slots=slots)
            self.workers.append(name)
        self.worker_slots = {w: slots for w in self.workers}
        self.probe.wait(lambda: set(self.probe.workers) == set(self.workers), START_WAIT,
                        f"worker(s) {', '.join(self.workers)} taking jobs")

    def worker_record(self, rid: str) -> dict[str, Any]:
        """The latency record of the worker that synthesized ``rid``."""
        def found() -> dict[str, Any] | None:
            return next((r for w in self.workers if (r := self.probe.record(w, rid))), None)
        return self.probe.wait(found, WAIT, f"a worker's record of {rid}")  # type: ignore[no-any-return]

    def queued_at(self, device: str, rid: str) -> float:
        node = self.node(device)
        return self.probe.wait(lambda: node.queued_at(rid), 10.0,  # type: ignore[no-any-return]
                               f"{device}'s log line for {rid}")

    def records(self, devices: list[str], rid: str) -> dict[str, dict[str, Any]]:
        self.probe.wait(lambda: all(self.probe.record(d, rid) for d in devices), WAIT,
                        f"{rid}'s latency records from {len(devices)} satellite(s)")
        return {d: self.probe.record(d, rid) for d in devices}  # type: ignore[misc]


# --------------------------------------------------------------------------- job latency


def announcement(fl: Fleet, n: int, text: str) -> dict[str, Any]:
    """One group announcement to the n members of level n."""
    rid, members = fl.rid("g"), fl.satellites[:n]
    t0 = fl.probe.publish(TOPICS.group_say(f"g{n}"), {"id": rid, "text": text})
    records = fl.records(members, rid)
    start = fl.probe.wait(lambda: fl.probe.starts.get(rid), WAIT, f"{rid}'s start")[0]
    chunk_ms = start["chunk_samples"] / start["rate"] * 1000
    bad = {d: r["outcome"] for d, r in records.items() if r["outcome"] != "ok"}
    if bad:
        raise SystemExit(f"announcement {rid} did not play everywhere: {bad}")
    first = [(fl.queued_at(d, rid) - t0) * 1000 for d in members]
    skews = [r["start_skew_ms"] for r in records.values()]
    play = [(start["play_at"] + s / 1000 - t0) * 1000 for s in skews]
    worker = fl.worker_record(rid)
    return {"first": first, "play": play, "skews": skews,
            "probe": (fl.probe.first_chunk[rid] - t0) * 1000,
            "worker_first": worker["first_audio_ms"], "worker_rtf": worker["rtf"],
            "audio_ms": worker["audio_ms"], "chunks": -(-worker["audio_ms"] // chunk_ms)}


def own_say(fl: Fleet, text: str) -> dict[str, Any]:
    """One satellite's own say (the first satellite's)."""
    rid, sat = fl.rid("o"), fl.satellites[0]
    t0 = fl.probe.publish(say_topic(sat), {"id": rid, "text": text})
    rec = fl.records([sat], rid)[sat]
    if rec["outcome"] != "ok":
        raise SystemExit(f"{sat}'s say {rid} ended {rec['outcome']}")
    first = (fl.queued_at(sat, rid) - t0) * 1000 + rec["first_audio_ms"]
    worker = fl.worker_record(rid)
    return {"first": [first], "play": [first], "skews": [],
            "probe": (fl.probe.first_chunk[rid] - t0) * 1000,
            "worker_first": worker["first_audio_ms"], "worker_rtf": worker["rtf"],
            "audio_ms": worker["audio_ms"]}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of each round's median and slowest satellite."""
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
        "worker_rtf": round(statistics.median(r["worker_rtf"] for r in rounds), 3),
        "audio_ms": med([r["audio_ms"] for r in rounds]),
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


# --------------------------------------------------------------------------- jobs per second


def burst(fl: Fleet, k: int) -> dict[str, Any]:
    """k satellites send the short command at the same moment."""
    sats = fl.satellites[:k]
    rids = {s: fl.rid("b") for s in sats}
    fl.probe.follow("events", True)
    try:
        t0 = time.time()
        for s in sats:
            fl.probe.publish(say_topic(s), {"id": rids[s], "text": SHORT})
        records = {s: fl.records([s], rids[s])[s] for s in sats}
    finally:
        fl.probe.follow("events", False)
    ok = [s for s in sats if records[s]["outcome"] == "ok"]
    with fl.probe.cond:
        errors = [e for d, e, _ in fl.probe.events
                  if e.get("event") == "error" and e.get("id") in rids.values()]
    first = [(fl.queued_at(s, rids[s]) - t0) * 1000 + records[s]["first_audio_ms"]
             for s in ok]
    worker = [fl.worker_record(rids[s]) for s in ok]
    with fl.probe.cond:  # when each worker's record came: the job was done there
        done = [t for (w, r), (_, t) in fl.probe.latency.items()
                if w in fl.workers and r in {rids[s] for s in ok}]
    makespan = max(done) - t0 if done else float("nan")
    return {"workers": len(fl.workers), "k": k, "ok": len(ok),
            "refused": sorted({e.get("code", "?") for e in errors}), "failed": k - len(ok),
            "seconds": round(makespan, 2), "jobs_per_s": round(len(ok) / makespan, 2),
            "first_ms": med(first), "first_slowest_ms": round(max(first), 1) if first else None,
            "worker_queue_ms": med([w["queue_ms"] for w in worker]),
            "worker_rtf": round(statistics.median(w["rtf"] for w in worker), 3)
            if worker else None,
            "errors": sorted({e.get("error", "") for e in errors})[:2]}


# --------------------------------------------------------------------------- streams


def streams_round(fl: Fleet, n: int, buffer: float) -> dict[str, Any]:
    """n satellites ask for the long sentence at once; each stream played in real time from
    its first chunk, and from ``buffer`` seconds after it."""
    sats = fl.satellites[:n]
    rids = {s: fl.rid("s") for s in sats}
    fl.probe.follow("device_audio", True)
    try:
        t0 = time.time()
        for s in sats:
            fl.probe.publish(say_topic(s), {"id": rids[s], "text": LONG})
        records = {s: fl.records([s], rids[s])[s] for s in sats}
    finally:
        fl.probe.follow("device_audio", False)
    first, gaps, buffered, rtf = [], [], [], []
    for s in sats:
        rid = rids[s]
        if records[s]["outcome"] != "ok":
            raise SystemExit(f"stream {rid} to {s} ended {records[s]['outcome']}")
        rate = fl.probe.starts[rid][0]["rate"]
        with fl.probe.cond:
            arrived = sorted(fl.probe.chunks.pop(rid), key=lambda c: c[1])
        if [seq for _, seq, _ in arrived] != list(range(len(arrived))):
            raise SystemExit(f"stream {rid}: chunks missing at the benchmark's subscription")
        chunks = [(t - t0, size / 2 / rate) for t, _, size in arrived]
        at, gap = played(chunks)
        first.append(at * 1000)
        gaps.append(gap * 1000)
        # the same, its first chunk played after ``buffer`` seconds of silence
        buffered.append(played([(at, buffer), *chunks])[1] * 1000)
        rtf.append(fl.worker_record(rid)["rtf"])
    return {"first": first, "gaps": gaps, "buffered": buffered, "rtf": rtf}


def streams_level(fl: Fleet, n: int, a: argparse.Namespace) -> dict[str, Any]:
    results = []
    for _ in range(a.stream_rounds):
        time.sleep(max(1.0, COOL_DOWN))
        results.append(streams_round(fl, n, a.buffer_ms / 1000))
    worst = [max(r["gaps"]) for r in results]
    worst_buffered = [max(r["buffered"]) for r in results]
    slowest = [max(r["first"]) for r in results]
    return {"workers": len(fl.workers), "streams": n,
            "worst_gap_ms": med(worst),
            "streams_with_gaps": statistics.median(
                sum(g > a.gap_ms for g in r["gaps"]) for r in results),
            "worst_gap_buffered_ms": med(worst_buffered),
            "slowest_first_ms": med(slowest),
            "started_in_time": statistics.median(
                sum(f <= a.start_ms for f in r["first"]) for r in results),
            "worker_rtf": round(statistics.median(x for r in results for x in r["rtf"]), 3),
            "worker_rtf_max": round(max(x for r in results for x in r["rtf"]), 3),
            "real_time": (statistics.median(worst_buffered) <= a.gap_ms
                          and statistics.median(slowest) <= a.start_ms),
            "last_round_gaps_ms": [round(g) for g in results[-1]["gaps"]]}


# --------------------------------------------------------------------------- the run


def memory(fl: Fleet) -> dict[str, Any]:
    """Each satellite's and worker's memory now, in MiB: medians and the largest."""
    out: dict[str, Any] = {}
    for role, names in (("satellite", fl.satellites), ("worker", fl.workers)):
        readings = [fl.node(d).memory_kb() for d in names]
        out[role] = {k: {"median": round(statistics.median(r[k] for r in readings) / 1024, 1),
                         "max": round(max(r[k] for r in readings) / 1024, 1)}
                     for k in ("rss", "hwm", "pss") if all(k in r for r in readings)}
    return out


def note(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run(a: argparse.Namespace) -> dict[str, Any]:
    levels = sorted(set(a.satellites))
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in os.getloadavg()], "repeats": a.repeats,
        "workers": a.workers, "satellites": levels, "buffer_ms": a.buffer_ms,
        "gap_ms": a.gap_ms, "start_ms": a.start_ms, "latency": [], "fanout": [],
        "bursts": [], "streams": []}
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="herald-fleet-bench-"))
    rig = Rig(work)
    probe = Probe(rig.port)
    fl = Fleet(rig, probe, levels)
    try:
        note(f"starting {max(levels)} satellite(s) and a worker (logs in {work})")
        rig.start("w1", "worker", slots=a.slots)
        fl.workers, fl.worker_slots = ["w1"], {"w1": a.slots}
        fl.start_satellites()
        fl.set_workers(1, a.slots)
        result["memory_idle"] = memory(fl)
        result["broker_idle"] = {k: round(v, 4) for k, v in idle_cost(fl).items()}
        for w in sorted(a.workers):
            fl.set_workers(w, a.slots)
            announcement(fl, levels[-1], SHORT)  # every worker's first job
            announcement(fl, levels[-1], SHORT)
            for n in levels:
                note(f"{w} worker(s), {n} satellite(s): job latency and fan-out")
                rows, fanout = latency_level(fl, n, a.repeats, result["broker_idle"])
                result["latency"] += rows
                result["fanout"] += fanout
                rig.check_running()
            for k in sorted(x for x in a.bursts if x <= max(levels)):
                note(f"{w} worker(s): {k} short commands at once")
                time.sleep(1.0)
                result["bursts"].append(burst(fl, k))
        counts = sorted(x for x in a.streams if x <= max(levels))
        result["real_time_streams"] = {}
        # Every stream is taken: the workers hold as many jobs as the most streams tried.
        have = min(p.get("slots", 0) for p in probe.workers.values())
        slots = max(counts) if counts and max(counts) > have else a.slots
        for w in sorted(a.workers) if counts else []:
            fl.set_workers(w, slots)
            kept = 0
            for n in counts:
                note(f"{w} worker(s): {n} concurrent stream(s) of the long sentence")
                row = streams_level(fl, n, a)
                result["streams"].append(row)
                if not row["real_time"]:
                    break
                kept = n
            result["real_time_streams"][str(w)] = kept
        result["memory_end"] = memory(fl)
        result["worker_slots"] = {w: p.get("slots") for w, p in probe.workers.items()}
    finally:
        probe.close()
        rig.close()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result["seconds"] = round(time.monotonic() - began)
    return result


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                    help="worker counts to measure, each one core (default: 1 2)")
    ap.add_argument("--satellites", type=int, nargs="+", default=[1, 10, 50],
                    help="satellite counts (group sizes) to measure (default: 1 10 50)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="announcements and says per text and level (default: 5)")
    ap.add_argument("--bursts", type=int, nargs="*", default=[1, 5, 10, 25, 50],
                    help="short commands sent at once, by that many satellites (at most "
                         "the largest --satellites; none: skip)")
    ap.add_argument("--streams", type=int, nargs="*", default=[1, 2, 3, 4, 6, 8, 10, 12],
                    help="concurrent streams of the long sentence, tried in order until "
                         "one count is not kept in real time (none: skip)")
    ap.add_argument("--stream-rounds", type=int, default=2,
                    help="rounds per stream count; the median round counts (default: 2)")
    ap.add_argument("--buffer-ms", type=float, default=400.0,
                    help="the jitter buffer a stream is played with when counting streams "
                         "kept in real time (default: 400, fleet.sync_delay's default)")
    ap.add_argument("--start-ms", type=float, default=1000.0,
                    help="a stream whose first chunk comes later than this was held back "
                         "by the worker, not served alongside the others (default: 1000)")
    ap.add_argument("--gap-ms", type=float, default=10.0,
                    help="gaps up to this long are this benchmark's own timing noise, not "
                         "the stream's (default: 10)")
    ap.add_argument("--slots", type=int, default=0,
                    help="the workers' fleet.slots for latency and bursts (default 0: "
                         "herald's default, twice the engine's workers)")
    ap.add_argument("--keep", action="store_true", help="keep the logs and configs")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def main() -> int:
    ap = parser()
    a = ap.parse_args()
    if any(n < 1 for n in a.satellites) or any(w not in (1, 2, 3, 4) for w in a.workers):
        ap.error("--satellites must be >= 1, --workers between 1 and 4")
    result = run(a)
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        print_report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the fleet's workers serve (``bench.fleet`` says how it is measured): short
commands from many satellites at once (jobs per second, refusals) and concurrent streams of
the long sentence (whether each comes in time)."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.engine import COOL_DOWN, LONG, SHORT
from bench.fleet_home import Fleet, med
from bench.listening import played

# --------------------------------------------------------------------------- jobs per second


def burst(fl: Fleet, k: int) -> dict[str, Any]:
    """k satellites send the short command at the same moment."""
    sats = fl.satellites[:k]
    t0, rids, records = fl.say_at_once(sats, SHORT, "b", "events")
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
    t0, rids, records = fl.say_at_once(sats, LONG, "s", "device_audio")
    first, gaps, buffered, rtf = [], [], [], []
    failed = 0
    for s in sats:
        rid = rids[s]
        if records[s]["outcome"] != "ok":  # a stream not kept in real time, noted
            fl.failed(rid, [s], records)
            failed += 1
            continue
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
    return {"first": first, "gaps": gaps, "buffered": buffered, "rtf": rtf, "failed": failed}


def streams_level(fl: Fleet, n: int, a: argparse.Namespace) -> dict[str, Any]:
    results = []
    for _ in range(a.stream_rounds):
        time.sleep(max(1.0, COOL_DOWN))
        results.append(streams_round(fl, n, a.buffer_ms / 1000))
    played = [r for r in results if r["first"]]  # a round where no stream played has none
    worst = [max(r["gaps"]) for r in played]
    worst_buffered = [max(r["buffered"]) for r in played]
    slowest = [max(r["first"]) for r in played]
    rtf = [x for r in played for x in r["rtf"]]
    failed = statistics.median(r["failed"] for r in results)
    return {"workers": len(fl.workers), "streams": n, "failed": failed,
            "worst_gap_ms": med(worst),
            "streams_with_gaps": statistics.median(
                sum(g > a.gap_ms for g in r["gaps"]) for r in results),
            "worst_gap_buffered_ms": med(worst_buffered),
            "slowest_first_ms": med(slowest),
            "started_in_time": statistics.median(
                sum(f <= a.start_ms for f in r["first"]) for r in results),
            "worker_rtf": round(statistics.median(rtf), 3) if rtf else None,
            "worker_rtf_max": round(max(rtf), 3) if rtf else None,
            "real_time": bool(played) and not failed
                         and statistics.median(worst_buffered) <= a.gap_ms
                         and statistics.median(slowest) <= a.start_ms,
            "last_round_gaps_ms": [round(g) for g in results[-1]["gaps"]]}

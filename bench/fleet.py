"""Fleet benchmark: workers and satellites (``node.role``) on one Mosquitto, on loopback.

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
  second (until the last worker's latency record) and the first audio at each satellite, as
  the jobs beyond the workers' ``fleet.slots`` (herald's default unless ``--slots``) wait at
  their owners for room; any that fail, with their error's code;
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

Medians over ``--repeats``; the host's load average before, as each phase begins, and after
(a shared host's figures move with it). ``--json`` prints one object. A full run takes about
ten minutes on a 2-core host (starting 50 satellites is a minute or two of it); fewer
``--satellites``, ``--repeats``, ``--bursts`` and ``--streams`` shrink it (the smoke test,
tests/test_fleet_bench.py, runs one worker, two satellites and one round of each in ~30 s).

    .venv/bin/python -m bench.fleet [--workers 1 2] [--satellites 1 10 50] [--repeats 5]
        [--bursts 1 5 10 25] [--streams 1 2 3 4 6 8 10 12] [--json]
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
from pathlib import Path
from typing import Any

from bench.engine import LONG, SHORT
from bench.fleet_capacity import burst, streams_level
from bench.fleet_home import Fleet
from bench.fleet_latency import idle_cost, latency_level
from bench.fleet_probe import Probe
from bench.fleet_report import print_report
from bench.fleet_rig import Rig

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


def warm_up(fl: Fleet) -> None:
    """The first short and long job of the workers just started, not measured (a worker's
    first synthesis of a length runs cold): as many satellites as workers at once, so that
    the share group gives each worker one."""
    if not fl.fresh:
        return
    fl.fresh.clear()
    for text in (SHORT, LONG):
        fl.say_at_once(fl.satellites[:len(fl.workers)], text, "warm", "events")


def note(result: dict[str, Any], text: str) -> None:
    """Progress on stderr, and the host's load average as each phase begins (the 50
    satellites starting raise it themselves)."""
    load = round(os.getloadavg()[0], 2)
    result["load_during"].append([time.strftime("%H:%M:%S"), text, load])
    print(f"[{time.strftime('%H:%M:%S')}] (load {load:.2f}) {text}", file=sys.stderr,
          flush=True)


def run(a: argparse.Namespace) -> dict[str, Any]:
    levels = sorted(set(a.satellites))
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in os.getloadavg()], "repeats": a.repeats,
        "workers": a.workers, "satellites": levels, "buffer_ms": a.buffer_ms,
        "gap_ms": a.gap_ms, "start_ms": a.start_ms, "latency": [], "fanout": [],
        "bursts": [], "streams": [], "load_during": []}
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="herald-fleet-bench-"))
    rig = Rig(work)
    probe = Probe(rig.port)
    fl = Fleet(rig, probe, levels)
    failed = True
    try:
        note(result, f"starting {max(levels)} satellite(s) and a worker (logs in {work})")
        fl.set_workers(1, a.slots, wait=False)  # it loads its voice while they start
        fl.start_satellites()
        fl.set_workers(1, a.slots)
        result["memory_idle"] = memory(fl)
        result["broker_idle"] = {k: round(v, 4) for k, v in idle_cost(fl).items()}
        for w in sorted(a.workers):
            fl.set_workers(w, a.slots)
            warm_up(fl)
            for n in levels:
                note(result, f"{w} worker(s), {n} satellite(s): job latency and fan-out")
                rows, fanout = latency_level(fl, n, a.repeats, result["broker_idle"])
                result["latency"] += rows
                result["fanout"] += fanout
                rig.check_running()
            for k in sorted(x for x in a.bursts if x <= max(levels)):
                note(result, f"{w} worker(s): {k} short commands at once")
                time.sleep(1.0)
                result["bursts"].append(burst(fl, k))
        counts = sorted(x for x in a.streams if x <= max(levels))
        result["real_time_streams"] = {}
        # Every stream is taken: the workers hold as many jobs as the most streams tried.
        have = min(p.get("slots", 0) for p in probe.workers.values())
        slots = max(counts) if counts and max(counts) > have else a.slots
        for w in sorted(a.workers) if counts else []:
            fl.set_workers(w, slots)
            warm_up(fl)
            kept = 0
            for n in counts:
                note(result, f"{w} worker(s): {n} concurrent stream(s) of the long sentence")
                row = streams_level(fl, n, a)
                result["streams"].append(row)
                if not row["real_time"]:
                    break
                kept = n
            result["real_time_streams"][str(w)] = kept
        result["memory_end"] = memory(fl)
        result["worker_slots"] = {w: p.get("slots") for w, p in probe.workers.items()}
        failed = False
    finally:
        result["failures"] = fl.failures
        probe.close()
        rig.close()
        if failed or fl.failures or a.keep:
            print(f"the nodes' logs and configs are in {work}", file=sys.stderr)
        else:
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
    ap.add_argument("--bursts", type=int, nargs="*", default=[1, 5, 10, 25],
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

"""Load benchmark: herald against the references with 0, 1 and 2 competing busy processes.

A home server is never idle, so this measures what ``herald bench`` and the Wyoming
benchmark measure, each side by side with its reference in the same run, while other
processes keep cores busy (``while time() < end: pass``, each bounded in time, killed at
the end of its level):

* engine: herald's default configuration against piper-tts's (``PiperVoice.load``'s
  onnxruntime session options), both in one process, alternating run by run
  (``bench.engine``'s timing);
* Wyoming: herald's Wyoming server on its defaults against wyoming-piper, through the same
  client as ``bench.wyoming_bench``, one ``synthesize`` per request, servers alternating; the
  paragraph too, whose next sentences herald hands to its helpers while one plays.

Figures are medians; first audio, total time and real-time factor for the short command and
the long sentence. Read the ratios herald / reference of each level. For Wyoming, also what a
listener playing each stream from its first chunk would hear: in how many runs a chunk came
after the audio before it had run out, and the longest such silence. herald streams within a
sentence, so its chunks must keep ahead of playback on a busy machine as on an idle one;
wyoming-piper sends a sentence's audio only once it is whole.

    .venv/bin/python -m bench.load [--busy 0 1 2] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.engine import COOL_DOWN, LONG, SHORT
from bench.machine import describe
from bench.wyoming_bench import CASES, SERVERS, Sample, request, start_servers, wait_ready

TEXTS = {"short": SHORT, "long": LONG}
WYOMING_TEXTS = {**TEXTS, "para": CASES["paragraph"]}
BUSY_LIMIT = 900  # seconds a busy process lives at most, whatever happens to this one
_BUSY = "import time\nend = time.time() + {limit}\nwhile time.time() < end: pass\n"


@contextmanager
def busy_processes(n: int, limit: float = BUSY_LIMIT) -> Iterator[None]:
    """``n`` processes each keeping a core busy, for at most ``limit`` seconds."""
    procs = [subprocess.Popen([sys.executable, "-c", _BUSY.format(limit=limit)])
             for _ in range(n)]
    try:
        time.sleep(1.0 if n else 0.0)  # let the scheduler see them as the hogs they are
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _engine(repeats: int) -> dict[str, Any]:
    """``bench.engine``'s timing at both engines' defaults, in a fresh process."""
    out = subprocess.run([sys.executable, "-m", "bench.load", "--engine-timing",
                          "--repeats", str(repeats)], capture_output=True, text=True,
                         check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _figures(samples: list[Sample]) -> dict[str, float]:
    """Medians of first audio, total and real-time factor; the runs with a gap, the longest."""
    return {"first_ms": statistics.median(s.first for s in samples) * 1000,
            "total_ms": statistics.median(s.done for s in samples) * 1000,
            "rtf": statistics.median(s.done / s.audio_seconds for s in samples),
            "gap_runs": sum(s.gaps > 0 for s in samples),
            "worst_gap_ms": max(s.gaps for s in samples) * 1000}


async def _wyoming(ports: dict[str, int], repeats: int) -> dict[str, dict[str, Any]]:
    raw: dict[str, dict[str, list[Sample]]] = {
        name: {label: [] for label in WYOMING_TEXTS} for name in SERVERS}
    for rep in range(repeats):
        order = list(SERVERS) if rep % 2 == 0 else list(reversed(SERVERS))
        for label, text in WYOMING_TEXTS.items():
            for name in order:
                await asyncio.sleep(COOL_DOWN)
                raw[name][label].append(await request(ports[name], text, "synthesize"))
    return {name: {label: _figures(runs) for label, runs in by.items()}
            for name, by in raw.items()}


def _ratios(h: dict[str, dict[str, float]], p: dict[str, dict[str, float]]
            ) -> dict[str, dict[str, float]]:
    return {label: {k: round(h[label][k] / p[label][k], 3) for k in ("first_ms", "total_ms",
                                                                     "rtf")}
            for label in h}


async def run(levels: list[int], repeats: int) -> dict[str, Any]:
    result: dict[str, Any] = {"repeats": repeats, "machine": describe(),
                              "cpus": os.cpu_count(), "levels": {}}
    with tempfile.TemporaryDirectory(prefix="load-bench-") as tmp:
        ports, procs = start_servers(Path(tmp), None, "auto")
        try:
            for name in SERVERS:
                await wait_ready(ports[name], procs)
            for text in WYOMING_TEXTS.values():  # first-use costs are not what we measure
                for name in SERVERS:
                    await request(ports[name], text, "synthesize")
            for busy in levels:
                print(f"{busy} busy process(es): engine ...", file=sys.stderr, flush=True)
                load_before = os.getloadavg()[0]
                with busy_processes(busy):
                    t = await asyncio.to_thread(_engine, repeats)
                    engine = {"herald": {k: _figures_of(t["herald"][k]) for k in TEXTS},
                              "piper-tts": {k: _figures_of(t["piper"][k]) for k in TEXTS}}
                    print(f"{busy} busy process(es): Wyoming ...", file=sys.stderr, flush=True)
                    wyoming = await _wyoming(ports, repeats)
                result["levels"][busy] = {
                    "load_before": round(load_before, 2),
                    "load_after": round(os.getloadavg()[0], 2),
                    "engine": engine,
                    "engine_ratio": _ratios(engine["herald"], engine["piper-tts"]),
                    "wyoming": wyoming,
                    "wyoming_ratio": _ratios(wyoming["herald"], wyoming["wyoming-piper"]),
                }
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    return result


def _figures_of(t: dict[str, float]) -> dict[str, float]:
    return {"first_ms": t["first_audio_ms"], "total_ms": t["total_ms"], "rtf": t["rtf"]}


def print_table(result: dict[str, Any]) -> None:
    print(result["machine"])
    repeats = result["repeats"]
    print(f"herald vs references under load, medians of {repeats}, "
          f"{result['cpus']} CPUs; defaults on both sides")
    head = (f"{'busy':>4} {'path':8} {'text':6} {'figure':12} {'herald':>9} {'reference':>10} "
            f"{'ratio':>6}")
    print(head)
    print("-" * len(head))
    for busy, r in result["levels"].items():
        for path, ref in (("engine", "piper-tts"), ("wyoming", "wyoming-piper")):
            for label in r[path]["herald"]:
                for key, name, fmt in (("first_ms", "first (ms)", ".0f"),
                                       ("total_ms", "total (ms)", ".0f"),
                                       ("rtf", "RTF", ".3f")):
                    h, p = r[path]["herald"][label][key], r[path][ref][label][key]
                    print(f"{busy:>4} {path:8} {label:6} {name:12} {h:9{fmt}} {p:10{fmt}} "
                          f"{h / p:6.2f}")
                if path == "wyoming":
                    h_, p_ = r[path]["herald"][label], r[path][ref][label]
                    print(f"{busy:>4} {path:8} {label:6} {'gaps':12} "
                          f"{h_['gap_runs']:>3}/{repeats:<2} {p_['gap_runs']:>4}/{repeats:<2}   "
                          f"longest {h_['worst_gap_ms']:.0f} / {p_['worst_gap_ms']:.0f} ms")
        print(f"     (load average {r['load_before']:.2f} before, {r['load_after']:.2f} after)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2],
                        help="numbers of competing busy processes (default 0 1 2)")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions per figure")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--engine-timing", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine_timing:
        from bench.engine import _timing

        print(json.dumps(_timing(None, args.repeats)))
        return 0
    result = asyncio.run(run(args.busy, args.repeats))
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

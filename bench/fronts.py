"""Fronts benchmark: what each way in adds to the engine's own first audio and total.

Starts a Mosquitto on a free loopback port and `herald run` against it, with its Wyoming
server and HTTP API on free ports (speaker on ALSA's file plugin, so no sound card is
needed), and, in this process, the same voice with as many lanes (helper processes
included) as the daemon has. Then, text by text, it alternates:

* the engine alone: ``Synthesizer.stream`` -> first chunk, last chunk;
* Wyoming (the ``wyoming`` library's client, one connection per request as Home Assistant
  makes them): ``synthesize`` sent -> first ``audio-chunk``, ``audio-stop``;
* HTTP: ``POST /tts/stream`` (raw PCM) sent -> first body bytes, end of the body;
* MQTT (``sinks: ["mqtt"]``): ``say`` published -> first ``audio/<id>/chunk/0``,
  ``audio/<id>/stop``, all through the broker;
* the speaker (``sinks: ["speaker"]``): herald's own latency record, request received ->
  first audio handed to the ALSA device (no total: the device plays in real time).

Every request waits ``COOL_DOWN`` idle first, and each round asks the engine and the three
fronts in an order turned by one from the round before, so that none always follows the same
one: a request made right after another finds the voice's weights in the CPU's caches, one
made after a pause finds them evicted: in a fixed order with no pauses, HTTP, right after
Wyoming, took 26-55 ms less than Wyoming over the long sentence. The speaker comes last in
every round (its latency record comes once it has played), and the next round waits a
little longer.

Medians over the repetitions; a front's cost is its median minus the engine's, in the same
run. The fronts' figures include the client's side (connection, parsing, the broker's hop),
as a real client sees them.

    .venv/bin/python -m bench.fronts [--repeats 10] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from bench.engine import COOL_DOWN, LONG, SHORT
from bench.machine import describe
from bench.net import alsa_env, free_port, wait_port
from bench.wyoming_bench import request as wyoming_request

FRONTS = ("wyoming", "http", "mqtt")
TEXTS = {"short": SHORT, "long": LONG}


class Listener:
    """The daemon's MQTT messages, with their arrival times."""

    def __init__(self, port: int, base: str) -> None:
        self.base = base
        self.cond = threading.Condition()
        self.first_chunk: dict[str, float] = {}
        self.stopped: dict[str, float] = {}
        self.latency: dict[str, dict[str, Any]] = {}
        self.online = False
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,  # type: ignore[attr-defined]
                                  client_id="herald-bench-listener")
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe([(f"{base}/availability", 1), (f"{base}/latency", 1),
                               (f"{base}/audio/+/chunk/0", 1), (f"{base}/audio/+/stop", 1)])
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        now = time.perf_counter()
        with self.cond:
            if msg.topic.endswith("/availability"):
                self.online = msg.payload == b"online"
            elif msg.topic.endswith("/latency"):
                rec = json.loads(msg.payload)
                self.latency[rec["id"]] = rec
            elif msg.topic.endswith("/chunk/0"):
                self.first_chunk.setdefault(msg.topic.split("/")[-3], now)
            elif msg.topic.endswith("/stop"):
                self.stopped[msg.topic.split("/")[-2]] = now
            self.cond.notify_all()

    def wait(self, pred: Any, timeout: float = 120.0) -> None:
        with self.cond:
            if not self.cond.wait_for(pred, timeout):
                raise SystemExit("herald did not answer on MQTT")

    def say(self, text: str, rid: str, sink: str) -> float:
        t0 = time.perf_counter()
        self.client.publish(f"{self.base}/say",
                            json.dumps({"text": text, "id": rid, "sinks": [sink]}), qos=1)
        return t0

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


async def _http(session: Any, url: str, text: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    first = None
    async with session.post(f"{url}/tts/stream",
                            json={"text": text, "response_format": "pcm"}) as r:
        if r.status != 200:
            raise SystemExit(f"/tts/stream: {r.status} {await r.text()}")
        async for _ in r.content.iter_any():
            if first is None:
                first = time.perf_counter() - t0
    done = time.perf_counter() - t0
    return (first if first is not None else done), done


async def _mqtt(listener: Listener, text: str, rid: str) -> tuple[float, float]:
    t0 = listener.say(text, rid, "mqtt")
    await asyncio.to_thread(listener.wait, lambda: rid in listener.stopped)
    return listener.first_chunk[rid] - t0, listener.stopped[rid] - t0


async def _speaker(listener: Listener, text: str, rid: str) -> float:
    listener.say(text, rid, "speaker")
    await asyncio.to_thread(listener.wait, lambda: rid in listener.latency)
    return float(listener.latency[rid]["first_audio_ms"]) / 1000


async def _measure(repeats: int, threads: int, ports: dict[str, int], listener: Listener
                   ) -> dict[str, Any]:
    import aiohttp

    from daemon.synthesis.helpers import HelperPool
    from tts import SynthesisOptions, VoiceCatalog, prepare_process

    prepare_process()
    catalog = VoiceCatalog()
    synth = catalog.synthesizer()
    helpers = HelperPool(catalog, threads - 1) if threads > 1 else None

    def engine(text: str) -> tuple[float, float]:
        t0 = time.perf_counter()
        first = None
        for _ in synth.stream(text, SynthesisOptions(), helpers):
            if first is None:
                first = time.perf_counter() - t0
        return (first or 0.0), time.perf_counter() - t0

    url = f"http://127.0.0.1:{ports['http']}"
    results: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as session:
            for label, text in TEXTS.items():
                got: dict[str, list[tuple[float, float]]] = {
                    k: [] for k in ("engine", *FRONTS)}
                speaker: list[float] = []
                paths = ("engine", *FRONTS)
                for i in range(repeats + 1):  # the first round warms every path up
                    rnd: dict[str, tuple[float, float]] = {}
                    for k in paths[i % len(paths):] + paths[:i % len(paths)]:
                        await asyncio.sleep(COOL_DOWN)
                        if k == "engine":
                            rnd[k] = engine(text)
                        elif k == "wyoming":
                            rnd[k] = await _wyoming(ports["wyoming"], text)
                        elif k == "http":
                            rnd[k] = await _http(session, url, text)
                        else:
                            rnd[k] = await _mqtt(listener, text, f"{label}-m{i}")
                    await asyncio.sleep(COOL_DOWN)
                    first_speaker = await _speaker(listener, text, f"{label}-s{i}")
                    await asyncio.sleep(0.1 + rnd["engine"][1])  # the speaker plays it out
                    if i:
                        for k, sample in rnd.items():
                            got[k].append(sample)
                        speaker.append(first_speaker)
                row: dict[str, Any] = {}
                for k, samples in got.items():
                    row[k] = {
                        "first_ms": round(1000 * statistics.median(f for f, _ in samples), 1),
                        "total_ms": round(1000 * statistics.median(t for _, t in samples), 1)}
                row["speaker"] = {"first_ms": round(1000 * statistics.median(speaker), 1)}
                for k in (*FRONTS, "speaker"):
                    for fig in ("first_ms", "total_ms"):
                        if fig in row[k]:
                            row[k][fig.replace("_ms", "_added_ms")] = round(
                                row[k][fig] - row["engine"][fig], 1)
                results[label] = row
    finally:
        if helpers is not None:
            helpers.close()
    return results


async def _wyoming(port: int, text: str) -> tuple[float, float]:
    sample = await wyoming_request(port, text, "synthesize")
    return sample.first, sample.done


def run(repeats: int, threads: int) -> dict[str, Any]:
    if not shutil.which("mosquitto"):
        raise SystemExit("mosquitto is not installed (scripts/setup --test installs it)")
    work = Path(tempfile.mkdtemp(prefix="herald-bench-"))
    ports = {"mqtt": free_port(), "wyoming": free_port(), "http": free_port()}
    # set_tcp_nodelay as README advises for audio on MQTT: without it Mosquitto's own Nagle
    # delay, not herald's, is what the first chunk waits for.
    (work / "mosquitto.conf").write_text(f"user root\nlistener {ports['mqtt']} 127.0.0.1\n"
                                         "allow_anonymous true\nset_tcp_nodelay true\n")
    env = alsa_env(work, Path("/dev/null"))
    broker = subprocess.Popen(["mosquitto", "-c", str(work / "mosquitto.conf")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    daemon = None
    listener = None
    log = (work / "herald.log").open("wb")
    try:
        wait_port(ports["mqtt"], 15.0)
        daemon = subprocess.Popen(
            [sys.executable, "-m", "daemon.cli", "run", "--set", "mqtt.host=127.0.0.1",
             "--set", f"mqtt.port={ports['mqtt']}", "--set", "device_id=bench",
             "--set", f"voices.threads={threads}",
             "--set", f"wyoming.uri=tcp://127.0.0.1:{ports['wyoming']}",
             "--set", f"http.port={ports['http']}", "--set", "mqtt.discovery.enabled=false"],
            # Its log goes to a file: a pipe nobody reads fills after some hundred requests'
            # latency lines, and the daemon then blocks on its next one.
            env=env, stdout=subprocess.DEVNULL, stderr=log)
        listener = Listener(ports["mqtt"], "herald/bench")
        listener.wait(lambda: listener is not None and listener.online
                      or daemon is not None and daemon.poll() is not None)
        if daemon.poll() is not None:
            raise SystemExit(f"herald run failed: {(work / 'herald.log').read_text()}")
        wait_port(ports["wyoming"], 60.0)
        wait_port(ports["http"], 60.0)
        texts = asyncio.run(_measure(repeats, threads, ports, listener))
        return {"repeats": repeats, "threads": threads, "machine": describe(), **texts}
    finally:
        if listener is not None:
            listener.close()
        for p in (daemon, broker):
            if p and p.poll() is None:
                p.terminate()
                p.wait(10)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def print_table(r: dict[str, Any]) -> None:
    print(r["machine"])
    print(f"lanes (voices.threads): {r['threads']}, medians of {r['repeats']}, ms")
    print(f"{'text':6} {'figure':6} {'engine':>8} " + " ".join(
        f"{k:>9} {'+':>6}" for k in (*FRONTS, "speaker")))
    for label in TEXTS:
        row = r[label]
        for fig in ("first", "total"):
            cells = []
            for k in (*FRONTS, "speaker"):
                if f"{fig}_ms" in row[k]:
                    cells.append(f"{row[k][f'{fig}_ms']:>9.1f} {row[k][f'{fig}_added_ms']:>+6.1f}")
                else:
                    cells.append(f"{'':>9} {'':>6}")
            print(f"{label:6} {fig:6} {row['engine'][f'{fig}_ms']:>8.1f} " + " ".join(cells))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None,
                    help="lanes, as voices.threads (default: the daemon's, cores up to 4)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.threads is None:
        from tts import default_threads

        a.threads = default_threads()
    r = run(a.repeats, a.threads)
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        print_table(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())

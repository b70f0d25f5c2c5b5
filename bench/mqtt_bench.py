"""MQTT path benchmark: `say` published -> first audio, against the engine's own first audio.

Starts a Mosquitto on a free loopback port and `herald run` against it (speaker on ALSA's
file plugin, so no sound card is needed), then alternates, for each text:

* the engine alone, in this process, same voice and thread count: time to its first chunk;
* `sinks: ["mqtt"]`: `say` published -> first `audio/<id>/chunk/0` received here;
* `sinks: ["speaker"]`: herald's latency record, request received -> first audio handed
  to the ALSA device.

Medians over the repetitions; the overhead is herald's median minus the engine's.

    .venv/bin/python -m bench.mqtt_bench [--repeats 10] [--json]
"""

from __future__ import annotations

import argparse
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

from bench.engine import LONG, SHORT
from bench.net import alsa_env, free_port, wait_port


class Listener:
    """Collects the daemon's messages with their arrival times."""

    def __init__(self, port: int, base: str) -> None:
        self.base = base
        self.cond = threading.Condition()
        self.first_chunk: dict[str, float] = {}
        self.latency: dict[str, dict[str, Any]] = {}
        self.online = False
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                                  client_id="herald-bench-listener")
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe([(f"{base}/availability", 1), (f"{base}/latency", 1),
                               (f"{base}/audio/+/chunk/0", 1)])
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        now = time.monotonic()
        with self.cond:
            if msg.topic.endswith("/availability"):
                self.online = msg.payload == b"online"
            elif msg.topic.endswith("/latency"):
                rec = json.loads(msg.payload)
                self.latency[rec["id"]] = rec
            elif "/audio/" in msg.topic:
                self.first_chunk.setdefault(msg.topic.split("/")[-3], now)
            self.cond.notify_all()

    def wait(self, pred: Any, timeout: float = 60.0) -> None:
        with self.cond:
            if not self.cond.wait_for(pred, timeout):
                raise TimeoutError("herald did not answer")

    def say(self, text: str, rid: str, sink: str) -> float:
        t0 = time.monotonic()
        self.client.publish(f"{self.base}/say",
                            json.dumps({"text": text, "id": rid, "sinks": [sink]}), qos=1)
        return t0


def run(repeats: int, threads: int) -> dict[str, Any]:
    if not shutil.which("mosquitto"):
        raise SystemExit("mosquitto is not installed (scripts/setup --test installs it)")
    work = Path(tempfile.mkdtemp(prefix="herald-bench-"))
    port = free_port()
    (work / "mosquitto.conf").write_text(f"user root\nlistener {port} 127.0.0.1\n"
                                         "allow_anonymous true\n")
    env = alsa_env(work, work / "out.raw")
    broker = subprocess.Popen(["mosquitto", "-c", str(work / "mosquitto.conf")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    daemon = None
    try:
        wait_port(port, 15.0)
        daemon = subprocess.Popen(
            [sys.executable, "-m", "daemon.cli", "run", "--set", "mqtt.host=127.0.0.1",
             "--set", f"mqtt.port={port}", "--set", "device_id=bench",
             "--set", f"voices.threads={threads}", "--set", "wyoming.enabled=false",
             "--set", "http.enabled=false", "--set", "mqtt.discovery.enabled=false"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        listener = Listener(port, "herald/bench")
        listener.wait(lambda: listener.online)

        from tts import SynthesisOptions, VoiceCatalog, prepare_process

        prepare_process()
        synth = VoiceCatalog().synthesizer()

        def engine_first(text: str) -> float:
            t0 = time.monotonic()
            next(iter(synth.stream(text, SynthesisOptions())))
            return (time.monotonic() - t0) * 1000

        results: dict[str, Any] = {}
        for label, text in (("short", SHORT), ("long", LONG)):
            engine, mqtt_ms, speaker_ms = [], [], []
            engine_first(text)  # warm-up
            for i in range(repeats + 1):
                rid = f"{label}-m{i}"
                t0 = listener.say(text, rid, "mqtt")
                listener.wait(lambda rid=rid: rid in listener.first_chunk)
                listener.wait(lambda rid=rid: rid in listener.latency)
                rid_s = f"{label}-s{i}"
                listener.say(text, rid_s, "speaker")
                listener.wait(lambda rid_s=rid_s: rid_s in listener.latency, timeout=120)
                if i == 0:
                    continue  # warm-up of the daemon's own path
                mqtt_ms.append((listener.first_chunk[rid] - t0) * 1000)
                speaker_ms.append(float(listener.latency[rid_s]["first_audio_ms"]))
                engine.append(engine_first(text))
            e = statistics.median(engine)
            results[label] = {
                "engine_first_audio_ms": round(e, 1),
                "mqtt_first_chunk_ms": round(statistics.median(mqtt_ms), 1),
                "speaker_first_audio_ms": round(statistics.median(speaker_ms), 1),
                "mqtt_overhead_ms": round(statistics.median(mqtt_ms) - e, 1),
                "speaker_overhead_ms": round(statistics.median(speaker_ms) - e, 1),
            }
        return {"repeats": repeats, "threads": threads, **results}
    finally:
        for p in (daemon, broker):
            if p and p.poll() is None:
                p.terminate()
                p.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = run(a.repeats, a.threads)
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{'text':6} {'engine':>8} {'mqtt':>8} {'speaker':>8} {'mqtt +':>8} {'speaker +':>10}"
          "   (medians, ms)")
    for label in ("short", "long"):
        x = r[label]
        print(f"{label:6} {x['engine_first_audio_ms']:>8.1f} {x['mqtt_first_chunk_ms']:>8.1f} "
              f"{x['speaker_first_audio_ms']:>8.1f} {x['mqtt_overhead_ms']:>8.1f} "
              f"{x['speaker_overhead_ms']:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A fleet worker played by the tests, straight from the protocol (the fleet's wire contract,
``daemon.fleet.messages``): what an owner must cope with, on purpose. It claims jobs,
heartbeats, publishes the audio a ``render`` callable makes for the job, honours
``skip_chunks`` and ``cancel``, and can misbehave: answer ``busy``, never answer, or die
mid-job (its connection cut, so the broker publishes its last will) after some chunks.

Its own paho client on the test's Mosquitto (MQTT 5, clean start, session expiry 0), in the
share group the owner sends jobs to.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

FLEET = "herald/fleet"
VOICE = {"name": "en_US-joe-medium", "language": "en_US", "rate": 22050, "speakers": 1}

Render = Callable[[dict[str, Any]], bytes]  # the job (with its full text) -> s16le PCM


@dataclass
class Behaviour:
    busy: bool = False  # answer every job "busy"
    silent: bool = False  # take jobs and never answer
    die_after: int | None = None  # chunks published (in all), then the connection is cut
    pace: float = 0.0  # seconds between two chunks
    heartbeat: float = 0.5


@dataclass
class Seen:
    jobs: list[dict[str, Any]] = field(default_factory=list)  # every job message received
    states: list[tuple[str, int, str]] = field(default_factory=list)  # job, attempt, state
    cancels: list[tuple[str, int | None]] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)  # streamed text as it arrived
    published: dict[str, list[int]] = field(default_factory=dict)  # job -> seqs published


class ProtocolWorker:
    def __init__(self, port: int, device: str, render: Render,
                 behaviour: Behaviour | None = None, voices: list[dict[str, Any]] | None = None,
                 share: str = "herald", sync_delay: float = 0.4) -> None:
        self.device = device
        self.render = render
        self.b = behaviour or Behaviour()
        self.voices = voices if voices is not None else [VOICE]
        self.sync_delay = sync_delay
        self.seen = Seen()
        self.dead = False
        self._lock = threading.Lock()
        self._taken: set[tuple[str, int]] = set()
        self._cancelled: set[tuple[str, int | None]] = set()
        self._text_end: dict[str, threading.Event] = {}
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{device}-fleet",
                             protocol=mqtt.MQTTv5)
        self.c.will_set(f"{FLEET}/nodes/{device}", self._presence("offline"), 1, True)
        subscribed = threading.Event()

        def on_connect(c: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
            c.subscribe([(f"$share/{share}/{FLEET}/jobs", 1), (f"{FLEET}/job/+/cancel", 1),
                         (f"{FLEET}/job/+/text", 1)])
            c.publish(f"{FLEET}/nodes/{device}", self._presence("online"), 1, True)

        self.c.on_connect = on_connect
        self.c.on_subscribe = lambda *a: subscribed.set()
        self.c.on_message = self._on_message
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 0
        self.c.connect("127.0.0.1", port, keepalive=10, clean_start=True, properties=props)
        self.c.loop_start()
        assert subscribed.wait(10), "the protocol worker could not subscribe"

    def _presence(self, state: str) -> str:
        return json.dumps({"state": state, "role": "worker", "version": "test",
                           "voices": self.voices, "slots": 4, "groups": []})

    # ------------------------------------------------------------------ paho thread

    def _on_message(self, c: Any, u: Any, m: mqtt.MQTTMessage) -> None:
        if self.dead:
            return
        parts = m.topic.split("/")
        if m.topic.endswith("/jobs"):
            self._on_job(json.loads(m.payload))
        elif parts[-1] == "cancel":
            attempt = json.loads(m.payload).get("attempt")
            with self._lock:
                self.seen.cancels.append((parts[-2], attempt))
                self._cancelled.add((parts[-2], attempt))
        elif parts[-1] == "text":
            piece = json.loads(m.payload)
            with self._lock:
                have = self.seen.texts.get(parts[-2], "")
                if piece["offset"] <= len(have):  # the part it does not have yet
                    have += piece["text"][len(have) - piece["offset"]:]
                    self.seen.texts[parts[-2]] = have
                    if piece["end"]:
                        self._text_end.setdefault(parts[-2], threading.Event()).set()

    def _on_job(self, job: dict[str, Any]) -> None:
        key = (job["job"], job["attempt"])
        with self._lock:
            self.seen.jobs.append(job)
            if key in self._taken:  # a copy of one it already took
                return
            self._taken.add(key)
        if self.b.silent:
            return
        if self.b.busy:
            self._state(job, "busy")
            return
        threading.Thread(target=self._run, args=(job,), daemon=True).start()

    # ------------------------------------------------------------------ one job

    def _state(self, job: dict[str, Any], state: str, **more: Any) -> None:
        with self._lock:
            self.seen.states.append((job["job"], job["attempt"], state))
        payload = {"job": job["job"], "attempt": job["attempt"], "worker": self.device,
                   "state": state, **more}
        self.c.publish(f"{FLEET}/job/{job['job']}/state", json.dumps(payload), 1)

    def _cancelled_(self, job: dict[str, Any]) -> bool:
        with self._lock:
            return bool({(job["job"], None), (job["job"], job["attempt"])} & self._cancelled)

    def _run(self, job: dict[str, Any]) -> None:
        jid = job["job"]
        if job["stream"]:
            with self._lock:
                self.seen.texts.setdefault(jid, job["text"])
                offset = len(self.seen.texts[jid])
            self._state(job, "claimed", text_offset=offset)
            ended = self._text_end.setdefault(jid, threading.Event())
            while not ended.wait(self.b.heartbeat):
                if self._cancelled_(job) or self.dead:
                    return
                self._state(job, "working")
            with self._lock:
                job = {**job, "text": self.seen.texts[jid]}
        else:
            self._state(job, "claimed")
        rendered = threading.Event()  # a worker heartbeats while it synthesizes, too
        threading.Thread(target=self._beat_until, args=(job, rendered), daemon=True).start()
        try:
            pcm = self.render(job)
        finally:
            rendered.set()
        rate = next(v["rate"] for v in self.voices if v["name"] == job["voice"])
        n = rate * job["chunk_ms"] // 1000
        chunks = [pcm[i:i + 2 * n] for i in range(0, len(pcm), 2 * n)]
        audio = job["audio"]
        play_at = time.time() + self.sync_delay if job["sync"] else None
        self.c.publish(f"{audio}/{jid}/start", json.dumps({
            "format": "pcm", "rate": rate, "width": 2, "channels": 1, "job": jid,
            "attempt": job["attempt"], "worker": self.device, "voice": job["voice"],
            "play_at": play_at, "chunk_samples": n}), 1)
        beat = time.monotonic()
        for seq, chunk in enumerate(chunks):
            if seq < job["skip_chunks"]:
                continue
            if self.dead:
                return
            if self._cancelled_(job):
                self._stop(job, seq, "stopped")
                return
            with self._lock:
                published = sum(len(s) for s in self.seen.published.values())
            if self.b.die_after is not None and published >= self.b.die_after:
                self.die()
                return
            self.c.publish(f"{audio}/{jid}/chunk/{seq}", chunk, 1)
            with self._lock:
                self.seen.published.setdefault(jid, []).append(seq)
            if time.monotonic() - beat >= self.b.heartbeat:
                beat = time.monotonic()
                self._state(job, "working", chunks=seq + 1)
            time.sleep(self.b.pace)
        self._stop(job, len(chunks), "finished", samples=len(pcm) // 2)
        self._state(job, "done", chunks=len(chunks))

    def _beat_until(self, job: dict[str, Any], done: threading.Event) -> None:
        while not done.wait(self.b.heartbeat):
            if self.dead or self._cancelled_(job):
                return
            self._state(job, "working")

    def _stop(self, job: dict[str, Any], chunks: int, outcome: str, samples: int = 0) -> None:
        self.c.publish(f"{job['audio']}/{job['job']}/stop", json.dumps({
            "chunks": chunks, "samples": samples, "outcome": outcome,
            "attempt": job["attempt"]}), 1)

    # ------------------------------------------------------------------ the end

    def die(self) -> None:
        """As a SIGKILL would: the connection is cut, nothing more is said (the broker
        publishes the last will)."""
        self.dead = True
        sock = self.c.socket()
        if sock is not None:
            sock.close()
        self.c.loop_stop()

    def close(self) -> None:
        if not self.dead:
            self.dead = True
            self.c.publish(f"{FLEET}/nodes/{self.device}", self._presence("offline"), 1, True)
            self.c.disconnect()
            self.c.loop_stop()

"""Abuse: ``herald run`` probed as a demanding operator would, each front in turn.

Starts herald on loopback the way soak.py does (its own config on the command line, free
ports, the speaker on ALSA's file plugin) against a Mosquitto it starts (retained messages
must outlive a herald restart), then runs each probe, bounded in count and time, and prints
what was expected, what was observed and a verdict:

1. connections held: a Wyoming event whose payload never comes, an idle Wyoming connection,
   HTTP headers and an HTTP body at 1 byte/s, and 200 idle Wyoming connections at once;
2. abandoned Wyoming requests: 20 clients send ``synthesize`` and vanish, then a good
   request's first audio;
3. a ``say/stream`` flood: its error events, and how soon a ``say`` sent after it is queued;
4. retained commands: a retained ``say`` and ``set/volume`` published live, and a retained
   ``say`` waiting while herald restarts;
5. SIGHUP;
6. the embedded broker: a burst of clients connecting and subscribing while messages flow
   (a second herald, on its own broker: bench/mqtt_burst.py);
7. back-to-back speaker ``say``s at QoS 0, as Home Assistant's notify sends them.

herald's resident memory, open file descriptors and threads are read from /proc at ready and
after probes 1-4 and 7 (before the restart and the SIGHUP). The whole run takes a few minutes.

    .venv/bin/python -m bench.abuse [--bursts 10] [--flood 20000] [--log FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from bench.mqtt_burst import burst
from bench.net import alsa_env, free_port, wait_port
from bench.soak import footprint

DEVICE = "abuse"
BASE = f"herald/{DEVICE}"
HOLD = 35.0  # seconds a held connection is watched (the fix's timeouts: 10-30 s)
SLACK = 2.0  # seconds past the longest timeout (30 s) that still count as "closed by it"
LONG = ("This is a long announcement that keeps going for quite a while, so that other "
        "requests arrive while it is still being spoken. It talks about the weather, the "
        "garden, the trains that run late on Sundays, and the many small things a house "
        "might want to say out loud during a long and uneventful afternoon at home.")
NOTIFY = ["First announcement, it is a bit longer than the others.",
          "Second announcement.", "Third announcement."]


@dataclass
class Verdict:
    probe: str
    expected: str
    observed: str
    ok: bool

    def show(self) -> None:
        print(f"[{'PASS' if self.ok else 'FAIL'}] {self.probe}\n    expected: {self.expected}"
              f"\n    observed: {self.observed}", flush=True)


class Herald:
    """``herald run`` as a subprocess; restartable, its log kept in one file."""

    def __init__(self, work: Path, args: list[str], log: Path) -> None:
        self.work, self.args, self.log = work, args, log
        self.env = alsa_env(work, Path("/dev/null"),
                            {k: v for k, v in os.environ.items() if not k.startswith("HERALD_")})
        self.env["STATE_DIRECTORY"] = str(work / "state")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "daemon.cli", "run", *self.args],
                                         env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def footprint(self) -> str:
        assert self.proc is not None
        rss, fds, threads = footprint(self.proc.pid)
        return f"RSS {rss:.0f} MiB, fds {fds}, threads {threads}"


class Peer:
    """An automation on MQTT: publishes commands, records herald's events and status."""

    def __init__(self, port: int) -> None:
        self.cond = threading.Condition()
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.status: dict[str, Any] = {}
        self.online = False
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="abuse-driver")
        self.c.on_message = self._on_message
        self.c.connect("127.0.0.1", port)
        self.c.subscribe([(f"{BASE}/availability", 1), (f"{BASE}/event", 1),
                          (f"{BASE}/status", 1)])
        self.c.loop_start()

    def _on_message(self, c: Any, u: Any, m: mqtt.MQTTMessage) -> None:
        with self.cond:
            if m.topic.endswith("/availability"):
                self.online = m.payload == b"online"
            elif m.topic.endswith("/status"):
                self.status = json.loads(m.payload)
            else:
                self.events.append((time.monotonic(), json.loads(m.payload)))
            self.cond.notify_all()

    def publish(self, suffix: str, payload: str | bytes, qos: int = 1,
                retain: bool = False) -> None:
        info = self.c.publish(f"{BASE}/{suffix}", payload, qos, retain)
        if qos:
            info.wait_for_publish(30)

    def wait(self, pred: Callable[[], Any], timeout: float) -> bool:
        with self.cond:
            return bool(self.cond.wait_for(pred, timeout))

    def of(self, rid: str, kind: str | None = None) -> list[tuple[float, dict[str, Any]]]:
        with self.cond:
            return [(t, e) for t, e in self.events
                    if e.get("id") == rid and (kind is None or e["event"] == kind)]

    def errors_since(self, t0: float, word: str = "") -> list[dict[str, Any]]:
        with self.cond:
            return [e for t, e in self.events
                    if t >= t0 and e["event"] == "error" and word in json.dumps(e)]

    def idle(self, timeout: float = 60.0) -> bool:
        return self.wait(lambda: self.status.get("state") == "idle"
                         and not self.status.get("queue"), timeout)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


# --------------------------------------------------------------------------- 1: held


def closed_after(sock: socket.socket, feed: bytes = b"", limit: float = HOLD) -> float | None:
    """Seconds until the server closes ``sock`` while ``feed`` trickles in at 1 byte/s
    (nothing, if empty); None if still open after ``limit``."""
    t0 = time.monotonic()
    sock.settimeout(1.0)
    sent = 0
    while time.monotonic() - t0 < limit:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            pass
        except OSError:
            return time.monotonic() - t0
        if sent < len(feed):
            try:
                sock.send(feed[sent:sent + 1])
                sent += 1
            except OSError:
                return time.monotonic() - t0
    return None


def drain(sock: socket.socket) -> tuple[bytes, bool]:
    """What the server has sent on ``sock`` so far, and whether it has closed it."""
    sock.setblocking(False)
    got = b""
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return got, False
        except OSError:
            return got, True
        if not data:
            return got, True
        got += data


def probe_held(wyoming: int, http: int, herald: Herald) -> list[Verdict]:
    def connect(port: int, first: bytes = b"") -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if first:
            s.sendall(first)
        return s

    slow_headers = b"X-Slow: " + b"a" * 100
    body_head = (b"POST /tts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 200\r\n\r\n")
    cases: dict[str, Callable[[], float | None]] = {
        "Wyoming event whose payload never arrives": lambda: closed_after(connect(
            wyoming, b'{"type": "synthesize", "data_length": 0, "payload_length": 4096}\n')),
        "idle Wyoming connection": lambda: closed_after(connect(wyoming)),
        "HTTP headers at 1 byte/s": lambda: closed_after(
            connect(http, b"POST /tts HTTP/1.1\r\nHost: 127.0.0.1\r\n"), slow_headers),
        "HTTP body at 1 byte/s": lambda: closed_after(connect(http, body_head),
                                                      b'{"text": "' + b"a" * 180),
    }
    results: dict[str, float | None] = {}
    threads = [threading.Thread(target=lambda k=k, f=f: results.__setitem__(k, f()))
               for k, f in cases.items()]
    for t in threads:
        t.start()
    many: list[socket.socket] = []
    refused = 0
    for _ in range(200):
        try:
            many.append(socket.create_connection(("127.0.0.1", wyoming), timeout=2))
        except OSError:
            refused += 1
    time.sleep(1.0)
    peak_fds = footprint(herald.proc.pid)[1] if herald.proc else 0
    for t in threads:
        t.join(HOLD + 10)
    still = 0
    for s in many:  # herald refuses over its cap with a Wyoming "busy" error, then closes
        got, closed = drain(s)
        refused += b'"busy"' in got
        still += not closed
        s.close()
    out = []
    for k, secs in results.items():
        out.append(Verdict(f"1. {k}", f"closed by herald within 30 s (+{SLACK:g})",
                           f"closed after {secs:.1f} s" if secs is not None
                           else f"still open after {HOLD:.0f} s",
                           secs is not None and secs <= 30 + SLACK))
    out.append(Verdict("1. 200 idle Wyoming connections at once",
                       "those over a cap of a few dozen refused, idle ones closed by the timeout",
                       f"{200 - refused} accepted, {refused} refused, {still} still open after "
                       f"{HOLD:.0f} s; herald had {peak_fds} fds with them open",
                       refused >= 100 and still == 0))
    return out


# --------------------------------------------------------------------------- 2: abandoned


async def first_audio(port: int, text: str) -> float:
    async with AsyncTcpClient("127.0.0.1", port) as c:
        t0 = time.monotonic()
        await c.write_event(Synthesize(text=text).event())
        while True:
            event = await asyncio.wait_for(c.read_event(), 120)
            if event is None:
                raise ConnectionError("closed before audio")
            if AudioChunk.is_type(event.type):
                return time.monotonic() - t0


async def abandon(port: int, n: int) -> None:
    async def one() -> None:
        async with AsyncTcpClient("127.0.0.1", port) as c:
            await c.write_event(Synthesize(text=LONG).event())
    await asyncio.gather(*(one() for _ in range(n)))


def probe_abandoned(wyoming: int) -> Verdict:
    asyncio.run(abandon(wyoming, 20))
    try:
        secs = asyncio.run(first_audio(wyoming, "The good request."))
        seen = f"first audio after {secs:.2f} s"
    except (OSError, TimeoutError, ConnectionError) as e:
        secs, seen = 999.0, f"no audio: {e}"
    return Verdict("2. 20 abandoned Wyoming requests, then a good one",
                   "its first audio within 1 s", seen, secs <= 1.0)


# --------------------------------------------------------------------------- 3: flood


def probe_flood(peer: Peer, herald: Herald, pieces: int) -> Verdict:
    warnings0 = herald.text().count(" WARNING ")
    t0 = time.monotonic()
    for seq in range(pieces):
        peer.publish("say/stream", json.dumps({"id": "flood", "seq": seq, "text": "flood ",
                                               "final": False, "sinks": ["mqtt"]}), qos=0)
    sent = time.monotonic() - t0
    asked = time.monotonic()
    peer.publish("say", json.dumps({"id": "after-flood", "text": "Still here.",
                                    "sinks": ["mqtt"]}))
    queued = peer.wait(lambda: peer.of("after-flood", "queued"), 60)
    queued_after = (peer.of("after-flood", "queued")[0][0] - asked) if queued else None
    n, changed = -1, time.monotonic()  # until no new error for 3 s (at most 60 s)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and time.monotonic() - changed < 3:
        time.sleep(0.2)
        if (now := len(peer.errors_since(t0))) != n:
            n, changed = now, time.monotonic()
    errors = len(peer.errors_since(t0))
    peer.publish("stop", b"PRESS")
    peer.idle(30)
    warnings = herald.text().count(" WARNING ") - warnings0
    when = (f"after {queued_after:.2f} s" if queued_after is not None
            else "not within 60 s")
    return Verdict(f"3. say/stream flood ({pieces} pieces of 6 characters in {sent:.1f} s)",
                   "<= 10 error events; a say sent after it queued within 1 s",
                   f"{errors} error events, {warnings} WARNING lines; the say queued "
                   f"{when}", errors <= 10 and queued_after is not None and queued_after <= 1)


# --------------------------------------------------------------------------- 4: retained


def spoken_or_refused(peer: Peer, rid: str, t0: float, wait: float = 5.0) -> tuple[bool, int]:
    time.sleep(wait)
    return bool(peer.of(rid, "started")), len(peer.errors_since(t0, "retained"))


def probe_retained_live(peer: Peer) -> list[Verdict]:
    t0 = time.monotonic()
    peer.publish("say", json.dumps({"id": "ret-live", "text": "A retained command.",
                                    "sinks": ["mqtt"]}), retain=True)
    spoken, refused = spoken_or_refused(peer, "ret-live", t0)
    peer.publish("say", b"", retain=True)
    t1 = time.monotonic()
    volume = peer.status.get("volume")
    peer.publish("set/volume", b"35", retain=True)
    time.sleep(3)
    vol_errors = len(peer.errors_since(t1, "retained"))
    peer.publish("set/volume", b"", retain=True)
    return [Verdict("4. retained say published live", "refused with an error event, never spoken",
                    f"spoken: {spoken}, error events: {refused}", not spoken and refused == 1),
            Verdict("4. retained set/volume published live", "refused with an error event",
                    f"error events: {vol_errors}, volume {volume} -> {peer.status.get('volume')}",
                    vol_errors == 1)]


def probe_retained_restart(peer: Peer, herald: Herald) -> Verdict:
    herald.stop()
    peer.publish("say", json.dumps({"id": "ret-restart", "text": "Left while herald was down.",
                                    "sinks": ["mqtt"]}), retain=True)
    t0 = time.monotonic()
    peer.online = False
    herald.start()
    up = peer.wait(lambda: peer.online, 120)
    spoken, refused = spoken_or_refused(peer, "ret-restart", t0)
    peer.publish("say", b"", retain=True)
    return Verdict("4. retained say waiting while herald restarts",
                   "refused once with an error event, never spoken",
                   f"online again: {up}; spoken: {spoken}, error events: {refused}",
                   up and not spoken and refused == 1)


# --------------------------------------------------------------------------- 5, 7


def probe_sighup(herald: Herald) -> Verdict:
    assert herald.proc is not None
    before = herald.text()
    herald.proc.send_signal(signal.SIGHUP)
    time.sleep(5)
    alive = herald.running()
    rc = herald.proc.returncode
    said = [line for line in herald.text()[len(before):].splitlines() if line.strip()]
    return Verdict("5. SIGHUP", "herald reloads its config, logs it, keeps serving",
                   ("still running" if alive else f"killed by signal {-rc}" if rc < 0
                    else f"exited {rc}")
                   + f"; log: {said[-1][:100] if said else 'nothing'}", alive and bool(said))


def probe_speaker_burst(peer: Peer, bursts: int) -> Verdict:
    hung = []
    for b in range(bursts):
        ids = [f"b{b}-{i}" for i in range(3)]
        for rid, text in zip(ids, NOTIFY, strict=True):
            peer.publish("say", json.dumps({"id": rid, "text": text}), qos=0)
        def ended(ids: list[str] = ids) -> bool:
            return all(peer.of(r, "finished") or peer.of(r, "error") for r in ids)

        done = peer.wait(ended, 30)
        if not done:
            hung.append(next(r for r in ids if not peer.of(r, "finished")))
            peer.publish("stop", b"PRESS")
            peer.idle(30)
    return Verdict(f"7. {bursts} bursts of 3 back-to-back speaker says at QoS 0",
                   "every utterance finishes",
                   f"{3 * bursts - len(hung)} of {3 * bursts} finished"
                   + (f"; stuck (stopped after 30 s): {', '.join(hung)}" if hung else ""),
                   not hung)


# --------------------------------------------------------------------------- 6: broker


def probe_broker(work: Path) -> Verdict:
    port = free_port()
    herald = Herald(work / "broker", ["--set", "device_id=abuse-broker",
                                      "--set", f"mqtt.port={port}",
                                      "--set", "mqtt.discovery.enabled=false",
                                      "--set", "speaker.enabled=false",
                                      "--set", "wyoming.enabled=false",
                                      "--set", "http.enabled=false"], work / "broker.log")
    herald.start()
    try:
        deadline = time.monotonic() + 120
        while "embedded MQTT broker" not in herald.text() and time.monotonic() < deadline:
            time.sleep(0.2)
        b = burst(port, 40, ("herald/abuse-broker/#",))
        lost = sum(p.gaps(b.last) for p in b.peers)
        log = herald.text()
        errors = log.count("Unhandled exception") + log.count("Traceback")
        return Verdict("6. 40 clients connect and subscribe at once through the embedded "
                       "broker while QoS 0 messages flow",
                       "no client dropped, no message lost, no error in herald's log",
                       f"{len(b.dropped())} dropped, {lost} of {b.last + 1} messages lost "
                       f"(summed over clients), {errors} tracebacks in herald's log",
                       not b.dropped() and lost == 0 and errors == 0)
    finally:
        herald.stop()


# --------------------------------------------------------------------------- the run


def mosquitto(work: Path, port: int) -> subprocess.Popen[bytes]:
    if not shutil.which("mosquitto"):
        raise SystemExit("mosquitto is not installed (scripts/setup --test installs it)")
    conf = work / "mosquitto.conf"
    conf.write_text(f"user root\nlistener {port} 127.0.0.1\nallow_anonymous true\n")
    proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_port(port, 15)
    return proc


def run(bursts: int, flood: int, log: Path | None) -> int:
    work = Path(tempfile.mkdtemp(prefix="herald-abuse-"))
    port, http, wyoming = free_port(), free_port(), free_port()
    broker = mosquitto(work, port)
    herald = Herald(work, ["--set", f"device_id={DEVICE}", "--set", "mqtt.host=127.0.0.1",
                           "--set", f"mqtt.port={port}", "--set", "mqtt.discovery.enabled=false",
                           "--set", f"http.port={http}",
                           "--set", f"wyoming.uri=tcp://127.0.0.1:{wyoming}"],
                    log or work / "herald.log")
    peer: Peer | None = None
    verdicts: list[Verdict] = []
    t0 = time.monotonic()

    def done(v: Verdict | list[Verdict]) -> None:
        for one in v if isinstance(v, list) else [v]:
            one.show()
            verdicts.append(one)

    try:
        peer = Peer(port)
        herald.start()
        for p in (http, wyoming):
            wait_port(p, 120)
        peer.wait(lambda: peer.online, 60)
        asyncio.run(first_audio(wyoming, "Warming up."))
        print(f"herald at ready: {herald.footprint()}", flush=True)
        done(probe_held(wyoming, http, herald))
        done(probe_abandoned(wyoming))
        peer.idle(60)
        done(probe_flood(peer, herald, flood))
        done(probe_retained_live(peer))
        done(probe_speaker_burst(peer, bursts))
        peer.idle(30)
        time.sleep(2)
        print(f"herald after probes 1-4 and 7: {herald.footprint()}", flush=True)
        done(probe_retained_restart(peer, herald))
        done(probe_sighup(herald))
        herald.stop()
        done(probe_broker(work))
    finally:
        if peer is not None:
            peer.close()
        herald.stop()
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    failed = sum(not v.ok for v in verdicts)
    print(f"{len(verdicts) - failed} passed, {failed} failed, in {time.monotonic() - t0:.0f} s")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bursts", type=int, default=10,
                    help="speaker bursts of three says (default 10)")
    ap.add_argument("--flood", type=int, default=20_000,
                    help="say/stream pieces in the flood (default 20000)")
    ap.add_argument("--log", type=Path, help="keep herald's log in this file")
    a = ap.parse_args()
    return run(a.bursts, a.flood, a.log)


if __name__ == "__main__":
    sys.exit(main())

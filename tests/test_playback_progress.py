"""Every speaker utterance ends: back-to-back says on a device faster than real time all
finish, and one whose device stops taking audio is ended with an error while ``/healthz``
says so.

A ``herald run`` against a real Mosquitto plays into ALSA's ``file`` plugin (it swallows
audio as fast as it is written, so the speaker's cue and hand-over run at their fastest,
where their races are), or into a FIFO nobody reads (a device that stops taking audio).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from audio_checks import as_samples
from conftest import (
    AlsaFile,
    Broker,
    NotifySocket,
    alsa_env,
    alsa_file_env,
    free_port,
    wait_port,
)
from herald_process import HeraldProcess, herald_env, start_herald
from mqtt_client import DEVICE, Client
from speaker_driver import F_SETPIPE_SZ, Pacer

TERMINAL = ("finished", "stopped", "error")

# What Home Assistant's notify sends when three notifications come at once.
BURST = ("First announcement, it is a bit longer than the others.",
         "Second announcement.",
         "Third announcement.")
BURSTS = 50
BURST_WAIT = 30.0  # seconds for one burst's three utterances (a hang guard)
RATE = 22050  # the default voice's rate, at which the device runs

pytestmark = pytest.mark.slow  # fifty bursts; a stall left to be noticed


@dataclass
class Herald(HeraldProcess):
    alsa: AlsaFile
    broker: Broker


def herald_config(tmp: Path, port: int, extra: str = "") -> Path:
    config = tmp / "herald.toml"
    config.write_text(f"""
device_id = "{DEVICE}"
[mqtt]
host = "127.0.0.1"
port = {port}
[wyoming]
enabled = false
[http]
enabled = false
{extra}
""")
    return config


@pytest.fixture(scope="module")
def herald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Herald]:
    tmp = tmp_path_factory.mktemp("burst")
    workdir = tmp / "broker"
    workdir.mkdir()
    broker = Broker(free_port(), workdir)
    broker.start()
    alsa = alsa_file_env(tmp / "alsa")
    started = start_herald(herald_config(tmp, broker.port), tmp / "herald.log",
                           herald_env(base=alsa.env))
    h = Herald(started.proc, started.log, alsa, broker)
    try:
        yield h
    finally:
        h.kill()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        print(h.output()[-5000:])


def test_back_to_back_says_all_finish(herald: Herald) -> None:
    """Three says published at once at QoS 0, fifty times over: each one is started and
    finished, in order, and all of them are heard."""
    c = Client(herald.broker.port)
    try:
        c.wait_online()
        for burst in range(BURSTS):
            ids = [f"b{burst}-{n}" for n in range(len(BURST))]
            for rid, text in zip(ids, BURST):
                c.publish("say", json.dumps({"id": rid, "text": text}), qos=0)
            deadline = time.monotonic() + BURST_WAIT
            for rid in ids:
                ev = c.wait_event(rid, timeout=max(0.1, deadline - time.monotonic()))
                assert ev["event"] == "finished", (ev, herald.tail())
            kinds = [[e["event"] for e in c.events(rid)] for rid in ids]
            assert kinds == [["queued", "started", "finished"]] * len(ids), kinds
        assert herald.proc.poll() is None, herald.tail()
        heard = as_samples(herald.alsa.pcm())
        # A burst is about 5.5 s of speech (pauses inside it included), nearly all of it
        # sound: at least 4 s of it per burst, or utterances went unheard.
        sound = int((heard != 0).sum())
        assert sound >= BURSTS * 4.0 * RATE, f"{sound / RATE:.1f} s of sound"
    finally:
        c.close()


# ------------------------------------------- a device that stops taking audio (ALSA -> FIFO)

STUCK = ("This announcement about the weather goes on for quite a while, so that the "
         "sound device has plenty of it still to play when it stops.")
AFTER = "The sound device is back."
WATCHDOG_SECONDS = 1.0  # WatchdogSec: a look every half second


def healthz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_stalled_playback_is_reported_then_ended_with_an_error(
        broker: Broker, tmp_path: Path) -> None:
    """The sound device takes a moment of audio and then no more (ALSA's file plugin writing
    into a FIFO that is open but not read). While the utterance can't move, /healthz says so
    (503) and the systemd watchdog is not petted; once it has been quiet for longer than its
    audio could take, it is ended with an error event and a log line. When the device takes
    audio again, the next say plays and herald is healthy."""
    fifo = tmp_path / "device.fifo"
    os.mkfifo(fifo)
    # Open (so ALSA's open of the device doesn't block) and never read: a device that stopped.
    held = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    fcntl.fcntl(held, F_SETPIPE_SZ, 4096)
    notify = NotifySocket(tmp_path / "notify.sock")
    http_port = free_port()
    config = herald_config(tmp_path, broker.port)
    config.write_text(config.read_text().replace(
        "[http]\nenabled = false", f'[http]\nhost = "127.0.0.1"\nport = {http_port}'))
    herald = start_herald(config, tmp_path / "herald.log", herald_env(
        {"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": str(int(WATCHDOG_SECONDS * 1e6))},
        base=alsa_env(tmp_path / "alsa", fifo)))
    device: Pacer | None = None
    c = Client(broker.port)
    try:
        c.wait_online()
        wait_port(http_port)
        assert healthz(http_port)[0] == 200
        assert "WATCHDOG=1" in notify.received(timeout=5), "the watchdog is not petting"

        c.say(id="stuck", text=STUCK)
        deadline = time.monotonic() + BURST_WAIT
        while (answer := healthz(http_port))[0] == 200:
            notify.received()  # keep reading, as systemd does: a full socket blocks sd_notify
            assert time.monotonic() < deadline, "/healthz never said stalled:\n" + herald.tail()
            assert not [e for e in c.events("stuck") if e["event"] in TERMINAL], c.events()
            time.sleep(0.05)
        status, body = answer
        assert status == 503 and body["status"] == "stalled", answer
        assert "the speaker has played nothing" in body["problem"], body
        stalled_at = time.monotonic()
        notify.received()  # what was sent before: from before the stall
        # Until it is ended, every answer is 503 and the watchdog pets no more. (A datagram
        # read between two 503 answers was sent while stalled.)
        while not [e for e in c.events("stuck") if e["event"] in TERMINAL]:
            sent = notify.received()
            status, body = healthz(http_port)
            if status == 200:
                break
            assert status == 503, body
            assert "WATCHDOG=1" not in sent, "petted the watchdog while stalled"
            assert time.monotonic() - stalled_at < BURST_WAIT, herald.tail()
            time.sleep(0.05)
        stalled_for = time.monotonic() - stalled_at
        # The utterance has seconds of audio left: it was not ended on the first look.
        assert stalled_for > WATCHDOG_SECONDS, f"stalled for only {stalled_for:.2f} s"
        ended = c.wait_event("stuck")
        assert ended["event"] == "error" and "stopped taking audio" in ended["error"], ended
        assert [e["event"] for e in c.events("stuck")] == ["queued", "started", "error"]
        herald.wait_log("stopped taking audio")
        herald.wait_log("stuck failed: speaker unavailable")

        # The device plays again (in real time): herald recovers by itself.
        device = Pacer(str(fifo), str(tmp_path / "heard.raw"), RATE * 2)
        os.close(held)
        held = -1
        c.say(id="after", text=AFTER)
        assert c.wait_event("after")["event"] == "finished", herald.tail()
        assert healthz(http_port)[0] == 200
        assert "WATCHDOG=1" in notify.received(timeout=5), "the watchdog did not resume"
        heard = as_samples(Path(device.out.name).read_bytes())
        assert int((heard != 0).sum()) > 0.5 * RATE, "the next say was not heard"
        assert herald.proc.poll() is None, herald.tail()
    finally:
        c.close()
        herald.kill()
        if device is not None:
            device.stop()
        if held >= 0:
            os.close(held)
        notify.close()
        print(herald.tail())

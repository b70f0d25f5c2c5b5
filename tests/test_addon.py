"""The Home Assistant add-on (addon/herald): its start script run against a stand-in for the
two Supervisor endpoints it uses, answering as the Supervisor's API documentation shows
(``{"result": "ok", "data": {...}}``, errors as HTTP 400 with ``"result": "error"``), and its
config.yaml and translations checked against each other. No container is built here; the
image itself is checked by scripts/image-check."""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT

from bench.net import free_port
from daemon.settings import load_settings

ADDON = ROOT / "addon" / "herald"
TOKEN = "s3cr3t-supervisor-token"
BROKER = {"addon": "core_mosquitto", "host": "172.30.32.1", "port": "1883", "ssl": False,
          "username": "addons", "password": "pa55-word", "protocol": "3.1.1"}

# Stands in for herald: opens the Wyoming port only after a while (a voice loading), says on
# its standard output when it did, its PID and user and which HERALD_ variables it got, then
# waits.
FAKE_HERALD = """
import json, os, socket, sys, time
port = int(sys.argv[1])
time.sleep(1.0)
server = socket.create_server(("127.0.0.1", port))
print(json.dumps({"pid": os.getpid(), "uid": os.getuid(), "listening_at": time.time(),
                  "herald_env": sorted(k for k in os.environ if k.startswith("HERALD_"))}),
      flush=True)
server.settimeout(30)
while True:
    try:
        server.accept()[0].close()
    except TimeoutError:
        break
"""


@dataclass
class Call:
    method: str
    path: str
    authorization: str
    body: Any
    at: float


@dataclass
class Supervisor:
    """What the stand-in was asked; ``mqtt`` is the broker it answers with (None: no
    Mosquitto add-on)."""

    url: str
    mqtt: dict[str, Any] | None
    calls: list[Call] = field(default_factory=list)
    posted: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def supervisor(request: pytest.FixtureRequest) -> Iterator[Supervisor]:
    state = Supervisor("", getattr(request, "param", BROKER))

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _record(self) -> Call:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            call = Call(self.command, self.path, self.headers.get("Authorization", ""),
                        json.loads(raw) if raw else None, time.time())
            state.calls.append(call)
            return call

        def _authorized(self, call: Call) -> bool:
            if call.authorization == f"Bearer {TOKEN}":
                return True
            self._answer(401, {"result": "error", "message": "Unauthorized"})
            return False

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            call = self._record()
            if not self._authorized(call):
                return
            if call.path == "/services/mqtt" and state.mqtt is not None:
                self._answer(200, {"result": "ok", "data": state.mqtt})
            elif call.path == "/services/mqtt":
                self._answer(400, {"result": "error",
                                   "message": "No mqtt service available"})
            else:
                self._answer(404, {"result": "error", "message": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            call = self._record()
            if not self._authorized(call):
                return
            if call.path == "/discovery":
                self._answer(200, {"result": "ok", "data": {"uuid": "4f1c9c2e"}})
                state.posted.set()
            else:
                self._answer(404, {"result": "error", "message": "not found"})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@dataclass
class Started:
    proc: subprocess.Popen[bytes]
    config: Path
    port: int

    def herald(self) -> dict[str, Any]:
        """What the fake herald said once its port was open."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read().decode() if self.proc.stderr else ""
        return dict(json.loads(line))


# Started as root (as in the add-on), the script hands /data to a user and becomes it; here
# that user is nobody, whom every system has, running the system's Python (the start script
# needs only the standard library; nobody cannot read a virtual environment under /root).
SYSTEM_PYTHON = Path("/usr/bin/python3")
if os.getuid() == 0 and SYSTEM_PYTHON.is_file():
    USER, PYTHON = "nobody", str(SYSTEM_PYTHON)
else:
    USER, PYTHON = pwd.getpwuid(os.getuid()).pw_name, sys.executable


@pytest.fixture
def start(tmp_path: Path, supervisor: Supervisor) -> Iterator[Any]:
    """Run the add-on's start script with these options; it execs the fake herald."""
    procs: list[subprocess.Popen[bytes]] = []

    def run(options: dict[str, Any]) -> Started:
        port = free_port()
        options = {**options, "wyoming_port": port}
        (tmp_path / "options.json").write_text(json.dumps(options))
        env = {**os.environ, "SUPERVISOR_URL": supervisor.url, "SUPERVISOR_TOKEN": TOKEN,
               "HERALD_WYOMING__URI": "tcp://0.0.0.0:10200"}  # as the image sets it
        proc = subprocess.Popen(
            [PYTHON, str(ADDON / "start.py"), "--options", str(tmp_path / "options.json"),
             "--data", str(tmp_path), "--user", USER, "--discovery-timeout", "30", "--",
             PYTHON, "-c", FAKE_HERALD, str(port)],
            env=env, cwd="/", start_new_session=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        procs.append(proc)
        return Started(proc, tmp_path / "herald.toml", port)

    yield run
    for proc in procs:  # the fake herald and the announcing child: one session
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


OPTIONS = {"voice": "en_US-joe-medium", "speaker": True, "volume": 0.6, "http_port": 8123,
           "log_level": "debug", "mqtt": True}


def test_options_become_config_broker_from_supervisor_and_wyoming_announced(
        start: Any, supervisor: Supervisor, tmp_path: Path) -> None:
    run = start(OPTIONS)
    herald = run.herald()
    assert supervisor.posted.wait(20)

    # herald replaced the start script (same PID: what Docker signals is herald), as the
    # user, without the image's HERALD_ variables, which would override the file.
    assert herald["pid"] == run.proc.pid
    assert herald["uid"] == pwd.getpwnam(USER).pw_uid
    assert herald["herald_env"] == []
    assert run.config.stat().st_uid == herald["uid"]  # herald can read its configuration

    config = tomllib.loads(run.config.read_text())
    assert config["log_level"] == "DEBUG"
    assert config["voices"] == {"directories": [str(tmp_path / "voices")],
                                "default": "en_US-joe-medium"}
    assert config["speaker"] == {"enabled": True, "volume": 0.6}
    assert config["wyoming"]["uri"] == f"tcp://0.0.0.0:{run.port}"
    # Home Assistant's own network reaches the Wyoming server
    allowed = [ipaddress.ip_network(a) for a in config["wyoming"]["allow"]]
    assert any(ipaddress.ip_network("172.30.32.0/23").subnet_of(n) for n in allowed
               if n.version == 4)
    assert config["http"] == {"host": "0.0.0.0", "port": 8123}
    assert config["state"] == {"directory": str(tmp_path / "state")}
    assert config["mqtt"] == {"enabled": True, "host": "172.30.32.1", "port": 1883,
                              "username": "addons", "password": "pa55-word",
                              "protocol": "3.1.1"}
    assert run.config.stat().st_mode & 0o077 == 0  # it holds the broker's password
    # herald itself accepts it, every key and value
    settings = load_settings(run.config, environ={})
    assert settings.mqtt.host == "172.30.32.1" and settings.mqtt.protocol == "3.1.1"
    assert settings.speaker.volume == 0.6 and settings.http.port == 8123

    # both calls carried the token; the announcement came once the port was open
    assert [(c.method, c.path) for c in supervisor.calls] == [("GET", "/services/mqtt"),
                                                              ("POST", "/discovery")]
    assert all(c.authorization == f"Bearer {TOKEN}" for c in supervisor.calls)
    post = supervisor.calls[1]
    assert re.fullmatch(r"tcp://[^:/]+:(\d+)", post.body["config"]["uri"])
    assert post.body == {"service": "wyoming",
                         "config": {"uri": f"tcp://{os.uname().nodename}:{run.port}"}}
    assert post.at >= herald["listening_at"]


@pytest.mark.parametrize("supervisor", [None], indirect=True)
def test_without_mosquitto_herald_runs_without_mqtt(start: Any, supervisor: Supervisor
                                                    ) -> None:
    run = start(OPTIONS)
    run.herald()
    assert supervisor.posted.wait(20)
    config = tomllib.loads(run.config.read_text())
    assert config["mqtt"] == {"enabled": False}
    assert not load_settings(run.config, environ={}).mqtt.enabled
    assert [(c.method, c.path) for c in supervisor.calls] == [("GET", "/services/mqtt"),
                                                              ("POST", "/discovery")]


def test_mqtt_off_asks_the_supervisor_for_no_broker(start: Any, supervisor: Supervisor
                                                    ) -> None:
    run = start({**OPTIONS, "mqtt": False, "speaker": False, "voice": ""})
    run.herald()
    assert supervisor.posted.wait(20)
    config = tomllib.loads(run.config.read_text())
    assert config["mqtt"] == {"enabled": False}
    assert config["speaker"]["enabled"] is False
    assert load_settings(run.config, environ={}).voices.default is None  # the bundled one
    assert [(c.method, c.path) for c in supervisor.calls] == [("POST", "/discovery")]


# --- config.yaml, checked as the Supervisor reads it -------------------------------------

def _valid(value: Any, rule: str) -> bool:
    """Whether ``value`` passes one of the Supervisor's schema rules (the add-on
    configuration documentation lists them: str, bool, int, float, port, list(...))."""
    rule = rule.removesuffix("?")
    kind, _, args = rule.partition("(")
    args = args.removesuffix(")")
    if kind == "list":
        return value in args.split("|")
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "port":
        return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535
    if kind in ("int", "float"):
        types = (int,) if kind == "int" else (int, float)
        if not isinstance(value, types) or isinstance(value, bool):
            return False
        low, _, high = args.partition(",")
        return ((not low or value >= float(low)) and (not high or value <= float(high)))
    if kind == "str":
        low, _, high = args.partition(",")
        return isinstance(value, str) and (not low or len(value) >= int(low)) and (
            not high or len(value) <= int(high))
    raise AssertionError(f"schema rule {rule!r} is not one this test knows")


def test_config_yaml_options_meet_their_schema() -> None:
    config = yaml.safe_load((ADDON / "config.yaml").read_text())
    for key in ("name", "version", "slug", "description", "arch"):
        assert config.get(key), key
    assert set(config["arch"]) == {"amd64", "aarch64"}
    assert config["discovery"] == ["wyoming"] and "mqtt:want" in config["services"]
    assert config["audio"] is True
    assert set(config["options"]) == set(config["schema"])
    for key, value in config["options"].items():
        assert _valid(value, config["schema"][key]), (key, value, config["schema"][key])
    assert not _valid(1.5, config["schema"]["volume"])  # the rule checks something
    # what the start script reads is what the options offer
    source = (ADDON / "start.py").read_text()
    for key in config["options"]:
        assert f'"{key}"' in source or f"'{key}'" in source, key
    assert set(yaml.safe_load((ROOT / "repository.yaml").read_text())) >= {"name"}


def test_translations_cover_every_option_and_port() -> None:
    config = yaml.safe_load((ADDON / "config.yaml").read_text())
    for path in (ADDON / "translations").glob("*.yaml"):
        text = yaml.safe_load(path.read_text())
        assert set(text["configuration"]) == set(config["options"]), path.name
        for key, entry in text["configuration"].items():
            assert entry.get("name") and entry.get("description"), (path.name, key)
        assert set(text["network"]) == set(config["ports"]), path.name
    assert (ADDON / "translations" / "en.yaml").is_file()
    for name in ("icon.png", "logo.png"):
        assert (ADDON / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name

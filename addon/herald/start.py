#!/opt/herald/bin/python
"""The Home Assistant add-on's start: the add-on's options become herald's configuration,
Home Assistant is told where herald's Wyoming server is, and herald replaces this process.

Home Assistant's Supervisor writes the options the user chose to ``/data/options.json`` and
gives the add-on a token (``SUPERVISOR_TOKEN``) for its API at ``http://supervisor``. Two of
its endpoints are used, as the add-on developer documentation describes them:

* ``GET /services/mqtt``: the broker (host, port, user, password, ssl, protocol) when the
  Mosquitto add-on provides the ``mqtt`` service (config.yaml asks for it with
  ``services: [mqtt:want]``). Without one, MQTT is switched off: herald's embedded broker
  listens only inside the add-on, where nothing could use it.
* ``POST /discovery`` with ``{"service": "wyoming", "config": {"uri": "tcp://HOST:PORT"}}``
  once herald's Wyoming port accepts connections, so that Home Assistant offers to add it
  (config.yaml declares ``discovery: [wyoming]``). Announcing earlier would have Home
  Assistant try a server that is still loading its voice.

Every answer of the Supervisor is ``{"result": "ok"|"error", "data": ..., "message": ...}``.

herald must stay the process Docker signals (so that SIGTERM stops it cleanly), so this
process ``exec``s herald instead of supervising it; the announcement is made by a child
process forked just before, which waits for the port, posts, and exits (Docker's init,
``init: true`` by default for add-ons, reaps it). Running as root, this drops to the user
``herald`` before either, having given it /data.

``SUPERVISOR_URL`` replaces ``http://supervisor`` (a test points it at a stand-in), and the
arguments name the files and the command, so that all of this runs outside Home Assistant.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_SUPERVISOR = "http://supervisor"
# Clients admitted to the Wyoming server: Home Assistant's own network (172.30.32.0/23) is in
# 172.16.0.0/12; the other private ranges are the LAN reaching the add-on's host port.
PRIVATE_NETWORKS = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "::1/128",
                    "fc00::/7", "fe80::/10"]
USER = "herald"


def log(message: str) -> None:
    """One line on the add-on's log (Home Assistant shows the container's output)."""
    print(f"herald-addon: {message}", file=sys.stderr, flush=True)


class Supervisor:
    """The two Supervisor endpoints the add-on uses, with its token."""

    def __init__(self, base_url: str, token: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None
              ) -> dict[str, Any]:
        """The ``data`` of an ``ok`` answer; raise OSError with the Supervisor's message
        for anything else (the caller decides what a failure means)."""
        request = urllib.request.Request(
            self.base_url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                payload = json.load(answer)
        except urllib.error.HTTPError as e:  # 400 with {"result": "error", "message": ...}
            try:
                message = json.load(e).get("message") or e.reason
            except ValueError:
                message = e.reason
            raise OSError(f"{method} {path}: {e.code} {message}") from None
        except ValueError as e:
            raise OSError(f"{method} {path}: not JSON ({e})") from None
        if not isinstance(payload, dict) or payload.get("result") != "ok":
            message = payload.get("message") if isinstance(payload, dict) else payload
            raise OSError(f"{method} {path}: {message}")
        data = payload.get("data")
        return data if isinstance(data, dict) else {}

    def mqtt_service(self) -> dict[str, Any] | None:
        """The broker the Mosquitto add-on provides, or None when there is none."""
        try:
            return self._call("GET", "/services/mqtt") or None
        except OSError as e:
            log(f"no MQTT service from the Supervisor ({e})")
            return None

    def announce(self, service: str, config: Mapping[str, Any]) -> str:
        """Post a discovery message; its uuid."""
        data = self._call("POST", "/discovery", {"service": service, "config": dict(config)})
        return str(data.get("uuid", ""))


def mqtt_settings(use_mqtt: bool, service: Mapping[str, Any] | None) -> dict[str, Any]:
    """herald's [mqtt] section from the option and the Supervisor's broker."""
    if not use_mqtt:
        return {"enabled": False}
    if not service:
        log("MQTT is on but Home Assistant has no MQTT broker (install the Mosquitto add-on); "
            "herald runs without MQTT")
        return {"enabled": False}
    section: dict[str, Any] = {"enabled": True, "host": str(service["host"]),
                               "port": int(service.get("port") or 1883)}
    if service.get("username"):
        section["username"] = str(service["username"])
    if service.get("password"):
        section["password"] = str(service["password"])
    if service.get("protocol"):
        section["protocol"] = str(service["protocol"])
    if service.get("ssl"):
        section["tls"] = {"enabled": True}
    return section


def herald_config(options: Mapping[str, Any], mqtt: Mapping[str, Any], data: Path
                  ) -> dict[str, Any]:
    """herald's configuration for the add-on's options (config.yaml documents them)."""
    return {
        "log_level": str(options.get("log_level", "info")).upper(),
        "voices": {"directories": [str(data / "voices")],
                   "default": str(options.get("voice") or "")},
        "speaker": {"enabled": bool(options.get("speaker", True)),
                    "volume": float(options.get("volume", 1.0))},
        "wyoming": {"uri": f"tcp://0.0.0.0:{int(options.get('wyoming_port', 10200))}",
                    "allow": PRIVATE_NETWORKS},
        "http": {"host": "0.0.0.0", "port": int(options.get("http_port", 8000))},
        "state": {"directory": str(data / "state")},
        "mqtt": dict(mqtt),
    }


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def to_toml(config: Mapping[str, Any], prefix: str = "") -> str:
    """TOML for a configuration of scalars, lists and nested sections (the standard
    library reads TOML but does not write it)."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in config.items()
             if not isinstance(value, Mapping)]
    for key, value in config.items():
        if isinstance(value, Mapping):
            lines += ["", f"[{prefix}{key}]", to_toml(value, f"{prefix}{key}.").strip("\n")]
    return "\n".join(lines) + "\n"


def wait_for_port(port: int, timeout: float, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on the port within the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=2):
                return True
        except OSError:
            time.sleep(0.5)
    return False


def announce_when_up(supervisor: Supervisor, port: int, timeout: float) -> int:
    """The announcing child's work: wait for the Wyoming port, post the discovery."""
    if not wait_for_port(port, timeout):
        log(f"herald's Wyoming port {port} did not open within {timeout:.0f} s; "
            "Home Assistant was not told about it")
        return 1
    uri = f"tcp://{socket.gethostname()}:{port}"
    for attempt in range(3):
        try:
            uuid = supervisor.announce("wyoming", {"uri": uri})
            log(f"announced the Wyoming server {uri} to Home Assistant (discovery {uuid})")
            return 0
        except OSError as e:
            log(f"discovery failed ({e})" + ("; retrying" if attempt < 2 else ""))
            time.sleep(2 ** attempt)
    return 1


def drop_privileges(name: str, data: Path, config: Path) -> None:
    """As root: give /data and the configuration to the user and become it (herald never
    runs as root). The image has the user; a missing one stops the add-on rather than
    leave herald running as root."""
    if os.getuid() != 0:
        return
    user = pwd.getpwnam(name)
    for path in (data, data / "state", data / "voices", data / "cache"):
        path.mkdir(exist_ok=True)
        os.chown(path, user.pw_uid, user.pw_gid)
    os.chown(config, user.pw_uid, user.pw_gid)
    os.initgroups(name, user.pw_gid)
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    os.environ.update(HOME=user.pw_dir, USER=name, LOGNAME=name)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="herald-addon", description=__doc__.split("\n")[0])
    parser.add_argument("--options", type=Path, default=Path("/data/options.json"))
    parser.add_argument("--data", type=Path, default=Path("/data"),
                        help="the add-on's volume: state, voices")
    parser.add_argument("--config", type=Path, default=None,
                        help="herald's configuration to write (default DATA/herald.toml)")
    parser.add_argument("--user", default=USER,
                        help="the user herald runs as, when started as root")
    parser.add_argument("--discovery-timeout", type=float, default=900.0,
                        help="seconds to wait for the Wyoming port (a Pi loads slowly)")
    parser.add_argument("command", nargs="*",
                        help="what to exec (default: herald run --config CONFIG)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config_path = args.config or args.data / "herald.toml"
    try:
        options = json.loads(args.options.read_text())
    except (OSError, ValueError) as e:
        log(f"cannot read the add-on's options {args.options}: {e}")
        return 1
    supervisor = Supervisor(os.environ.get("SUPERVISOR_URL", DEFAULT_SUPERVISOR),
                            os.environ.get("SUPERVISOR_TOKEN", ""))
    use_mqtt = bool(options.get("mqtt", True))
    mqtt = mqtt_settings(use_mqtt, supervisor.mqtt_service() if use_mqtt else None)
    if mqtt.get("enabled"):
        log(f"MQTT broker {mqtt['host']}:{mqtt['port']} from the Supervisor")
    config = herald_config(options, mqtt, args.data)
    config_path.write_text(to_toml(config))
    config_path.chmod(0o600)  # it holds the broker's password
    try:
        drop_privileges(args.user, args.data, config_path)
    except (KeyError, OSError) as e:
        log(f"cannot run herald as the user {args.user}: {e}")
        return 1
    command = args.command or ["herald", "run", "--config", str(config_path)]
    # The image's HERALD_… variables would override the file (the environment ranks above
    # it): the options are the add-on's whole configuration.
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("HERALD_")}
    port = int(options.get("wyoming_port", 10200))
    if os.fork() == 0:  # the announcing child; herald takes over this process's PID
        os._exit(announce_when_up(supervisor, port, args.discovery_timeout))
    log(f"starting: {' '.join(command)}")
    os.execvpe(command[0], command, env)
    return 1  # not reached: exec replaces this process


if __name__ == "__main__":
    sys.exit(main())

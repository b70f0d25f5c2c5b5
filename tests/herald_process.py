"""``herald run`` as a subprocess, the way systemd runs it: its own config file, its log in a
file, an environment without the tester's ``HERALD_*`` variables (and with, say, an ALSA
configuration that points the default sound device at a file).

Every test that starts the daemon starts it here, so they all start it the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT

LOG_TAIL = 3000  # characters of herald's log shown when a test fails


def herald_env(extra: dict[str, str] | None = None, base: dict[str, str] | None = None
               ) -> dict[str, str]:
    """``base`` (default: this process's environment) without ``HERALD_*``, plus ``extra``:
    only the config file the test wrote configures herald."""
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith("HERALD_")}
    env.update(extra or {})
    return env


@dataclass
class HeraldProcess:
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        return self.output()[-LOG_TAIL:]

    def wait_log(self, text: str, timeout: float = 60.0) -> str:
        """Wait until ``text`` is in the log; returns the first line that has it. Fails with
        the log if herald exits first or ``timeout`` (a hang guard) runs out."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.output().splitlines():
                if text in line:
                    return line
            if self.proc.poll() is not None:
                pytest.fail(f"herald exited ({self.proc.returncode}) before logging {text!r}:"
                            f"\n{self.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"herald did not log {text!r} within {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.1)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, as systemd stops it; the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def stop_all_still_running(heralds: Iterable[HeraldProcess], why: str) -> None:
    """Each herald must still be running (``why`` says why it should be) and must then stop
    cleanly on SIGTERM."""
    for h in heralds:
        assert h.proc.poll() is None, f"{why}:\n{h.tail()}"
        assert h.terminate() == 0, h.tail()


def mqtt_only_config(device: str, port: int, mqtt: str = "") -> str:
    """A config for a herald on the broker at ``port`` with only the MQTT front and MQTT
    audio (no speaker, Wyoming or HTTP); ``mqtt``: more lines of its ``[mqtt]`` section."""
    return (f'device_id = "{device}"\n[mqtt]\nhost = "127.0.0.1"\nport = {port}\n{mqtt}\n'
            "[speaker]\nenabled = false\n[wyoming]\nenabled = false\n"
            "[http]\nenabled = false\n")


def start_herald(config: Path, log: Path, env: dict[str, str] | None = None) -> HeraldProcess:
    """``herald run --config CONFIG``, its output into ``log``. Doesn't wait: a test waits
    for what it needs (online on MQTT, a log line). Its state directory is beside the config
    (as systemd's ``StateDirectory=`` gives one), unless ``env`` names another: one test's
    ``set/voice`` never reaches another test's daemon."""
    env = dict(env if env is not None else herald_env())
    env.setdefault("STATE_DIRECTORY", str(config.parent / "state"))
    proc = subprocess.Popen([sys.executable, "-m", "daemon.cli", "run", "--config", str(config)],
                            cwd=ROOT, env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return HeraldProcess(proc, log)

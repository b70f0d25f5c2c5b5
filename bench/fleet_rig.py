"""The fleet benchmark's processes: a Mosquitto speaking MQTT 5 on a free loopback port,
workers and satellites as separate ``herald run`` processes, and what the benchmark reads of
them from outside: their logs (with timestamps), their memory and the broker's CPU time.

Satellites run without a model, HTTP, Wyoming or Home Assistant discovery; their speaker
plays to ALSA's ``null`` device (``ALSA_CONFIG_PATH``), which takes audio as fast as it is
written. Workers run one torch thread and one synthesis worker each (``voices.threads = 1``,
``voices.workers = 1``): one worker is one core.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from bench.net import alsa_config, free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent
FLEET = "herald/fleet"  # fleet.topic: the default
STOP_TIMEOUT = 60.0  # seconds the nodes have to stop on SIGTERM before they are killed
KILL_TIMEOUT = 30.0  # seconds the kernel has to end them after SIGKILL
# The scheduler's line when a request enters a node: on a satellite, for a group
# announcement, when the stream's ``start`` arrived (the worker sends it with chunk 0); for
# its own ``say``, when the say arrived.
QUEUED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO daemon\.jobs\.scheduler: "
                    r"\[[^\]]*\] (\S+) queued from (\w+)")
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Node:
    """One ``herald run``, and what the benchmark reads of it."""

    device: str
    role: str
    proc: subprocess.Popen[bytes]
    log: Path
    queued: dict[str, float] = field(default_factory=dict)  # request id -> wall clock
    _read: int = 0  # bytes of the log parsed so far

    def queued_at(self, request_id: str) -> float | None:
        """Wall-clock time (its log's, to the millisecond) this node's scheduler took the
        request ``request_id`` in, or None if its log does not say so yet."""
        if request_id not in self.queued:
            with self.log.open("rb") as f:
                f.seek(self._read)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line being written is read next time
            self._read += end
            for line in data[:end].decode(errors="replace").splitlines():
                m = QUEUED.match(line)
                if m:
                    stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    self.queued.setdefault(m.group(2), stamp)
        return self.queued.get(request_id)

    def trouble(self, request_id: str) -> list[str]:
        """This node's warnings and errors about ``request_id`` (its log's lines)."""
        text = self.log.read_text(errors="replace")
        return [line for line in text.splitlines()
                if f"[{request_id}]" in line and (" WARNING " in line or " ERROR " in line)]

    def memory_kb(self) -> dict[str, int]:
        """Resident memory now (rss), its high-water mark (hwm) and the proportional share
        (pss: a page shared by k processes counts 1/k), in KiB."""
        out: dict[str, int] = {}
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out["rss" if key == "VmRSS" else "hwm"] = int(value.split()[0])
            for line in Path(f"/proc/{self.proc.pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    out["pss"] = int(line.split()[1])
        return out

    def tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def cpu_seconds(pid: int) -> tuple[float, float]:
    """A process's CPU time: (from /proc/<pid>/schedstat, to the nanosecond, of its main
    thread, which for single-threaded Mosquitto is all of it; from /proc/<pid>/stat, utime
    + stime, in clock ticks)."""
    sched = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sched, (int(fields[11]) + int(fields[12])) / CLOCK_TICK


class Rig:
    """The broker and the heralds, all stopped by ``close``."""

    def __init__(self, work: Path) -> None:
        if not shutil.which("mosquitto"):
            raise SystemExit("mosquitto is not installed (scripts/setup --test installs it)")
        self.work = work
        self.port = free_port()
        self.alsa = alsa_config(work, "{ type null }")  # no file behind it
        self.nodes: dict[str, Node] = {}
        conf = work / "mosquitto.conf"
        # sys_interval 1: the $SYS counters the fan-out figures come from, every second.
        conf.write_text(f"user root\nlistener {self.port} 127.0.0.1\nallow_anonymous true\n"
                        "sys_interval 1\nmax_queued_messages 10000\n"
                        f"log_dest file {work}/mosquitto.log\nlog_type error\n"
                        "log_type warning\n")
        self.broker = subprocess.Popen(["mosquitto", "-c", str(conf)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, 15.0)

    def config(self, device: str, role: str, groups: list[str], slots: int) -> str:
        common = (f'device_id = "{device}"\n[node]\nrole = "{role}"\n'
                  f'[mqtt]\nhost = "127.0.0.1"\nport = {self.port}\n'
                  "[mqtt.discovery]\nenabled = false\n"
                  "[wyoming]\nenabled = false\n[http]\nenabled = false\n"
                  f"[fleet]\ntopic = \"{FLEET}\"\ngroups = {json.dumps(groups)}\n")
        if role == "worker":
            return common + f"slots = {slots}\n[voices]\nthreads = 1\nworkers = 1\n"
        return common

    def start(self, device: str, role: str, groups: list[str] = (),  # type: ignore[assignment]
              slots: int = 0) -> Node:
        """``herald run`` for ``device`` (not waited for: see ``bench.fleet_probe``)."""
        d = self.work / device
        d.mkdir(exist_ok=True)
        (d / "herald.toml").write_text(self.config(device, role, list(groups), slots))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERALD_")}
        env |= {"ALSA_CONFIG_PATH": str(self.alsa), "STATE_DIRECTORY": str(d / "state")}
        log = d / f"herald-{len(list(d.glob('herald*.log')))}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon.cli", "run", "--config", str(d / "herald.toml")],
            cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        node = self.nodes[device] = Node(device, role, proc, log)
        return node

    def stop(self, device: str) -> None:
        node = self.nodes.pop(device)
        _terminate([node.proc])

    def check_running(self) -> None:
        """Every node still runs (one that died ends the benchmark with its log)."""
        for node in self.nodes.values():
            if node.proc.poll() is not None:
                raise SystemExit(f"{node.device} exited ({node.proc.returncode}):\n"
                                 f"{node.tail()}")
        if self.broker.poll() is not None:
            raise SystemExit(f"mosquitto exited ({self.broker.returncode})")

    def broker_cpu(self) -> tuple[float, float]:
        return cpu_seconds(self.broker.pid)

    def close(self) -> None:
        _terminate([n.proc for n in self.nodes.values()])
        self.nodes.clear()
        _terminate([self.broker])


def _terminate(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM, as systemd stops a herald; SIGKILL for any still running after
    ``STOP_TIMEOUT`` (50 processes tearing down at once on two busy cores take a while).
    Never raises: the figures are worth more than a clean stop."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for sig, timeout in ((signal.SIGKILL, STOP_TIMEOUT), (None, KILL_TIMEOUT)):
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in procs:
            if p.poll() is None and sig is not None:
                p.send_signal(sig)
    for p in procs:
        if p.poll() is None:
            print(f"pid {p.pid} ({' '.join(map(str, p.args))}) did not stop",  # type: ignore[arg-type]
                  file=sys.stderr)

"""Helpers shared by the benchmarks and the tests that start real servers: loopback ports,
and ALSA's default device pointed at a file (so herald's speaker runs with no sound card)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


def alsa_config(directory: Path, default: str) -> Path:
    """An ALSA configuration (for ``ALSA_CONFIG_PATH``) in ``directory``: the system's, with
    the default PCM defined as ``default`` (e.g. ``{ type null }``)."""
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "alsa.conf"
    conf.write_text(Path("/usr/share/alsa/alsa.conf").read_text()
                    + f"\npcm.!default {default}\n")
    return conf


def alsa_env(directory: Path, target: Path, base: Mapping[str, str] | None = None
             ) -> dict[str, str]:
    """``base`` (default: this process's environment), with ALSA's default PCM writing raw
    PCM into ``target`` (a file, a FIFO or /dev/null) through the ``file`` plugin in front of
    the null PCM. The configuration file goes into ``directory``."""
    conf = alsa_config(directory,
                       f'{{ type file slave.pcm "null" file "{target}" format "raw" }}')
    return dict(base if base is not None else os.environ, ALSA_CONFIG_PATH=str(conf))

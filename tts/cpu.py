"""What this CPU can run of the installed torch build, known before the first synthesis.

PyPI's torch for aarch64 is, from 2.11 on, a CUDA build that bundles NVIDIA's NVPL BLAS for
its matrix products. NVPL's multi-threaded kernels use the ARMv8.1 atomic instructions
(LSE, e.g. ``ldaddal``), which the Cortex-A72 and A53 lack (Raspberry Pi 4, 400, CM4, Pi 3,
Zero 2 W): the first matrix product run on two threads or more ends the process with
SIGILL. On one thread NVPL takes a path without them, so such a machine runs at one thread,
and says why. ``scripts/setup`` installs a CPU build, which has no NVPL; this guards the
installs it did not make.

The CPU's features come from the kernel's auxiliary vector (``AT_HWCAP``), not from
``/proc/cpuinfo``: it is what programs are meant to read, and under qemu-user it describes
the emulated CPU rather than the host's.
"""

from __future__ import annotations

import ctypes
import logging
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

_AT_HWCAP = 16
_HWCAP_ATOMICS = 1 << 8  # aarch64: LSE atomics (ARMv8.1)


@dataclass(frozen=True)
class ThreadLimit:
    """At most ``threads`` intra-op threads, because ``reason``."""

    threads: int
    reason: str


def thread_limit(machine: str, hwcap: int, torch_libraries: Iterable[str]) -> ThreadLimit | None:
    """The limit for a CPU (``platform.machine()``, its ``AT_HWCAP``) and a torch build (the
    file names in its ``lib`` directory), or None when any thread count is safe."""
    if machine not in ("aarch64", "arm64") or hwcap & _HWCAP_ATOMICS:
        return None
    if not any(name.startswith("libnvpl_blas") for name in torch_libraries):
        return None
    return ThreadLimit(1, "this CPU lacks the ARMv8.1 atomic instructions that the installed "
                          "torch build's NVPL BLAS needs on more than one thread (a CUDA build; "
                          "scripts/setup installs the CPU build, which runs on two)")


def _hwcap() -> int:
    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):  # not glibc or musl: no auxiliary vector to read
        return 0
    getauxval.restype = ctypes.c_ulong
    getauxval.argtypes = [ctypes.c_ulong]
    return int(getauxval(_AT_HWCAP))


@cache
def machine_thread_limit() -> ThreadLimit | None:
    """This machine's limit, logged once where there is one."""
    machine = platform.machine()
    if machine not in ("aarch64", "arm64"):
        return None
    import torch

    libs = Path(torch.__file__).parent / "lib"
    limit = thread_limit(machine, _hwcap(), (p.name for p in libs.iterdir()))
    if limit is not None:
        log.warning("torch runs on %d thread: %s", limit.threads, limit.reason)
    return limit


def usable_threads(n: int) -> int:
    """``n`` intra-op threads, or fewer where this machine cannot run that many."""
    limit = machine_thread_limit()
    return n if limit is None else min(n, limit.threads)

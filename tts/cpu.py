"""What this CPU can run of the installed torch build, found out before torch is imported.

PyTorch's aarch64 builds have more than once used instructions that the Cortex-A72 and A53
lack (the ARMv8.1 atomics, e.g. ``ldaddal``): PyPI's 2.10.0 dies at ``import torch`` on a
Raspberry Pi 4 (as 2.4.0 and 2.6.0 did), and PyPI's CUDA builds from 2.11 on bundle NVIDIA's
NVPL BLAS, whose multi-threaded kernels die at the first matrix product on two threads. A
process killed by SIGILL cannot say why, so on such a CPU herald first runs a short probe in
a child process: import torch, then the kinds of operation synthesis runs, on one thread and
on two. Its verdict (any thread count, one thread only, or not at all) is kept per torch
build and CPU in herald's cache directory, so the probe's seconds are spent once.

CPUs with the ARMv8.1 atomics (Pi 5, servers) and other architectures are not probed. The
CPU's features come from the kernel's auxiliary vector (``AT_HWCAP``), not from
``/proc/cpuinfo``: it is what programs are meant to read, and under qemu-user it describes
the emulated CPU rather than the host's.

Nothing here imports torch: ``require_runnable_torch`` runs before anything else does.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import logging
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

_AT_HWCAP = 16
_HWCAP_ATOMICS = 1 << 8  # aarch64: the ARMv8.1 atomics (LSE)
PROBE_TIMEOUT = 600.0  # seconds; an emulated CPU imports torch in a minute or more
FIX = ("run scripts/setup, which installs a torch build that runs here (the CPU build from "
       "PyTorch's index, or torch 2.9.1 from PyPI)")

# What synthesis runs, at the sizes it runs them: batched matrix products (attention) and
# 1-D convolutions, on one thread, then on two. Each stage reached is printed at once, so the
# output tells how far the child got before a signal ended it.
PROBE = """
import torch
print("import", flush=True)
for n in (1, 2):
    torch.set_num_threads(n)
    x = torch.randn(2, 192, 192)
    torch.baddbmm(x, x, x)
    torch.nn.functional.conv1d(torch.randn(1, 192, 512), torch.randn(192, 192, 5), padding=2)
    print(n, flush=True)
"""


class TorchUnusable(SystemExit):
    """The installed torch build cannot run on this CPU at all. A SystemExit: there is
    nothing any caller could do about it but say so, and the alternative is a SIGILL."""


@dataclass(frozen=True)
class ThreadLimit:
    """At most ``threads`` intra-op threads, because ``reason``."""

    threads: int
    reason: str


def probe_verdict(returncode: int, output: str) -> ThreadLimit | None:
    """The verdict from the probe child's exit status and output: None when it ran through
    (or failed for a reason that is not the CPU's, which ``import torch`` will report itself).
    Raises TorchUnusable when even one thread dies."""
    reached = output.split()
    if returncode == 0 and "2" in reached:
        return None
    if returncode >= 0 and "import" not in reached:
        return None  # not a signal: torch missing or broken, which its own import reports
    if "1" not in reached:
        where = "at import" if "import" not in reached else "on one thread"
        raise TorchUnusable(f"herald: the installed torch cannot run on this CPU: it dies "
                            f"{where} ({_signal_name(returncode)}): {FIX}")
    return ThreadLimit(1, f"the installed torch build dies on this CPU on two threads "
                          f"({_signal_name(returncode)}); for two threads, {FIX}")


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def _hwcap() -> int:
    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):  # not glibc or musl: no auxiliary vector to read
        return 0
    getauxval.restype = ctypes.c_ulong
    getauxval.argtypes = [ctypes.c_ulong]
    return int(getauxval(_AT_HWCAP))


def needs_probe(machine: str, hwcap: int) -> bool:
    """Only an aarch64 CPU without the ARMv8.1 atomics (Pi 3 and 4, Zero 2 W) is probed."""
    return machine in ("aarch64", "arm64") and not hwcap & _HWCAP_ATOMICS


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "herald" / "torch-probe.json"


def _probe_key(hwcap: int) -> str | None:
    try:
        dist = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    return f"{dist.version} {dist.locate_file('')} {hwcap:#x}"


def _run_probe() -> ThreadLimit | None:
    log.warning("checking once that torch runs on this CPU (ARMv8.0: no ARMv8.1 atomics); "
                "this takes a few seconds")
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return ThreadLimit(1, f"the torch probe did not finish in {PROBE_TIMEOUT:.0f} s")
    return probe_verdict(done.returncode, done.stdout)


@cache
def machine_thread_limit() -> ThreadLimit | None:
    """This machine's limit (probed, or read from the cache), logged once where there is
    one. Raises TorchUnusable where torch cannot run at all."""
    hwcap = _hwcap()
    if not needs_probe(platform.machine(), hwcap):
        return None
    key = _probe_key(hwcap)
    if key is None:
        return None
    limit = cached_verdict(_cache_file(), key, _run_probe)
    if limit is not None:
        log.warning("torch runs on %d thread here: %s", limit.threads, limit.reason)
    return limit


def cached_verdict(cache_file: Path, key: str,
                   probe: Callable[[], ThreadLimit | None]) -> ThreadLimit | None:
    """The verdict kept in ``cache_file`` for ``key`` (a torch build on a CPU), else
    ``probe``'s, kept there for next time; an unusable build's too (raised again)."""
    try:
        known = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        verdict = known[key]
        if verdict.get("unusable"):
            raise TorchUnusable(verdict["unusable"])
        return ThreadLimit(**verdict["limit"]) if verdict.get("limit") else None
    try:
        limit = probe()
    except TorchUnusable as e:
        known[key] = {"unusable": str(e.code)}
        _store(cache_file, known)
        raise
    known[key] = {"limit": asdict(limit) if limit else None}
    _store(cache_file, known)
    return limit


def _store(cache_file: Path, known: dict[str, object]) -> None:
    """Keep the verdicts where herald may write; where it may not, probe again next time."""
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(cache_file)
    except OSError as e:
        log.debug("torch probe verdict not cached: %s", e)


def require_runnable_torch() -> None:
    """Before torch is first imported: exit with what to do, rather than die by SIGILL."""
    machine_thread_limit()


def usable_threads(n: int) -> int:
    """``n`` intra-op threads, or fewer where this machine cannot run that many."""
    limit = machine_thread_limit()
    return n if limit is None else min(n, limit.threads)

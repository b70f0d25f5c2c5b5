"""How the threads that compute a synthesis are set up: one core each.

Every thread that runs torch computes on itself alone: torch's intra-op parallelism is off.
Split inside each operation, a window's hundreds of small operations each end at a barrier
where the threads wait for one another; a core taken by anything else (another process, or
this one's event loop) stalls every barrier, and a two-thread synthesis became slower than a
one-thread one beside a single busy process (bench/README.md). A synthesis uses more cores by
cutting its sentences into pieces that decode at the same time in helper processes
(``tts.pieces``, ``daemon.synthesis.helpers``), which never wait for one another mid-window.
Two places use more than one core within a process, both only while the other cores are
free (``tts.neighbours.core_free``): a sentence's text encoder, in a few large blocks before
its first audio, shared with a second thread (``tts.sharing``); and a short sentence that
nobody plays before it is all made, computed in one window with intra-op threads
(``intra_op``, ``tts.lanes``), where cutting it for a helper would compute its context twice.

Subnormal floats are flushed to zero on these threads: a quiet passage leaves the generator's
activations that small, and on x86 each operation on one costs tens of cycles more (a long
sentence's leaky ReLUs took 3-5 times as long on some inputs). Flushing them changes no sample
by more than 1e-38.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .memory import bound_kernel_cache, pin_allocator_thresholds, release_startup_code


def cores() -> int:
    """CPU cores this process may run on (its affinity, e.g. a systemd ``CPUAffinity``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_threads() -> int:
    """Cores one synthesis uses when none are configured (its own and its helpers'): all
    of them up to four. Beyond four, a sentence cut into more pieces pays for their context
    more often than it gains, and the cores left serve concurrent requests better."""
    return max(1, min(4, cores()))


def prepare_thread() -> None:
    """What a thread does before it first runs torch: one intra-op thread (a count torch
    keeps per thread), subnormals flushed to zero (a per-thread CPU flag)."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    torch.set_flush_denormal(True)


def prepare_process() -> None:
    """Set up this process for synthesis and its calling thread for computing: glibc's mmap
    and trim thresholds, oneDNN's kernel cache and the library code only start-up ran
    (``tts.memory``), then ``prepare_thread``. Every process that synthesizes calls this
    first, before it loads a voice."""
    pin_allocator_thresholds()
    bound_kernel_cache()
    release_startup_code()
    prepare_thread()


# A task of an OpenMP team (``GOMP_parallel``): one call on each of its threads.
_TEAM_TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _flush_subnormals(_: object) -> None:
    torch.set_flush_denormal(True)


_FLUSH_SUBNORMALS = _TEAM_TASK(_flush_subnormals)


@dataclass(frozen=True)
class _IntraOp:
    """The thread-local thread counts of the OpenMP runtime and of MKL that torch loaded."""

    omp: ctypes.CDLL
    mkl_local: Callable[[int], int]


@functools.cache
def _intra_op() -> _IntraOp | None:
    """The libraries torch computes with, as loaded (``/proc/self/maps``): GNU OpenMP, whose
    ``omp_set_num_threads`` is the calling thread's own, and MKL (in ``libtorch_cpu``), whose
    ``MKL_Set_Num_Threads_Local`` is too. None where either is missing (a torch build without
    MKL, as on ARM): there nothing computes on intra-op threads."""
    omp = mkl = None
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        name = os.path.basename(path)
        if omp is None and name.startswith("libgomp"):
            omp = path
        elif mkl is None and name.startswith("libtorch_cpu"):
            mkl = path
    if omp is None or mkl is None:
        return None
    try:
        gomp, lib = ctypes.CDLL(omp), ctypes.CDLL(mkl)
        mkl_local = lib.MKL_Set_Num_Threads_Local  # the C entry; the lower-case one is Fortran's
        gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
        gomp.GOMP_parallel.argtypes = [_TEAM_TASK, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        mkl_local.argtypes, mkl_local.restype = [ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return _IntraOp(gomp, mkl_local)


def intra_op_available() -> bool:
    """Whether ``intra_op`` can set this process's threads' counts one by one."""
    return _intra_op() is not None


@contextlib.contextmanager
def intra_op(threads: int) -> Iterator[bool]:
    """Let the calling thread's torch operations use ``threads`` cores for the block, the
    thread's own OpenMP and MKL counts set and put back after it; yields whether they could
    be (``_intra_op``). ``torch.set_num_threads`` would set MKL's count for every thread of
    the process: measured, a worker thread beside computed its products on two threads too.

    The OpenMP team's threads flush subnormals to zero as this one does (``prepare_thread``).
    A thread takes the floating-point mode of the thread that starts it, but the runtime
    keeps a thread's team from one parallel region to the next, and a team started before
    this thread was prepared would not flush them: so a region of the team's own sets the
    mode first (measured: half the products of subnormals came out subnormal without it)."""
    setup = _intra_op() if threads > 1 else None
    if setup is None:
        yield False
        return
    before = torch.get_num_threads()
    previous = setup.mkl_local(threads)
    setup.omp.omp_set_num_threads(threads)
    try:
        setup.omp.GOMP_parallel(_FLUSH_SUBNORMALS, None, threads, 0)
        yield True
    finally:
        setup.omp.omp_set_num_threads(before)
        setup.mkl_local(previous)

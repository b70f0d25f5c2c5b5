"""How the threads that compute a synthesis are set up: one core each.

Every thread that runs torch computes on itself alone: torch's intra-op parallelism is off.
Split inside each operation, a window's hundreds of small operations each end at a barrier
where the threads wait for one another; a core taken by anything else (another process, or
this one's event loop) stalls every barrier, and a two-thread synthesis became slower than a
one-thread one beside a single busy process (bench/README.md). A synthesis uses more cores by
cutting its sentences into pieces that decode at the same time in helper processes
(``tts.pieces``, ``daemon.synthesis.helpers``), which never wait for one another mid-window.
The one place two threads of a process compute together is a long sentence's text encoder,
in a few large blocks before its first audio, on a core that is free then (``tts.sharing``).

Subnormal floats are flushed to zero on these threads: a quiet passage leaves the generator's
activations that small, and on x86 each operation on one costs tens of cycles more (a long
sentence's leaky ReLUs took 3-5 times as long on some inputs). Flushing them changes no sample
by more than 1e-38.
"""

from __future__ import annotations

import os

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

"""Keeping a loaded voice's memory warm on hosts that let idle memory go cold.

Some virtual machines (measured on the development VM, a KVM guest) come back slowly to
memory the guest has not touched for a while: the host unmaps it from the guest's page
tables while idle, and the first touch of every 4 KiB page afterwards costs a fault in the
host, invisible to the guest (no page fault is counted). Summing 100 MB took 7 ms hot,
25 ms after 0.3 s of idle, 62 ms after 3 s. A voice is ~70 MB of weights that every first
chunk reads from start to end, so the first audio of a short command went from 47 ms hot
to 200-250 ms after 1-3 s of idle: a smart-home request nearly always comes after idle.

Reading one value in every page of the weights every 100 ms keeps them mapped: the same
first audio then came in 58-70 ms. A sweep costs about 2 ms of one core, so it is for such
hosts only; ``idle_slowdown`` measures whether this is one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Literal, get_args

import numpy as np
import torch
from torch import nn

log = logging.getLogger(__name__)

KeepWarm = Literal["auto", "on", "off"]  # "auto": measure idle_slowdown first, warm if it pays
KEEP_WARM_MODES: tuple[KeepWarm, ...] = get_args(KeepWarm)
PAGE = 4096  # bytes; the granularity the host maps memory back in
PROBE_IDLE = 0.5  # seconds ``idle_slowdown`` leaves its block untouched
# idle_slowdown() above this: the host lets idle memory go cold, and keeping it warm pays.
COLD_MEMORY_SLOWDOWN = 2.0


class WeightToucher:
    """Strided views that read one byte in every page of a set of tensors' storage."""

    def __init__(self, tensors: Iterable[torch.Tensor]) -> None:
        self.views: list[np.ndarray] = []
        seen: set[int] = set()
        for t in tensors:
            storage = t.untyped_storage()
            if storage.data_ptr() in seen or storage.nbytes() == 0 or t.device.type != "cpu":
                continue
            seen.add(storage.data_ptr())
            raw = torch.empty(0, dtype=torch.uint8).set_(storage)  # the whole storage, bytes
            self.views.append(raw.numpy()[::PAGE])

    @classmethod
    def of(cls, model: nn.Module) -> WeightToucher:
        """Every tensor a model holds: parameters, buffers, and the weight copies its modules
        cache in plain attributes (``vits.Upsample``'s polyphase weights, for one)."""
        tensors: list[torch.Tensor] = [*model.parameters(), *model.buffers()]
        for m in model.modules():
            tensors += [v for v in vars(m).values() if isinstance(v, torch.Tensor)]
        return cls(tensors)

    @property
    def pages(self) -> int:
        return sum(len(v) for v in self.views)

    def touch(self) -> int:
        """Read the pages; the sum is returned so that the reads are not dead code."""
        return sum(int(np.add.reduce(v, dtype=np.uint64)) for v in self.views)


def idle_slowdown(megabytes: int = 32, idle: float = PROBE_IDLE) -> float:
    """How much slower memory is to read after ``idle`` seconds untouched than hot (1.0 on
    bare metal; 2-10 on a host that lets idle guest memory go cold). Takes ``idle`` plus a
    few milliseconds; allocates ``megabytes``."""
    block = np.ones(megabytes * 1024 * 1024 // 8)
    block.sum()  # mapped and hot

    def timed() -> float:
        start = time.perf_counter()
        block.sum()
        return time.perf_counter() - start

    hot = min(timed() for _ in range(3))
    time.sleep(idle)
    return timed() / max(hot, 1e-9)


class Warmer:
    """Reads every page of some models' weights each ``interval`` seconds while idle, in a
    thread of its own (``start``, ``stop``).

    ``busy()`` true skips a sweep (a synthesis reads the weights anyway). ``models()`` is
    asked again whenever ``generation()`` changes: voices load, and modules cache weight
    copies, as they are used.
    """

    def __init__(self, models: Callable[[], Iterable[nn.Module]], busy: Callable[[], bool],
                 interval: float = 0.1, generation: Callable[[], int] = lambda: 0) -> None:
        self.models = models
        self.busy = busy
        self.interval = interval
        self.generation = generation
        self.sweeps = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, mode: KeepWarm) -> threading.Thread | None:
        """``"on"``: sweep from now on; ``"auto"``: first measure whether idle memory goes
        cold here (``idle_slowdown``, half a second, in the thread) and sweep only then;
        ``"off"``: nothing (None)."""
        if mode == "off":
            return None
        self._thread = threading.Thread(target=self._run, args=(mode == "auto",),
                                        name="herald-warm", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        """End the sweeps and wait out one in progress (or the probe's half second): a thread
        left reading tensors while the interpreter exits aborted the process ("terminate
        called without an active exception", exit status -6 instead of 0)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * PROBE_IDLE)

    def _run(self, probe: bool) -> None:
        if probe:
            slowdown = idle_slowdown()
            if slowdown < COLD_MEMORY_SLOWDOWN:
                log.info("memory stays warm while idle here (first read after %g s idle "
                         "%.1fx a hot one): keep_warm not needed", PROBE_IDLE, slowdown)
                return
            log.info("idle memory goes cold here (first read after %g s idle %.1fx slower "
                     "than a hot one; a VM host?): keeping the loaded voices' weights warm "
                     "(keep_warm; ~1 ms of CPU every %.0f ms)", PROBE_IDLE, slowdown,
                     self.interval * 1000)
        touchers: list[WeightToucher] = []
        built_at: int | None = None
        while not self._stop.wait(self.interval):
            if self.busy():
                continue
            if built_at != (now := self.generation()):
                built_at = now
                touchers = [WeightToucher.of(m) for m in self.models()]
            for toucher in touchers:
                toucher.touch()
            self.sweeps += 1

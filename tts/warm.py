"""Keeping a loaded voice's memory warm on hosts that let idle memory go cold.

Some virtual machines (measured on the development VM, a KVM guest) come back slowly to
memory the guest has not touched for a while: the host unmaps it from the guest's page
tables while idle, and the first touch of every 4 KiB page afterwards costs a fault in the
host, invisible to the guest (no page fault is counted). Summing 100 MB took 7 ms hot,
25 ms after 0.3 s of idle, 62 ms after 3 s. A voice is ~70 MB of weights that every first
chunk reads from start to end, so the first audio of a short command went from 47 ms hot
to 200-250 ms after 1-3 s of idle: a smart-home request nearly always comes after idle.

Reading one value in every page of the weights every 100 ms keeps them mapped: the same
first audio then came in 58-70 ms. What was left is the code a synthesis runs: some 30 MB
of libtorch, Python and NumPy pages, cold again after every idle (a short command 78 ms
after 5 s of idle with the weights warm, 39 ms hot). ``CodeToucher`` learns which code
pages run (``forget`` drops the page-table entries of the start-up's code, the page map
then shows what ran since) and the sweeps read those too: 40 ms after 5 s. On this VM,
where the pages go cold again within the 100 ms between sweeps, a sweep took 4-7 ms for
the weights and 2-3 ms for the code: 6-10% of one core while idle. So it is for such hosts
only; ``idle_slowdown`` measures whether this is one.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import BinaryIO, Protocol

import numpy as np
import torch
from torch import nn

from .memory import KeepWarm

log = logging.getLogger(__name__)

PAGE = 4096  # bytes; the granularity the host maps memory back in
PROBE_IDLE = 1.0  # seconds ``idle_slowdown`` leaves its block untouched
PROBES = 2  # the warmer's verdict is the larger: a start-up's other threads can hide it
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


_PRESENT = np.uint64(1 << 63)  # /proc/self/pagemap: the page is mapped
_FILE_PAGE = np.uint64(1 << 61)  # ... and is the file's page, not a private written copy
_MADV_DONTNEED = 4


def _code_mappings() -> list[tuple[int, int, str]]:
    """This process's executable file mappings: (start, end, path)."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[1] == "r-xp" and fields[5].startswith("/"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                found.append((start, end, fields[5].rstrip("\n")))
    return found


def _page_flags(pagemap: BinaryIO, start: int, end: int) -> np.ndarray:
    """One 64-bit entry per page of ``[start, end)`` (see ``_PRESENT``, ``_FILE_PAGE``)."""
    pagemap.seek(start // PAGE * 8)
    return np.frombuffer(pagemap.read((end - start) // PAGE * 8), dtype=np.uint64)


_pinned: set[str] = set()


def _pin(path: str) -> bool:
    """Keep a loaded shared object loaded for good: a later ``dlclose`` (ALSA unloads its
    plugins, for one) then never unmaps pages a sweep reads. False if ``path`` is not a
    loaded shared object (the executable, a deleted file). Once pinned, always pinned: the
    warmer asks again at every rebuild, and the answer is remembered."""
    if path not in _pinned:
        try:
            ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NODELETE)
        except OSError:
            return False
        _pinned.add(path)
    return True


class CodeToucher:
    """One byte in every page of this process's code that has run since ``forget`` (or
    start-up), read from the loaded libraries in place.

    Which pages ran comes from the page map: a file-backed page is in the page table only
    once something executed or read it. Only libraries that ``_pin`` could make permanent
    are read.
    """

    def __init__(self) -> None:
        self.views: list[tuple[np.ndarray, np.ndarray]] = []
        self.paths: list[str] = []
        with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
            for start, end, path in _code_mappings():
                offsets = np.flatnonzero(_page_flags(pagemap, start, end) & _PRESENT) * PAGE
                if len(offsets) == 0 or not _pin(path):
                    continue
                mapping = (ctypes.c_uint8 * (end - start)).from_address(start)
                self.views.append((np.ctypeslib.as_array(mapping), offsets))
                self.paths.append(path)

    @staticmethod
    def forget() -> int:
        """Drop this process's page-table entries for its code, so that the pages the next
        ``CodeToucher`` finds are the ones that ran since (a synthesis, the event loop), not
        all that ran at start-up. Harmless to running code: a dropped page comes back from
        the page cache on its next use. A mapping holding a privately written page is left
        alone (dropping it would revert the page to the file). Returns the mappings
        dropped."""
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        dropped = 0
        with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
            for start, end, path in _code_mappings():
                flags = _page_flags(pagemap, start, end)
                if np.any((flags & _PRESENT != 0) & (flags & _FILE_PAGE == 0)):
                    continue  # a written page: dropping it would lose the writing
                if not _pin(path):
                    continue
                if madvise(start, end - start, _MADV_DONTNEED) == 0:
                    dropped += 1
        return dropped

    @property
    def pages(self) -> int:
        return sum(len(offsets) for _, offsets in self.views)

    def touch(self) -> int:
        return sum(int(view[offsets].sum()) for view, offsets in self.views)


class _Toucher(Protocol):
    def touch(self) -> int: ...


def idle_slowdown(megabytes: int = 32, idle: float = PROBE_IDLE,
                  wait: Callable[[float], object] = time.sleep) -> float:
    """How much slower memory is to read after ``idle`` seconds untouched than hot (1.0 on
    bare metal; 3-6 after 1 s on this VM). Takes ``idle`` (``wait``) plus a few
    milliseconds; allocates ``megabytes``."""
    block = np.ones(megabytes * 1024 * 1024 // 8)
    block.sum()  # mapped and hot

    def timed() -> float:
        start = time.perf_counter()
        block.sum()
        return time.perf_counter() - start

    hot = min(timed() for _ in range(3))
    wait(idle)
    return timed() / max(hot, 1e-9)


class Warmer:
    """Reads every page of some models' weights, and the code pages syntheses ran, each
    ``interval`` seconds while idle, in a thread of its own (``start``, ``stop``).

    ``busy()`` true skips a sweep (a synthesis reads the weights anyway). ``models()`` is
    asked again, and the code that ran looked up again, whenever ``generation()`` changes
    (count the syntheses): voices load, modules cache weight copies, and code runs, as
    they are used.
    """

    def __init__(self, models: Callable[[], Iterable[nn.Module]], busy: Callable[[], bool],
                 interval: float = 0.1, generation: Callable[[], int] = lambda: 0) -> None:
        self.models = models
        self.busy = busy
        self.interval = interval
        self.generation = generation
        self.sweeps = 0
        self.sweeping = False  # decided to sweep (``"on"``, or ``"auto"`` found cold memory)
        self.decided = threading.Event()  # set once ``sweeping`` is final
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, mode: KeepWarm) -> threading.Thread | None:
        """``"on"``: sweep from now on; ``"auto"``: first measure whether idle memory goes
        cold here (``idle_slowdown``, ``PROBES`` seconds, in the thread) and sweep only then;
        ``"off"``: nothing (None)."""
        if mode == "off":
            self.decided.set()
            return None
        self._thread = threading.Thread(target=self._run, args=(mode == "auto",),
                                        name="herald-warm", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        """End the sweeps and wait out one in progress (a probe's wait ends at once): a
        thread left reading tensors while the interpreter exits aborted the process
        ("terminate called without an active exception", exit status -6 instead of 0)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _run(self, probe: bool) -> None:
        try:
            if probe:
                slowdown = max(idle_slowdown(wait=self._stop.wait) for _ in range(PROBES))
                if self._stop.is_set():
                    return
                if slowdown < COLD_MEMORY_SLOWDOWN:
                    log.info("memory stays warm while idle here (first read after %g s idle "
                             "%.1fx a hot one): keep_warm not needed", PROBE_IDLE, slowdown)
                    return
                log.info("idle memory goes cold here (first read after %g s idle %.1fx slower "
                         "than a hot one; a VM host?): keeping the loaded voices' weights and "
                         "the code synthesis runs warm (keep_warm; a sweep every %.0f ms)",
                         PROBE_IDLE, slowdown, self.interval * 1000)
            self.sweeping = True
        finally:
            self.decided.set()
        self._sweep()

    def _sweep(self) -> None:
        code = self._learn_code()
        touchers: list[_Toucher] = []
        built_at: int | None = None
        while not self._stop.wait(self.interval):
            if self.busy():
                continue
            if built_at != (now := self.generation()):
                built_at = now  # syntheses ran: more weight copies, more code that ran
                touchers = [WeightToucher.of(m) for m in self.models()]
                if code:
                    try:
                        touchers.append(CodeToucher())
                    except (OSError, ValueError) as e:
                        log.info("keep_warm: no longer keeping the code warm (%s)", e)
                        code = False
            for toucher in touchers:
                toucher.touch()
            self.sweeps += 1

    def _learn_code(self) -> bool:
        """Start learning which code runs (``CodeToucher.forget``); False where the page
        map cannot be read (not Linux, a sandbox): the weights are still kept warm."""
        try:
            dropped = CodeToucher.forget()
        except (OSError, AttributeError, ValueError) as e:
            log.info("keep_warm: keeping the weights warm, not the code (%s)", e)
            return False
        log.debug("keep_warm: code page tables of %d libraries dropped", dropped)
        return True

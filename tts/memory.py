"""How herald keeps its native memory small: glibc's allocator, oneDNN's kernel cache, and
library code only start-up needed.

* **The mmap threshold, pinned at 1 MiB.** By default glibc raises it after the first large
  free, up to 32 MiB, and the generator's multi-megabyte temporaries then come from the heap
  and, fragmented, keep the process ~40 MB larger. Pinned too low (64 KiB), every such
  temporary is a fresh mapping whose pages fault in on first touch: measured 30% slower. At
  1 MiB the few largest tensors are mapped and the rest reuse the heap; with the generator's
  cache-sized pieces nearly all of them are below it (bench/README.md has the figures).
* **The heap's free top kept, up to TRIM_THRESHOLD.** glibc hands the free top of a heap
  back to the system whenever it grows past its trim threshold: 128 KiB by default, and
  pinning the mmap threshold also stops glibc from raising that one (to twice the mmap
  threshold) as it otherwise would. The flow's and the generator's pieces are temporaries
  of half a megabyte, freed at the top of the heap: at 128 KiB every piece is handed back
  and faulted in again by the next, thousands of page faults a long sentence, each a page
  the kernel zeroes (bench/README.md has the figures). At TRIM_THRESHOLD, the slack the
  resting level allows anyway, a sentence faults next to none in; what it leaves free is
  handed back with the rest when idle.
* **Freed memory handed back after a voice loads.** glibc keeps what a program frees inside
  its heap, resident, for the next allocation there. Loading a voice parses its whole ONNX
  file (the file's bytes, the protobuf, NumPy copies: several times the weights) and frees
  all of it once the weights are in torch, on the heap of whichever thread loaded it, which
  may never allocate that much again. ``malloc_trim`` hands those pages back in about a
  millisecond: measured for the bundled voice, 59 MB in a process that only loads it, and an
  idle ``herald run`` at 334 MB resident instead of 348. Not after every synthesis: the next
  one would fault the pages in again (a short command's first audio 22.8 -> 24.2 ms).

* **Freed memory handed back after a long request, once idle.** A long text leaves the heaps
  of the threads that rendered it holding what its sentences used, freed but resident:
  ``RestingLevel`` hands it back when its caller has nothing in hand (no synthesis, and no
  audio still on its way to a listener: what is freed after a hand-back stays resident) and
  the process holds more than ``REST_SLACK_MB`` of anonymous memory above the lowest it
  rested at since the last hand-back. Short commands never get there, so their pages stay
  mapped and their first audio as fast as before.
* **oneDNN's cache of convolution kernels, bounded.** oneDNN compiles a kernel for every
  convolution shape it meets and keeps up to 1024 of them. Each sentence has its own length,
  so a long text would fill the cache, and the process keep the kernels for good. The
  streamed generator rounds its convolutions' lengths (``StreamConv``'s ``quantum``), so the
  shapes it meets are a set whatever is said: about 200 for a medium voice, 400 for a
  high one, which has twice the convolutions. ``ONEDNN_CACHE_CAPACITY`` holds all of them
  with room for the shapes of a sentence's own length elsewhere; below the set, the
  windows' convolutions evict one another in turn and every one is compiled again (a
  short command took 1.1x as long). A shape evicted and met again is compiled again
  (bench/README.md has both sides). An operator's own ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``
  wins.
* **PyTorch's cache of convolution descriptions, bounded too.** Above oneDNN, PyTorch's
  ideep layer keeps its own cache of what it built for each convolution shape (the
  primitive's description, and a reference to the primitive itself), up to 1024 of them
  (``LRU_CACHE_CAPACITY``). That one, not oneDNN's, is what a long text filled: it kept
  about 15 MB of heap in use for good after a 3,000-character request, and held on to the
  kernels oneDNN's bounded cache had let go. At ``IDEEP_CACHE_CAPACITY``, as many as the
  kernels oneDNN keeps, it holds what every request uses: a hit saves building the
  description again (tens of microseconds a convolution), which did not show in a long
  varied text's total synthesis time at any capacity (its lengths were all new), but at 64
  a short command's first audio came a few milliseconds later. An operator's own
  ``LRU_CACHE_CAPACITY`` wins.
* **Library code that was only needed to start, unmapped.** Importing torch maps in more
  than a hundred megabytes of its libraries' code (their initialisers touch it) that
  synthesis never runs again, and every mapped page counts in the process's resident size.
  ``release_startup_code`` drops the clean code pages from this process's mappings once,
  before a voice is loaded: they stay in the page cache, and the pages synthesis runs come
  back from there at first use (a minor fault each, once). bench/README.md has what it
  takes off the peak.

Elsewhere than glibc (musl, macOS) the hand-backs and the threshold do nothing, elsewhere than
Linux the unmapping.
"""

from __future__ import annotations

import ctypes
import logging
import os
from functools import cache
from typing import Any, Literal, get_args

log = logging.getLogger(__name__)

# Keeping loaded voices' memory warm while idle (``tts.warm``): "auto" measures whether
# idle memory goes cold here first. Here, torch-free, because the settings name it.
KeepWarm = Literal["auto", "on", "off"]
KEEP_WARM_MODES: tuple[KeepWarm, ...] = get_args(KeepWarm)

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters
_M_MMAP_THRESHOLD = -3
_MADV_DONTNEED = 4
MMAP_THRESHOLD = 1 << 20  # bytes
ONEDNN_CACHE_CAPACITY = 768  # kernels; oneDNN's default is 1024
IDEEP_CACHE_CAPACITY = 768  # convolution descriptions (one per kernel); PyTorch's default: 1024
REST_SLACK_MB = 16.0  # anonymous growth over the resting level that an idle moment hands back
TRIM_THRESHOLD = int(REST_SLACK_MB) << 20  # bytes of free heap top glibc keeps mapped


@cache
def _glibc() -> Any:
    """The C library, if it is glibc (it has ``malloc_trim`` and ``mallopt``)."""
    try:
        # The process's own symbols, libc's among them: no library search (find_library
        # would run ldconfig at start-up).
        libc = ctypes.CDLL(None)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


def pin_allocator_thresholds() -> None:
    """Allocations of MMAP_THRESHOLD bytes and more get their own mapping, always; a heap's
    free top is handed back only past TRIM_THRESHOLD (and by ``release_free_memory``)."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def bound_kernel_cache() -> None:
    """Cap oneDNN's kernel cache at ONEDNN_CACHE_CAPACITY and PyTorch's cache of
    convolution descriptions at IDEEP_CACHE_CAPACITY, unless the environment sets them.
    Both libraries read their variable when they make their first convolution: call this
    before any synthesis (setting it in ``os.environ`` reaches the C library's
    environment)."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_CACHE_CAPACITY))
    os.environ.setdefault("LRU_CACHE_CAPACITY", str(IDEEP_CACHE_CAPACITY))


def anonymous_mb() -> float | None:
    """This process's resident anonymous memory in MB (Linux): the heaps and the weights,
    what the process itself keeps. Resident file-backed pages (torch's libraries' code) are
    left out: the kernel drops them and reads them back as the host's memory is in demand,
    which moves a level read with them by tens of megabytes whatever the process does.
    ``/proc/self/statm``: resident less shared (file-backed and shmem), a read of
    microseconds."""
    try:
        with open("/proc/self/statm") as f:
            fields = f.read().split()
        pages = int(fields[1]) - int(fields[2])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def release_free_memory(why: str) -> bool:
    """Give the pages of freed heap memory back to the system; True if any went back."""
    libc = _glibc()
    if libc is None:
        return False
    before = anonymous_mb() if log.isEnabledFor(logging.DEBUG) else None  # for the log only
    released = bool(libc.malloc_trim(0))
    after = anonymous_mb() if before is not None else None
    if before is not None and after is not None:
        log.debug("%s: %.0f MB of freed memory handed back (anonymous memory now %.0f MB)", why,
                  before - after, after)
    return released


class RestingLevel:
    """Where the process rests between requests, and the hand-back when it holds more.

    ``idle()`` is called when no synthesis runs; it reads the resident anonymous memory
    (``anonymous_mb``) and calls ``malloc_trim`` only if that is more than
    ``slack_mb`` above the level: the lowest reading at rest since the last hand-back (the
    first call always hands back: that is where the level starts)."""

    def __init__(self, slack_mb: float = REST_SLACK_MB) -> None:
        self.slack_mb = slack_mb
        self.level: float | None = None  # MB of anonymous memory, lowest at rest
        self.releases = 0

    def observe(self) -> float | None:
        """A reading while nothing is in hand; it lowers the level if below it. What was
        still held at the last hand-back (a first request's one-off work, a probe's buffer,
        audio on its way out) is freed later, and a level left above where the process
        really rests would hide a long request's growth under it: read as a synthesis
        starts from idle, and before each hand-back's decision."""
        now = anonymous_mb()
        if now is not None and self.level is not None and now < self.level:
            self.level = now
        return now

    def due(self) -> bool:
        now = self.observe()
        return now is not None and (self.level is None or now > self.level + self.slack_mb)

    def idle(self) -> bool:
        """Hand freed memory back if it is due; True if it was."""
        if not self.due():
            return False
        release_free_memory("idle after a large request")
        self.level = anonymous_mb()
        self.releases += 1
        return True


_released = False


def release_startup_code() -> int:
    """Once per process: drop the mapped pages of loaded libraries' code that nothing has
    written to (``/proc/self/smaps``: executable, file-backed, no private dirty page). Returns
    the mappings dropped."""
    global _released
    libc = _glibc()
    if _released or libc is None:
        return 0
    _released = True
    dropped = 0
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    span: tuple[int, int] | None = None
    for line in lines:
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            span = None
            if len(head) >= 6 and head[1] == "r-xp" and head[5].startswith("/"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                span = (lo, hi)
        elif span is not None and head[0] == "Private_Dirty:":
            if head[1] == "0" and libc.madvise(span[0], span[1] - span[0], _MADV_DONTNEED) == 0:
                dropped += 1
            span = None
    log.debug("dropped the mapped pages of %d library code mappings", dropped)
    return dropped

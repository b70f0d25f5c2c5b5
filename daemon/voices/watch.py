"""Keeps a running herald's voices in step with its voice directories, without a restart.

A voice copied or downloaded (``herald voices download``) into a voice directory, or
removed from it, is noticed three ways, all through ``VoiceWatch.refresh``:

* before answering a listing (HTTP ``/voices``, Wyoming ``describe``), so a client that
  asks right after a download sees the new voice;
* every ``POLL_INTERVAL`` seconds, so Home Assistant's Voice select (the discovery payload,
  republished by a listener) follows without anyone asking;
* on SIGHUP (``daemon.reload``), forced.

Why polling the directories rather than telling the daemon: the download may run as
another user than the daemon's (which may not signal it), on another host sharing the
directory, or be a plain ``cp``; and a check is a ``stat`` of each directory and voice file
(``tts.catalog.directory_signature``), so it costs nothing worth counting. The catalog
parses the voices' configs again only when that signature changed.

A removed voice leaves only while nothing is being synthesized (a running request would
fail mid-sentence); until then it stays listed, and the next poll tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection

from tts import VoiceCatalog
from tts.catalog import CatalogChanges, Signature

from ..listeners import Listeners

log = logging.getLogger(__name__)

POLL_INTERVAL = 5.0  # seconds between two checks of the voice directories

Listener = Callable[[CatalogChanges], Awaitable[None] | None]


class VoiceWatch:
    """One per daemon, started and stopped as one of the service's parts."""

    name = "voice watch"

    def __init__(self, catalog: VoiceCatalog, busy: Callable[[], bool] = lambda: False,
                 keep: Callable[[], Collection[str]] = tuple,
                 interval: float = POLL_INTERVAL) -> None:
        self.catalog = catalog
        self.busy = busy  # syntheses are running: removals wait
        self.keep = keep  # voices that must stay even if their files are gone
        self.interval = interval
        self._listeners: Listeners[[CatalogChanges]] = Listeners(log, "a voice listener failed")
        self._lock = asyncio.Lock()
        self._signature: Signature | None = None
        self._removals_waiting = False
        self._warned_kept: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def add_listener(self, fn: Listener) -> None:
        """``fn(changes)`` (a function or a coroutine function) after every change."""
        self._listeners.add(fn)

    async def start(self) -> None:
        self._signature = await asyncio.to_thread(self.catalog.signature)
        self._task = asyncio.create_task(self._poll(), name="voice watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.refresh()
            except Exception:  # a bad directory must not end the watch
                log.exception("checking the voice directories failed")

    async def refresh(self, force: bool = False) -> CatalogChanges:
        """Rescan if the directories changed since the last look (always if ``force``);
        what changed, after the listeners have run."""
        async with self._lock:
            signature = await asyncio.to_thread(self.catalog.signature)
            if not force and signature == self._signature and not self._removals_waiting:
                return CatalogChanges()
            keep = set(self.keep())
            changes = await asyncio.to_thread(self.catalog.rescan, not self.busy(), keep)
            self._signature = signature
            self._report(changes, keep)
            if changes:
                await self._notify(changes)
            return changes

    def _report(self, changes: CatalogChanges, keep: set[str]) -> None:
        for name in changes.added:
            info = self.catalog.resolve(name)
            log.info("voice %s added (%s, %s, from %s)", name, info.config.language,
                     info.config.quality, info.model_path.parent)
        for name in changes.removed:
            log.info("voice %s removed: its files are gone", name)
        for name in changes.replaced:
            log.info("voice %s replaced on disk: the new files are used from the next "
                     "request", name)
        held = {n for n in changes.kept if n == self.catalog.default or n in keep}
        for name in sorted(held - self._warned_kept):
            log.warning("voice %s's files are gone, but it is the default voice: it stays "
                        "until voices.default (or set/voice) names another one", name)
        self._warned_kept = held
        waiting = set(changes.kept) - held
        if waiting and not self._removals_waiting:
            log.info("voice(s) %s removed on disk: they go once nothing is being "
                     "synthesized", ", ".join(sorted(waiting)))
        self._removals_waiting = bool(waiting)

    async def _notify(self, changes: CatalogChanges) -> None:
        await self._listeners.notify(changes)

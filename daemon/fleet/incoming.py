"""One job's audio as it arrives from the fleet: numbered chunks that may come twice (a job
resumed on another worker publishes again from where its owner's copy broke off; a broker
may deliver twice), out of order (two workers at once) or not at all (a worker that died),
put back in ``seq`` order, each played once.

Broker-free on purpose: the receiver feeds it what came off the wire, the pool watches its
progress, and the scheduler reads its PCM through ``IncomingSource``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable

from tts.audio import AudioFormat

from ..errors import RequestError
from .messages import AudioStart, AudioStop


class Incoming:
    """The chunks of job ``job`` received so far, and how it ended."""

    def __init__(self, job: str, group: str | None = None) -> None:
        self.job = job
        self.group = group  # the group whose audio this is (None: this device's)
        self.start: AudioStart | None = None  # the first start seen
        self.attempt = 0  # the latest attempt seen (start, chunk stop)
        self.heard = time.monotonic()  # when anything of it last came
        self.received = 0  # chunks received in a row from seq 0: where a resend goes on
        self.duplicates = 0
        self.total: int | None = None  # chunks in all, once a finished stop says so
        self.ended = False  # no more audio will be read (complete, failed or given up)
        self.counting_only = False  # its reader left: chunks are counted, not kept
        self._pending: dict[int, bytes] = {}  # received ahead of a missing one
        self._ready: deque[bytes] = deque()  # in order, not read yet
        self._error: RequestError | None = None
        self._wake = asyncio.Event()
        self.on_progress: Callable[[], None] | None = None  # after a start, chunk or stop

    def _progress(self) -> None:
        self.heard = time.monotonic()
        self._wake.set()
        if self.on_progress is not None:
            self.on_progress()

    # ------------------------------------------------------------------ what arrives

    def started(self, start: AudioStart) -> bool:
        """A start; True for the first one (a later attempt sends its own)."""
        self.attempt = max(self.attempt, start.attempt)
        first = self.start is None
        if first:
            self.start = start
        self._progress()
        return first

    def chunk(self, seq: int, pcm: bytes) -> bool:
        """A chunk; False for one already received."""
        if seq < self.received or seq in self._pending:
            self.duplicates += 1
            self.heard = time.monotonic()
            return False
        self._pending[seq] = b"" if self.counting_only else pcm
        while self.received in self._pending:
            piece = self._pending.pop(self.received)
            if not self.counting_only:
                self._ready.append(piece)
            self.received += 1
        self._progress()
        return True

    def stopped(self, stop: AudioStop) -> None:
        """A worker's stop. A finished one says how many chunks the audio has; a stopped or
        failed one is the owner's to judge (it may have been an attempt it cancelled)."""
        self.attempt = max(self.attempt, stop.attempt)
        if stop.outcome == "finished":
            self.total = stop.chunks
        self._progress()

    @property
    def complete(self) -> bool:
        """Every chunk of the audio is here (some may not be read yet)."""
        return self.total is not None and self.received >= self.total

    def fail(self, error: RequestError) -> None:
        """No more audio will come: the reader gets ``error`` after what came before it."""
        if not self.ended:
            self.ended = True
            self._error = error
            self._wake.set()

    def close(self) -> None:
        """Nobody reads it any more: drop the audio held, count (not keep) what comes."""
        self.ended = self.counting_only = True
        self._pending = dict.fromkeys(self._pending, b"")
        self._ready.clear()
        self._wake.set()

    # ------------------------------------------------------------------ reading it

    async def pcm(self) -> AsyncGenerator[bytes, None]:
        """The chunks in order as they come; ends with the audio, or raises the error."""
        while True:
            if self._ready:
                yield self._ready.popleft()
                continue
            if self._error is not None:
                raise self._error
            if self.complete or self.ended:
                self.ended = True
                return
            self._wake.clear()
            await self._wake.wait()


class IncomingSource:
    """An ``Incoming`` as a request's audio source (``daemon.synthesis.contracts.AudioSource``):
    what a group member plays."""

    def __init__(self, incoming: Incoming, fmt: AudioFormat) -> None:
        self.incoming = incoming
        self._format = fmt

    @property
    def format(self) -> AudioFormat:
        return self._format

    @property
    def waiting(self) -> bool:
        return False  # its text was whole when its audio started

    @property
    def preroll(self) -> float:
        return 0.0  # it plays at its start's play_at, fleet.sync_delay after its first chunk

    async def pcm(self) -> AsyncGenerator[bytes, None]:
        try:
            async for piece in self.incoming.pcm():
                yield piece
        finally:
            self.incoming.close()

"""A job's audio for the one client that asked for it: an HTTP response, a Wyoming connection.

The scheduler writes the job's PCM in as it is synthesized; the front reads it out and sends
it on its connection. Between them sits a short queue: a client that reads slowly holds the
writer, which holds the synthesis (the engine parks a render whose consumer is slow), so a slow
client costs a few chunks of memory, never the whole text. A client that goes away is said
to ``leave``: the scheduler stops its job after the chunk being made, and the workers go to
whoever is still listening.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from tts import AudioFormat

from ..errors import RequestError
from ..jobs.metrics import LatencyRecord

# Pieces of PCM (each one synthesized chunk, 50-500 ms of audio) waiting for the client.
DEPTH = 4


class ClientSink:
    """One job's audio stream to one client connection, with back-pressure both ways."""

    def __init__(self, name: str, depth: int = DEPTH, whole: bool = False) -> None:
        self.name = name  # the sink in the latency record: "http", "wyoming"
        # The client takes the audio only once it is all made (a WAV with exact sizes, a
        # batch's ZIP entry): nobody waits for its first chunk.
        self.whole = whole
        self.fmt: AudioFormat | None = None  # known once the job starts
        self.outcome: str | None = None  # finished | stopped | error, once it ended
        self.error: RequestError | None = None
        self.record: LatencyRecord | None = None  # the job's, once it ended with audio
        self.left = False  # the client went away
        self.written = 0  # bytes of PCM the job has written so far
        # Set by the scheduler: the client left, stop the job (waiting or running).
        self.on_leave: Callable[[], None] | None = None
        self._depth = max(1, depth)
        self._pieces: deque[bytes] = deque()
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._started = asyncio.Event()

    # ------------------------------------------------------------------ the scheduler's side

    def open(self, fmt: AudioFormat) -> None:
        self.fmt = fmt
        self._started.set()

    async def write(self, pcm: bytes) -> None:
        """Queue one piece; waits while the client is ``depth`` pieces behind."""
        while len(self._pieces) >= self._depth and not self.left:
            self._writable.clear()
            await self._writable.wait()
        if self.left:
            return
        self._pieces.append(pcm)
        self.written += len(pcm)
        self._readable.set()

    def close(self, outcome: str, error: RequestError | None = None,
              record: LatencyRecord | None = None) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.error = error
            self.record = record
        self._started.set()
        self._readable.set()

    # ------------------------------------------------------------------ the front's side

    async def started(self) -> AudioFormat | None:
        """The job's audio format once it started; None if it ended before it started."""
        await self._started.wait()
        return self.fmt

    async def read(self) -> bytes | None:
        """The next piece of PCM; None once the job has ended (see ``outcome``, ``error``)."""
        while not self._pieces:
            if self.outcome is not None:
                return None
            self._readable.clear()
            await self._readable.wait()
        pcm = self._pieces.popleft()
        self._writable.set()
        return pcm

    def leave(self) -> None:
        """The client went away (or stopped reading): stop the job, drop what waits."""
        if self.left:
            return
        self.left = True
        self._pieces.clear()
        self._writable.set()
        if self.outcome is None and self.on_leave is not None:
            self.on_leave()

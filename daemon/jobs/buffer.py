"""The audio synthesized ahead of playback for one utterance: the producer (synthesis, or a
source of audio made elsewhere) puts s16le mono PCM, the player takes it, and the bound in
samples makes the producer wait instead of running unboundedly ahead of the device."""

from __future__ import annotations

import asyncio
from collections import deque


class AudioBuffer:
    """PCM pieces made ahead of playback, bounded by their total length in samples."""

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max(1, max_samples)
        self._chunks: deque[bytes] = deque()
        self._samples = 0
        self._ended = False
        self._aborted = False
        self._error: BaseException | None = None
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()

    async def put(self, chunk: bytes) -> None:
        while self._samples >= self.max_samples and not self._ended:
            self._writable.clear()
            await self._writable.wait()
        if self._ended:
            return
        self._chunks.append(chunk)
        self._samples += len(chunk) // 2
        self._readable.set()

    async def get(self) -> bytes | None:
        """The next chunk; None at the end; the producer's error after the chunks before it."""
        while not self._chunks:
            if self._ended:
                if self._error is not None and not self._aborted:
                    error, self._error = self._error, None
                    raise error
                return None
            self._readable.clear()
            await self._readable.wait()
        chunk = self._chunks.popleft()
        self._samples -= len(chunk) // 2
        self._writable.set()
        return chunk

    def finish(self, error: BaseException | None = None) -> None:
        if not self._ended:
            self._ended = True
            self._error = error
        self._readable.set()
        self._writable.set()

    @property
    def complete(self) -> bool:
        """Everything the producer will put is here, and none of it has been taken."""
        return self._ended and self._error is None and not self._aborted

    def peek(self) -> list[bytes]:
        """The chunks waiting, left in place."""
        return list(self._chunks)

    def abort(self) -> None:
        self._chunks.clear()
        self._samples = 0
        self._aborted = True
        self.finish()

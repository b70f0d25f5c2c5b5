"""The bridge between asyncio fronts and the CPU-bound synthesizer.

Torch runs in worker threads (it releases the GIL); the event loop only receives finished
chunks through a bounded queue. Cancelling the consumer (a stopped utterance, a vanished
client) stops the worker at the next chunk boundary.

A stream whose consumer is slow (a speaker playing in real time) parks its thread on the
full queue. So threads are plentiful, and what is limited is the CPU work: a semaphore of
``workers`` slots is held only while one chunk is computed. Concurrent streams therefore
take turns chunk by chunk, and a parked stream never starves the others.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tts import AudioChunk, AudioFormat, SynthesisOptions, VoiceCatalog, set_threads
from tts.compose import Composer
from tts.text import TextFormat

log = logging.getLogger(__name__)

_DONE = object()


@dataclass(frozen=True)
class EngineSettings:
    threads: int = 1  # torch intra-op threads
    workers: int = 2  # chunks computed at the same time
    queue_chunks: int = 8  # chunks buffered ahead of a slow consumer
    max_streams: int = 32  # open streams (threads, mostly parked on a full queue)


class Engine:
    def __init__(self, catalog: VoiceCatalog, settings: EngineSettings = EngineSettings()) -> None:
        self.catalog = catalog
        self.settings = settings
        # Markup, sentence splitting, language runs and the espeak-ng fallback: every front
        # speaks through the composer, so they all understand the same text.
        self.composer = Composer(catalog)
        set_threads(settings.threads)
        self._pool = ThreadPoolExecutor(max_workers=max(settings.max_streams, settings.workers),
                                        thread_name_prefix="herald-synth")
        self._cpu = threading.BoundedSemaphore(settings.workers)

    def audio_format(self, voice: str | None = None) -> AudioFormat:
        """The one format a stream for this request voice comes in (others are resampled)."""
        return self.composer.audio_format(voice)

    async def preload(self, voice: str | None = None) -> None:
        """Load a voice's weights off the loop (start-up, before READY)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self.catalog.synthesizer, voice)

    async def stream(self, text: str, voice: str | None = None,
                     options: SynthesisOptions = SynthesisOptions(),
                     text_format: TextFormat = "text") -> AsyncIterator[AudioChunk]:
        """Chunks as the worker produces them.

        Raises ``UnknownVoice`` and ``MarkupError`` (malformed SSML) before any work is
        queued, then whatever the worker raises.
        """
        composition = self.composer.stream(text, text_format, options, voice)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue(self.settings.queue_chunks)
        cancelled = threading.Event()

        def put(item: object) -> None:
            coro = queue.put(item)
            try:
                fut = asyncio.run_coroutine_threadsafe(coro, loop)
            except RuntimeError:  # the loop is gone (shutdown): nobody is listening
                coro.close()
                return
            while not cancelled.is_set():
                try:
                    fut.result(timeout=0.5)
                    return
                except TimeoutError:
                    continue
            fut.cancel()
            coro.close()  # never started: say so, rather than warn "never awaited"

        def work() -> None:
            try:
                while not cancelled.is_set():
                    with self._cpu:  # a voice loads lazily here, under the slot
                        chunk = next(composition, None)
                    if chunk is None:
                        put(_DONE)
                        return
                    put(chunk)
            except BaseException as e:  # handed to the consumer, which reports it
                if not cancelled.is_set():
                    put(e)

        future = loop.run_in_executor(self._pool, work)
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, AudioChunk)
                yield item
        finally:
            cancelled.set()
            while not queue.empty():  # unblock a worker waiting on a full queue
                queue.get_nowait()
            if future.done() and not future.cancelled():
                future.exception()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

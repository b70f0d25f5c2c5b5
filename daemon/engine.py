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
        set_threads(settings.threads)
        self._pool = ThreadPoolExecutor(max_workers=max(settings.max_streams, settings.workers),
                                        thread_name_prefix="herald-synth")
        self._cpu = threading.BoundedSemaphore(settings.workers)

    def audio_format(self, voice: str | None = None) -> AudioFormat:
        return AudioFormat(self.catalog.resolve(voice).config.sample_rate)

    async def preload(self, voice: str | None = None) -> None:
        """Load a voice's weights off the loop (start-up, before READY)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self.catalog.synthesizer, voice)

    async def stream(self, text: str, voice: str | None = None,
                     options: SynthesisOptions = SynthesisOptions()) -> AsyncIterator[AudioChunk]:
        """Chunks as the worker produces them. Raises the worker's error (UnknownVoice, ...)."""
        self.catalog.resolve(voice)  # unknown voice: fail before queueing any work
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue(self.settings.queue_chunks)
        cancelled = threading.Event()

        def put(item: object) -> None:
            fut = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
            while not cancelled.is_set():
                try:
                    fut.result(timeout=0.5)
                    return
                except TimeoutError:
                    continue
            fut.cancel()

        def work() -> None:
            try:
                with self._cpu:
                    synth = self.catalog.synthesizer(voice)
                chunks = synth.stream(text, options)
                while not cancelled.is_set():
                    with self._cpu:
                        chunk = next(chunks, None)
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

"""The bridge between asyncio fronts and the CPU-bound synthesizer.

Text is planned on the loop by the composer's planner (sentences, markup, languages, pauses:
cheap, and one place for all of it, whole texts and streamed ones alike); the planned steps
are rendered into audio on ``workers`` CPU threads (``daemon.synthesis.workers``), the only threads
that run torch, and each chunk goes to the loop the moment it exists. Concurrent renders
go by their playback deadlines (``daemon.synthesis.deadlines``); a render whose consumer is slow (a
speaker playing in real time) is parked, holding no thread, once ``queue_chunks`` chunks
wait for it. Cancelling the
consumer (a stopped utterance, a vanished client) stops the work after the chunk being made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass

from tts import (
    AudioChunk,
    AudioFormat,
    SynthesisOptions,
    VoiceCatalog,
    default_threads,
    prepare_process,
)
from tts.compose import Composer, Planner, Step, StepFeed
from tts.memory import KeepWarm, RestingLevel
from tts.text import TextFormat
from tts.threads import cores, prepare_thread
from tts.warm import Warmer

from .contracts import pick_voice
from .helpers import HelperPool, Lent
from .workers import Render, Workers

# Seconds from the last job's end to the hand-back of freed memory (``Engine.rest``): by
# then what the job's listeners and the synthesis's own frames held has been freed too.
REST_AFTER = 1.0

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class EngineSettings:
    threads: int | None = None  # cores one synthesis uses; None: tts.default_threads()
    workers: int | None = None  # renders computed at the same time in this process; None: 1
    queue_chunks: int = 8  # chunks buffered ahead of a slow consumer
    keep_warm: KeepWarm = "auto"  # see Engine.keep_warm
    warm_interval: float = 0.1  # seconds between two reads of the idle voices' memory


class Engine:
    def __init__(self, catalog: VoiceCatalog, settings: EngineSettings = EngineSettings()) -> None:
        self.catalog = catalog
        self.settings = settings
        # Markup, sentence splitting, language runs and the espeak-ng fallback: every front
        # speaks through the composer, so they all understand the same text.
        self.composer = Composer(catalog)
        self.threads, self.workers = cpu_plan(settings.threads, settings.workers)
        log.info("synthesis: %d worker(s), each synthesis on up to %d core(s), of %d",
                 self.workers, self.threads, cores())
        prepare_process()
        self._workers = Workers(self.workers, setup=prepare_thread)
        self._helpers: HelperPool | None = None
        self._active = 0  # renders in progress (changed on the loop, read by the warmer)
        self._renders = 0  # renders started, ever
        self.resting = RestingLevel()
        self._rest_timer: asyncio.TimerHandle | None = None
        self._warmer = Warmer(lambda: [s.model for s in catalog.loaded()],
                              busy=lambda: self._active > 0, interval=settings.warm_interval,
                              generation=lambda: self._renders)

    @property
    def waiting_streams(self) -> int:
        """New streams waiting for room: the playing ones need the workers' time."""
        return self._workers.held

    @property
    def rendering(self) -> bool:
        """A synthesis is under way (a voice must not be unloaded under it)."""
        return self._active > 0

    @property
    def renders(self) -> int:
        """Renders started so far (one per whole text, one per sentence of a streamed one)."""
        return self._renders

    @property
    def pieces_handed(self) -> int:
        """Pieces of sentences handed to the helper processes so far."""
        return 0 if self._helpers is None else self._helpers.handed

    @property
    def warm_sweeps(self) -> int:
        """Reads of the idle voices' memory so far."""
        return self._warmer.sweeps

    @property
    def default_voice(self) -> str:
        return self.catalog.default

    def voice_names(self) -> list[str]:
        return [i.name for i in self.catalog.infos()]

    def resolve_voice(self, name: str | None = None, language: str | None = None,
                      default: str | None = None) -> str:
        """The installed voice a request asks for, however the front lets it ask: by name;
        by a language in ``name`` (``en``, ``de_DE``, as people type it in a ``say``) or in
        ``language`` (Wyoming's field); with neither, ``default`` (the catalog's if None).
        Raises ``UnknownVoice`` naming what is installed; each front answers it its own
        way."""
        languages = {i.name: i.config.language for i in self.catalog.infos()}
        return pick_voice(languages, self.catalog.default, name, language, default)

    def check_speaker(self, voice: str, speaker: str | int | None) -> None:
        """Refuse (``VoiceError``) a speaker the installed ``voice`` does not have. Reads only
        the voice's config: fronts call it before queueing, without loading weights."""
        self.catalog.resolve(voice).speaker_id(speaker)

    def audio_format(self, voice: str | None = None) -> AudioFormat:
        """The one format a stream for this request voice comes in (others are resampled)."""
        return self.composer.audio_format(voice)

    async def preload(self, voice: str | None = None) -> None:
        """Load a voice's weights off the loop (start-up, before READY)."""
        await asyncio.wrap_future(self._workers.call(self.catalog.synthesizer, voice))

    def start_helpers(self) -> None:
        """Start the helper processes (``daemon.synthesis.helpers``) a synthesis uses besides its
        own lane. Once, after the voices are loaded (the helpers share them) and before any
        synthesis or thread other than the idle workers runs (they are forked)."""
        if self._helpers is None and self.threads > 1:
            self._helpers = HelperPool(self.catalog, self.threads - 1)

    @property
    def helper_pids(self) -> list[int]:
        return [] if self._helpers is None else self._helpers.pids

    def planner(self, voice: str | None, options: SynthesisOptions,
                text_format: TextFormat = "text") -> Planner:
        """The text side of one request, whole or arriving in pieces: sentences, markup,
        languages, and the pauses the options ask for between sentences and paragraphs.
        Text only, safe on the loop. Raises ``UnknownVoice``."""
        return self.composer.planner(text_format, voice, options.sentence_silence,
                                     options.paragraph_silence)

    async def stream(self, text: str, voice: str | None = None,
                     options: SynthesisOptions = SynthesisOptions(),
                     text_format: TextFormat = "text",
                     whole: bool = False) -> AsyncGenerator[AudioChunk, None]:
        """A whole text's chunks as the worker produces them (``whole``: for a consumer that
        takes the audio only once it is all made, in the largest windows from the start,
        ``tts.Synthesizer.stream_sentences``).

        Raises ``UnknownVoice`` and ``MarkupError`` (malformed SSML) before any work is
        queued, then whatever the worker raises.
        """
        planner = self.planner(voice, options, text_format)
        async with contextlib.aclosing(self._render(planner.feed(text) + planner.finish(),
                                                    voice, options, whole)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def stream_steps(self, batches: AsyncGenerator[list[Step], None], voice: str | None,
                           options: SynthesisOptions,
                           waiting: Callable[[bool], None] | None = None
                           ) -> AsyncGenerator[AudioChunk, None]:
        """Planned text as it arrives (a streamed text), rendered as soon as it comes.

        Batches that arrive while one renders join it (``tts.compose.StepFeed``): a text
        whose sentences come faster than they are spoken is then one synthesis, whose lanes
        decode the next sentence while one plays, as for the same text sent whole. A render
        ends when it finds nothing more in hand, and the next starts when more comes.
        ``waiting`` is told when nothing is in hand while more text may come (time the
        watchdog must not count as synthesis stuck). A seed starts afresh on every batch, so
        the audio does not depend on how the text was cut or how fast it came.

        Raises whatever ``batches`` raises (after the audio of the batches before it), and
        closes it when closed."""
        feed = StepFeed()
        arrived = asyncio.Event()
        pump = asyncio.create_task(_pump(batches, feed, arrived))
        try:
            while True:
                if not feed:
                    if pump.done():
                        break
                    if waiting is not None:
                        waiting(True)
                    try:
                        await arrived.wait()
                    finally:
                        if waiting is not None:
                            waiting(False)
                    arrived.clear()
                    continue
                async with contextlib.aclosing(self._render(feed, voice, options)) as chunks:
                    async for chunk in chunks:
                        yield chunk
            await pump  # its error, after the audio of what came before it
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump

    async def _render(self, steps: Iterable[Step] | StepFeed, voice: str | None,
                      options: SynthesisOptions, whole: bool = False
                      ) -> AsyncGenerator[AudioChunk, None]:
        """The steps' chunks, computed on the workers (``daemon.synthesis.workers``); closing this
        generator stops the computation after the chunk being made."""
        rate = self.composer.sample_rate(voice)
        helpers = None if self._helpers is None else Lent(self._helpers,
                                                          lambda: self._active <= 1)
        if self._active == 0:
            self.resting.observe()  # where the process rests, before this work adds to it
        # Counted before the render can start, so that its lent helpers see the others.
        self._active += 1
        self._renders += 1
        try:
            render = Render(lambda demand: self.composer.render(steps, options, voice, demand,
                                                                helpers, whole),
                            self._workers,
                            self.settings.queue_chunks, lambda c: len(c.samples) / rate)
            try:
                while (chunk := await render.get()) is not None:
                    yield chunk
            finally:
                render.close()
        finally:
            self._active -= 1

    def rest(self) -> None:
        """Nothing is in hand (no job queued, synthesizing or playing): in ``REST_AFTER``
        seconds, give back what the work left freed but resident, if the process holds
        enough above where it last rested (``tts.memory.RestingLevel``).

        Not when the last synthesis ends, nor at once when the job does: what its listeners
        and its frames still hold is freed a moment later, and what is freed after a
        hand-back stays resident; the level read at such a hand-back is too high by as
        much, and the next long request is not seen to be over it (bench/README.md,
        "Resting level"). On a worker (the loop never waits on the C library); skipped if
        a synthesis has started by then."""
        if self._rest_timer is not None:
            self._rest_timer.cancel()
        self._rest_timer = asyncio.get_running_loop().call_later(REST_AFTER, self._rest_now)

    def _rest_now(self) -> None:
        self._rest_timer = None
        if self._active or not self.resting.due():
            return

        def release() -> None:
            if self._active == 0:
                self.resting.idle()

        with contextlib.suppress(RuntimeError):  # workers already closed: exiting anyway
            self._workers.call(release)

    def keep_warm(self) -> threading.Thread | None:
        """Keep the loaded voices' memory warm while nobody speaks, if this host needs it.

        Some VM hosts unmap guest memory that sits idle, and every page is then slow to
        touch again: the first audio of a short command after a few seconds of idle took
        200-250 ms instead of 47 (``tts.warm``). ``keep_warm = "on"`` reads one value in every
        page of the loaded voices' weights, and of the code syntheses ran, each
        ``warm_interval`` while no synthesis runs (6-10% of one core on the VM that needed it);
        ``"auto"`` first measures whether idle memory goes cold here (two seconds, in the
        warm thread) and does so only then; ``"off"`` never.
        """
        return self._warmer.start(self.settings.keep_warm)

    def close(self, join: float = 0.0) -> bool:
        """Stop the workers after their current step, waiting up to ``join`` seconds for
        each; True if none is still computing."""
        self._warmer.stop()
        if self._rest_timer is not None:
            self._rest_timer.cancel()
        ended = self._workers.close(join)
        if self._helpers is not None:
            self._helpers.close()
        return ended


def cpu_plan(threads: int | None, workers: int | None) -> tuple[int, int]:
    """Cores one synthesis uses, and the syntheses computed at the same time in this
    process: as configured, or ``tts.default_threads()`` for both.

    A synthesis computes on one thread and uses more cores through helper processes
    (``daemon.synthesis.helpers``): ``threads - 1`` of them, lent only to a synthesis that runs
    alone (``daemon.synthesis.helpers.Lent``). Syntheses that run together each take a worker
    thread of their own, one core each, so the cores a lone synthesis would use serve them too
    (six streams at once: bench/README.md, "Concurrent streams"). The workers take turns on the
    interpreter's lock only for the Python between operations, a few percent of a window.
    """
    lanes = max(1, threads or default_threads())
    return lanes, max(1, workers or lanes)


async def _pump(batches: AsyncGenerator[list[Step], None], feed: StepFeed,
                arrived: asyncio.Event) -> None:
    """Put a streamed text's batches in ``feed`` as they come, waking the renderer; set at
    the end too, so that the renderer sees it."""
    try:
        async with contextlib.aclosing(batches):
            async for steps in batches:
                feed.put(steps)
                arrived.set()
    finally:
        arrived.set()

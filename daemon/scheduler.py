"""The utterance queue: who speaks next, who gets cut, and the latency record of each.

Requests go into one of two *lanes*. The speaker lane plays one utterance at a time: FIFO,
higher ``priority`` first, ``mode: interrupt`` cuts the current one and goes next. While one
utterance plays, the next one is already being synthesized into a bounded buffer; once it is
synthesized whole, the speaker is given it as its *cue*, so that it follows the current one
after ``synthesis.paragraph_silence`` (consecutive utterances are paragraphs) in the same
device stream: no synthesis delay, no device restart in between. Requests whose audio only goes
to network sinks (MQTT audio topics) don't wait for the speaker: they run in the network
lane, ``scheduler.parallel`` at a time, with the same ordering rules among those waiting.

Everything here runs on the event loop; the engine does the CPU work in its threads.
Timeline stamps: ``started`` is when synthesis began (for a prefetched utterance, before it
left the queue), ``first_audio`` when its first audio reached the sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tts import AudioFormat, SynthesisOptions, to_pcm16
from tts.compose import Step

from .buffer import AudioBuffer
from .engine import Engine
from .logcontext import context_for, request_context
from .metrics import LatencyRecord, Metrics, Timeline
from .request import NOTHING_TO_SAY, Request, RequestError
from .settings import SchedulerSettings
from .sinks.protocol import NetworkSink, Speaker, SpeakerUnavailable

log = logging.getLogger(__name__)

EventListener = Callable[[dict[str, Any]], None]
TERMINAL = ("finished", "stopped", "error")
AUDIO_VOICE = "wav"  # the latency record's voice for audio played as it came (no synthesis)
AUDIO_SLICE_SECONDS = 0.1  # audio played as it came goes to the speaker in pieces this long


@dataclass(eq=False)
class Utterance:
    req: Request
    order: int
    lane: Lane
    done: asyncio.Future[str]
    fmt: AudioFormat | None = None  # what its synthesis comes in, known once it starts
    buffer: AudioBuffer | None = None
    producer: asyncio.Task[None] | None = None
    player: asyncio.Task[None] | None = None
    cut: bool = False
    waiting_text: bool = False

    def sort_key(self) -> tuple[int, int, int]:
        return (0 if self.req.mode == "interrupt" else 1, -self.req.priority, self.order)


@dataclass(eq=False)
class Lane:
    name: str
    slots: int
    prefetch: bool
    waiting: list[Utterance] = field(default_factory=list)
    running: list[Utterance] = field(default_factory=list)


class Scheduler:
    def __init__(self, engine: Engine, metrics: Metrics, settings: SchedulerSettings,
                 synthesis: SynthesisOptions = SynthesisOptions(),
                 speaker: Speaker | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.settings = settings
        self.synthesis = synthesis
        self.speaker = speaker
        self.speaker_lane = Lane("speaker", 1, settings.prefetch)
        self.network_lane = Lane("network", settings.parallel, False)
        self.network_sinks: dict[str, NetworkSink] = {}
        self._listeners: list[EventListener] = []
        self._order = itertools.count()
        self._ids: dict[str, Utterance] = {}
        self._closing = False
        self._cued: Utterance | None = None  # the speaker's cue: the next utterance, whole
        # Called whenever synthesis or playback advances (the service feeds the watchdog).
        self.on_progress: Callable[[], None] | None = None

    # ------------------------------------------------------------------ wiring

    def register_sink(self, sink: NetworkSink) -> None:
        self.network_sinks[sink.name] = sink

    def add_listener(self, fn: EventListener) -> None:
        self._listeners.append(fn)

    def available_sinks(self) -> tuple[str, ...]:
        return (("speaker",) if self.speaker else ()) + tuple(self.network_sinks)

    # ------------------------------------------------------------------ requests

    def submit(self, req: Request) -> asyncio.Future[str]:
        """Queue ``req``; the future resolves to finished | stopped | error when it's done.

        Raises RequestError (nothing queued) when a sink is missing, the id is in use or the
        queue is full.
        """
        if self._closing:
            raise RequestError("herald is shutting down", req.id)
        missing = [s for s in req.sinks if s not in self.available_sinks()]
        if missing:
            why = ("the speaker is disabled or failed to start (see speaker.enabled and the "
                   "log)" if "speaker" in missing else f"sink {missing[0]!r} is not available")
            raise RequestError(why, req.id)
        if req.audio is not None and req.sinks != ("speaker",):
            raise RequestError("audio to play goes only to the speaker, not to "
                               f"{'+'.join(req.sinks)}", req.id)
        if req.id in self._ids:
            raise RequestError(f"id {req.id!r} is already queued or playing; use a new id",
                               req.id)
        waiting = self.waiting_count()
        if waiting >= self.settings.max_queue:
            raise RequestError(f"queue full ({waiting} waiting, scheduler.max_queue): try "
                               "again later", req.id)
        lane = self.speaker_lane if "speaker" in req.sinks else self.network_lane
        utt = Utterance(req, next(self._order), lane, asyncio.get_running_loop().create_future())
        self._ids[req.id] = utt
        lane.waiting.append(utt)
        lane.waiting.sort(key=Utterance.sort_key)
        what = (f"{len(req.audio) / 2 / req.audio_rate:.1f} s of audio" if req.audio is not None
                else f"{len(req.text)} chars, voice {req.voice}")
        with request_context(req.id):
            log.info("%s queued from %s for %s (%s, priority %d, %s)", req.id, req.front,
                     "+".join(req.sinks), what, req.priority, req.mode)
        self._emit("queued", req)
        if req.mode == "interrupt":
            for other in list(lane.running):
                self._cut(other)
        self._pump(lane)
        return utt.done

    def stop(self, request_id: str | None = None) -> list[str]:
        """Stop one utterance (queued or playing), or everything; the ids affected.

        Raises RequestError when ``request_id`` is unknown.
        """
        if request_id is not None:
            utt = self._ids.get(request_id)
            if utt is None:
                raise RequestError(f"nothing queued or playing with id {request_id!r}",
                                   request_id)
            targets = [utt]
        else:
            # waiting ones first: dropping them never frees a slot the others could take
            targets = [u for lane in self._lanes() for u in lane.waiting + lane.running]
        for utt in targets:
            if utt in utt.lane.waiting:
                self._drop(utt)
            else:
                self._cut(utt)
        return [u.req.id for u in targets]

    def snapshot(self) -> dict[str, Any]:
        running = self.speaker_lane.running + self.network_lane.running
        return {"state": "speaking" if running else "idle", "queue": self.waiting_count(),
                "current_id": running[0].req.id if running else None}

    def waiting_count(self) -> int:
        return sum(len(lane.waiting) for lane in self._lanes())

    def problem(self) -> str | None:
        """What keeps work in hand from progressing (a speaker that takes no audio), or None."""
        return self.speaker.stalled() if self.speaker is not None else None

    def busy(self) -> bool:
        """Work in hand that should be progressing (not idle, not waiting for streamed text)."""
        return any(not u.waiting_text for lane in self._lanes() for u in lane.running)

    async def close(self, timeout: float = 2.0) -> None:
        """Stop everything (cutting the current utterance) and wait for the players to end."""
        self._closing = True
        self.stop()
        players = [u.player for lane in self._lanes() for u in lane.running if u.player]
        if players:
            await asyncio.wait(players, timeout=timeout)

    # ------------------------------------------------------------------ internals

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress()

    def _lanes(self) -> tuple[Lane, Lane]:
        return self.speaker_lane, self.network_lane

    def _emit(self, event: str, req: Request, error: str | None = None) -> None:
        payload: dict[str, Any] = {"event": event, "id": req.id}
        if error is not None:
            payload["error"] = error
        for fn in self._listeners:
            try:
                fn(payload)
            except Exception:
                log.exception("event listener failed on %s", payload)

    def _pump(self, lane: Lane) -> None:
        while lane.waiting and len(lane.running) < lane.slots and not self._closing:
            utt = lane.waiting.pop(0)
            lane.running.append(utt)
            utt.player = asyncio.create_task(self._play(utt), name=f"herald-play-{utt.req.id}",
                                             context=context_for(utt.req.id))
        if (lane.prefetch and lane.waiting and lane.waiting[0].producer is None
                and not any(u.producer for u in lane.waiting)):
            self._start_producer(lane.waiting[0])
        self._recue()
        self.metrics.queue_depth.set(self.waiting_count())
        self.metrics.active.set(len(self.speaker_lane.running) + len(self.network_lane.running))

    def _drop(self, utt: Utterance) -> None:
        """Remove a waiting utterance before it started."""
        utt.lane.waiting.remove(utt)
        self._ids.pop(utt.req.id, None)
        if utt.producer:
            utt.producer.cancel()
        if utt.req.stream:
            utt.req.stream.fail(RequestError("stopped"))
        with request_context(utt.req.id):
            log.info("%s stopped before it started", utt.req.id)
        self.metrics.request(utt.req.front, "stopped")
        self._emit("stopped", utt.req)
        if not utt.done.done():
            utt.done.set_result("stopped")
        self._pump(utt.lane)

    def _cut(self, utt: Utterance) -> None:
        """Stop a running utterance: its player ends at once, the speaker fades out."""
        if utt.cut:
            return
        utt.cut = True
        if utt.buffer:
            utt.buffer.abort()
        if utt.producer:
            utt.producer.cancel()
        if "speaker" in utt.req.sinks and self.speaker:
            self.speaker.cut(utt)

    def _start_producer(self, utt: Utterance) -> None:
        if utt.req.audio is not None:
            return  # nothing to synthesize: the audio is played as it came
        utt.fmt = self.engine.audio_format(utt.req.voice)
        utt.buffer = AudioBuffer(int(self.settings.buffer_seconds * utt.fmt.rate))
        utt.req.timeline.started = time.monotonic()
        utt.producer = asyncio.create_task(self._produce(utt), name=f"herald-synth-{utt.req.id}",
                                           context=context_for(utt.req.id))

    async def _produce(self, utt: Utterance) -> None:
        req, buffer = utt.req, utt.buffer
        assert buffer is not None
        opts = req.options(self.synthesis)
        error: BaseException | None = None
        try:
            if req.stream is None:
                chunks = self.engine.stream(req.text, req.voice, opts, req.text_format)
            else:
                planner = self.engine.planner(req.voice, opts, req.text_format)
                chunks = self.engine.stream_steps(self._arriving(utt, req.stream.steps(planner)),
                                                  req.voice, opts)
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    self._progress()
                    await buffer.put(chunk)
        except asyncio.CancelledError:
            buffer.abort()
            raise
        except Exception as e:
            error = e
        finally:
            req.timeline.synth_done = time.monotonic()
        buffer.finish(error)
        self._recue()  # whole now: it can be the speaker's cue

    async def _arriving(self, utt: Utterance, batches: AsyncGenerator[list[Step], None]
                        ) -> AsyncGenerator[list[Step], None]:
        """A streamed text's sentences, with the wait for each marked as waiting for text
        (time the watchdog must not count as synthesis stuck)."""
        async with contextlib.aclosing(batches):
            while True:
                utt.waiting_text = True
                try:
                    steps = await anext(batches)
                except StopAsyncIteration:
                    return
                finally:
                    utt.waiting_text = False
                    self._progress()
                yield steps

    async def _play(self, utt: Utterance) -> None:
        req, t = utt.req, utt.req.timeline
        error: str | None = None
        source: AsyncIterator[bytes]
        if req.audio is not None:
            voice = AUDIO_VOICE
            fmt = AudioFormat(req.audio_rate)
            t.started = t.synth_done = time.monotonic()  # nothing to synthesize: synth_ms 0
            source = _slices(req.audio, fmt, AUDIO_SLICE_SECONDS)
        else:
            if utt.producer is None:
                self._start_producer(utt)
            assert utt.buffer is not None and utt.fmt is not None
            voice = req.voice or self.engine.catalog.default
            fmt = utt.fmt
            source = self._synthesized(utt.buffer)
        self._emit("started", req)
        log.info("%s started (queue %.0f ms)", req.id, (time.monotonic() - t.received) * 1000)
        streams = [self.network_sinks[s].open(req.id, fmt) for s in req.sinks if s != "speaker"]
        on_speaker = "speaker" in req.sinks
        samples = 0
        underruns = 0

        async def pcm() -> AsyncIterator[bytes]:
            nonlocal samples, error
            try:
                async for data in source:
                    if utt.cut:  # stopped before the speaker had started on it
                        return
                    samples += len(data) // 2
                    for s in streams:
                        s.write(data)
                    if not on_speaker:
                        _first_audio(t)
                    self._progress()
                    yield data
            except _SynthesisFailed as e:  # play what came before it, then report
                error = str(e)

        try:
            if on_speaker:
                assert self.speaker is not None
                stats = await self.speaker.play(fmt, pcm(), partial(_first_audio, t), key=utt,
                                                pause=self.synthesis.paragraph_silence)
                underruns = stats.underruns
                utt.cut = utt.cut or stats.cut
            else:
                async for _ in pcm():
                    pass
        except SpeakerUnavailable as e:
            error = f"speaker unavailable: {e}"
        except asyncio.CancelledError:
            utt.cut = True
        except Exception as e:
            log.exception("%s: playback failed", req.id)
            error = _describe(e)
        finally:
            if utt.producer and not utt.producer.done():
                utt.producer.cancel()
            if samples == 0 and not error and not utt.cut and req.audio is None:
                error = NOTHING_TO_SAY  # "...": silence is not "finished" (HTTP says 400)
            outcome = "error" if error else ("stopped" if utt.cut else "finished")
            for s in streams:
                try:
                    s.close(outcome)
                except Exception:
                    log.exception("%s: closing a sink failed", req.id)
            t.finished = time.monotonic()
            self._finish(utt, outcome, error, voice, samples / fmt.rate, underruns)

    def _recue(self) -> None:
        """Keep the speaker's cue on the next speaker utterance while one plays, once the next
        is known whole: the speaker then goes on with it after the paragraph pause, in the
        same device stream, the moment the current one ends by itself. One that stops being
        next (an interrupt or a higher priority goes first, it was stopped) is withdrawn (if
        it had started, it fades out, and is heard whole in its turn); one that has become
        the current keeps it: its player claims it."""
        if self.speaker is None:
            return
        lane = self.speaker_lane
        nxt = lane.waiting[0] if lane.waiting and lane.running and not self._closing else None
        if nxt is not None and not _whole(nxt):
            nxt = None
        prev = self._cued
        if prev is nxt:
            return
        self._cued = nxt
        if prev is not None and prev not in lane.running:
            self.speaker.cut(prev)
            prev.req.timeline.first_audio = None  # it is heard when its turn comes
        if nxt is not None:
            if nxt.req.audio is not None:
                fmt, pcm = AudioFormat(nxt.req.audio_rate), nxt.req.audio
            else:
                assert nxt.buffer is not None and nxt.fmt is not None
                fmt = nxt.fmt
                pcm = b"".join(to_pcm16(c.samples) for c in nxt.buffer.peek())
            self.speaker.cue(nxt, fmt, pcm, self.synthesis.paragraph_silence,
                             partial(self._cue_first_audio, nxt))

    def _cue_first_audio(self, utt: Utterance) -> None:
        """The speaker started the cue of ``utt`` (unless it was withdrawn meanwhile)."""
        if utt is self._cued or utt in self.speaker_lane.running:
            _first_audio(utt.req.timeline)

    @staticmethod
    async def _synthesized(buffer: AudioBuffer) -> AsyncIterator[bytes]:
        """The synthesized chunks as PCM; a synthesis error ends them as ``_SynthesisFailed``."""
        while True:
            try:
                chunk = await buffer.get()
            except Exception as e:
                raise _SynthesisFailed(_describe(e)) from e
            if chunk is None:
                return
            yield to_pcm16(chunk.samples)

    def _finish(self, utt: Utterance, outcome: str, error: str | None, voice: str,
                audio_seconds: float, underruns: int) -> None:
        req = utt.req
        if req.stream:
            req.stream.fail(RequestError(outcome))
        rec = LatencyRecord.from_timeline(req.id, req.front, "+".join(req.sinks), voice,
                                          req.timeline, audio_seconds, underruns,
                                          "ok" if outcome == "finished" else outcome)
        self.metrics.record(rec)
        utt.lane.running.remove(utt)
        self._ids.pop(req.id, None)
        if error:
            log.warning("%s failed: %s", req.id, error)
        self._emit(outcome, req, error)
        if not utt.done.done():
            utt.done.set_result(outcome)
        self._pump(utt.lane)


def _whole(utt: Utterance) -> bool:
    """All of the utterance's audio is known: played as it came, or synthesized to the end."""
    return utt.req.audio is not None or (utt.buffer is not None and utt.buffer.complete)


def _first_audio(t: Timeline) -> None:
    """The utterance's first audio reached its sink (stamped the first time only)."""
    if t.first_audio is None:
        t.first_audio = time.monotonic()


class _SynthesisFailed(Exception):
    """The producer failed after some audio: what was made is played, then this is reported."""


async def _slices(pcm: bytes, fmt: AudioFormat, seconds: float) -> AsyncIterator[bytes]:
    """Whole PCM in pieces of about ``seconds``, the way synthesis hands audio over, so the
    speaker's jitter buffer (not one huge push) sets how far ahead of the device it runs."""
    step = max(1, round(fmt.rate * seconds)) * fmt.width * fmt.channels
    for start in range(0, len(pcm), step):
        yield pcm[start:start + step]


def _describe(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if isinstance(e, (RequestError, ValueError)) else f"synthesis failed: {text}"

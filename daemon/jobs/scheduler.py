"""The utterance queue: who speaks next, who gets cut, and the latency record of each.

Requests go into one of two *lanes*. The speaker lane plays one utterance at a time: FIFO,
higher ``priority`` first, ``mode: interrupt`` cuts the current one and goes next. While one
utterance plays, the next one is already being synthesized into a bounded buffer; once it is
synthesized whole, the speaker is given it as its *cue*, so that it follows the current one
after ``synthesis.paragraph_silence`` (consecutive utterances are paragraphs) in the same
device stream: no synthesis delay, no device restart in between. Requests whose audio only goes
to network sinks (MQTT audio topics) don't wait for the speaker: they run in the network
lane, ``scheduler.parallel`` at a time, with the same ordering rules among those waiting.
Jobs a client connection waits for (HTTP, Wyoming: a ``ClientSink``) run in the client lane
at once, within their front's share (``limit``); the client's pace holds their synthesis,
and a client that leaves stops its job.

A request may carry its audio's source instead (``Request.source``: audio a fleet worker
makes for a satellite): it runs through the same lanes, events, stop and latency record, its
source taking the place of the synthesis; stopping the request closes the source.

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
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import partial
from typing import Any

from tts.audio import AudioFormat
from tts.options import SynthesisOptions

from ..errors import NOTHING_TO_SAY, RequestError, failure
from ..listeners import Listeners
from ..logs import context_for, request_context
from ..settings import SchedulerSettings
from ..sinks.protocol import NetworkSink, Speaker, SpeakerUnavailable
from ..synthesis.contracts import AudioSource, Synthesis
from .buffer import AudioBuffer
from .metrics import LatencyRecord, Metrics, Timeline
from .request import Request
from .utterance import (
    Lane,
    SynthesisFailed,
    Utterance,
    first_audio,
    from_text,
    sink_names,
    slices,
    synthesized,
    whole,
)

log = logging.getLogger(__name__)

EventListener = Callable[[dict[str, Any]], None]
TERMINAL = ("finished", "stopped", "error")
AUDIO_VOICE = "wav"  # the latency record's voice for audio played as it came (no synthesis)
AUDIO_SLICE_SECONDS = 0.1  # audio played as it came goes to the speaker in pieces this long
# Audio synthesized ahead of a client connection (HTTP, Wyoming), in seconds: the client's
# own pace sets the synthesis' beyond this (back-pressure), so a client that reads slowly or
# not at all holds little memory and no worker.
CLIENT_AHEAD_SECONDS = 1.0
NO_MODEL = ("this herald has no model (node.role = \"satellite\"): its requests are "
            "synthesized by the fleet's workers")


class Scheduler:
    def __init__(self, engine: Synthesis | None, metrics: Metrics, settings: SchedulerSettings,
                 synthesis: SynthesisOptions = SynthesisOptions(),
                 speaker: Speaker | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.settings = settings
        self.synthesis = synthesis
        self.speaker = speaker
        self.speaker_lane = Lane("speaker", 1, settings.prefetch)
        self.network_lane = Lane("network", settings.parallel, False)
        # Jobs a client connection waits for (HTTP, Wyoming) start at once: the fronts admit
        # them (``limit``, their connection caps) and the engine shares its workers among them
        # by their playback deadlines.
        self.client_lane = Lane("client", 1 << 30, False)
        self._limits: dict[str, tuple[int, str]] = {}
        self.network_sinks: dict[str, NetworkSink] = {}
        self._listeners: Listeners[[dict[str, Any]]] = Listeners(
            log, "event listener failed on %s", log_args=True)
        self._order = itertools.count()
        self._ids: dict[str, Utterance] = {}
        self._closing = False
        self._cued: Utterance | None = None  # the speaker's cue: the next utterance, whole
        # Called whenever synthesis or playback advances (the service feeds the watchdog).
        self.on_progress: Callable[[], None] | None = None
        # Where a request's audio comes from when there is no engine here (a satellite: the
        # fleet's pool, daemon.fleet.pool); it raises RequestError when it cannot be had.
        self.make_source: Callable[[Request], AudioSource] | None = None

    # ------------------------------------------------------------------ wiring

    def register_sink(self, sink: NetworkSink) -> None:
        self.network_sinks[sink.name] = sink

    def add_listener(self, fn: EventListener) -> None:
        self._listeners.add(fn)

    def available_sinks(self) -> tuple[str, ...]:
        return (("speaker",) if self.speaker else ()) + tuple(self.network_sinks)

    def limit(self, front: str, jobs: int, setting: str) -> None:
        """Admit at most ``jobs`` from ``front`` at once (waiting or running); more are
        refused as ``busy``. ``setting`` names the key that sets it, for the message."""
        self._limits[front] = (jobs, setting)

    def count(self, front: str | None = None) -> int:
        """Jobs in hand (waiting or running), of one front or of all."""
        return sum(1 for u in self._ids.values() if front is None or u.req.front == front)

    # ------------------------------------------------------------------ requests

    def submit(self, req: Request) -> asyncio.Future[str]:
        """Queue ``req``; the future resolves to finished | stopped | error when it's done.

        Raises RequestError (nothing queued) when a sink is missing, the id is in use or the
        queue is full.
        """
        if self._closing:
            raise RequestError("herald is shutting down", req.id, "unavailable")
        missing = [s for s in req.sinks if s not in self.available_sinks()]
        if missing:
            why = ("the speaker is disabled or failed to start (see speaker.enabled and the "
                   "log)" if "speaker" in missing else f"sink {missing[0]!r} is not available")
            raise RequestError(why, req.id, "unavailable")
        if not req.sinks and req.client is None:
            raise RequestError("the request has nowhere to go: name a sink", req.id)
        if self.engine is None and req.audio is None and req.source is None:
            if self.make_source is None:
                raise RequestError(NO_MODEL, req.id, "unavailable")
            req.source = self.make_source(req)
        if req.audio is not None and req.sinks != ("speaker",):
            raise RequestError("audio to play goes only to the speaker, not to "
                               f"{'+'.join(req.sinks)}", req.id)
        if req.id in self._ids:
            raise RequestError(f"id {req.id!r} is already queued or playing; use a new id",
                               req.id)
        self._admit(req)
        spoken: Request | None = None
        if req.client is not None and "speaker" in req.sinks:
            # The client's job and the speaker's copy: two queues, one synthesis (the
            # client's job feeds the copy), a latency record each.
            spoken = replace(req, sinks=("speaker",), client=None, stream=None,
                             timeline=Timeline(received=req.timeline.received))
            req.sinks = tuple(s for s in req.sinks if s != "speaker")
        lane = (self.speaker_lane if "speaker" in req.sinks else
                self.client_lane if req.client is not None else self.network_lane)
        utt = Utterance(req, next(self._order), lane, asyncio.get_running_loop().create_future())
        self._ids[req.id] = utt
        if req.client is not None:
            req.client.on_leave = partial(self._leave, utt)
        if spoken is not None:
            copy = Utterance(spoken, next(self._order), self.speaker_lane,
                             asyncio.get_running_loop().create_future(), feeder=utt)
            utt.tee.append(copy)
            self._start_producer(utt)  # before either player starts: it makes both buffers
            self._queue(copy)
        self._queue(utt)
        return utt.done

    def _queue(self, utt: Utterance) -> None:
        req, lane = utt.req, utt.lane
        lane.waiting.append(utt)
        lane.waiting.sort(key=Utterance.sort_key)
        what = (f"{len(req.audio) / 2 / req.audio_rate:.1f} s of audio" if req.audio is not None
                else f"{len(req.text)} chars, voice {req.voice}"
                + (" (made elsewhere)" if req.source is not None else ""))
        with request_context(req.id):
            log.info("%s queued from %s for %s (%s, priority %d, %s)", req.id, req.front,
                     sink_names(req), what, req.priority, req.mode)
        self._emit("queued", req)
        if req.mode == "interrupt":
            for other in list(lane.running):
                self._cut(other)
        self._pump(lane)

    def _admit(self, req: Request) -> None:
        """One admission policy for every front: a bounded queue, and each front's share."""
        waiting = self.waiting_count()
        if waiting >= self.settings.max_queue:
            raise RequestError(f"queue full ({waiting} waiting, scheduler.max_queue): try "
                               "again later", req.id, "busy")
        jobs, setting = self._limits.get(req.front, (0, ""))
        if jobs and self.count(req.front) >= jobs:
            raise RequestError(f"busy: all {jobs} synthesis slots are in use ({setting}); "
                               "try again shortly", req.id, "busy")

    def _leave(self, utt: Utterance) -> None:
        """The job's client went away: stop it, as a ``stop`` would."""
        if self._ids.get(utt.req.id) is not utt:
            return
        with request_context(utt.req.id):
            log.info("%s: its %s client went away; stopping it", utt.req.id, utt.req.front)
        if utt in utt.lane.waiting:
            self._drop(utt)
        else:
            self._cut(utt)

    def stop(self, request_id: str | None = None) -> list[str]:
        """Stop one utterance (queued or playing), or everything; the ids affected.

        Raises RequestError when ``request_id`` is unknown.
        """
        if request_id is not None:
            utt = self._ids.get(request_id)
            if utt is None:
                raise RequestError(f"nothing queued or playing with id {request_id!r}",
                                   request_id)
            targets = [utt, *utt.tee]
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
        running = [u for lane in self._lanes() for u in lane.running]
        return {"state": "speaking" if running else "idle", "queue": self.waiting_count(),
                "current_id": running[0].req.id if running else None}

    def waiting_count(self) -> int:
        return sum(len(lane.waiting) for lane in self._lanes())

    def problem(self) -> str | None:
        """What keeps work in hand from progressing (a speaker that takes no audio), or None."""
        return self.speaker.stalled() if self.speaker is not None else None

    def busy(self) -> bool:
        """Work in hand that should be progressing (not idle, not waiting for streamed text)."""
        return any(not (u.waiting_text or u.req.source is not None and u.req.source.waiting)
                   for lane in self._lanes() for u in lane.running)

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

    def _lanes(self) -> tuple[Lane, Lane, Lane]:
        return self.speaker_lane, self.network_lane, self.client_lane

    def _emit(self, event: str, req: Request, error: RequestError | None = None) -> None:
        payload: dict[str, Any] = {"event": event, "id": req.id}
        if error is not None:
            payload["error"] = str(error)
            payload["code"] = error.code
        self._listeners(payload)

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
        self.metrics.active.set(sum(len(lane.running) for lane in self._lanes()))

    def _drop(self, utt: Utterance) -> None:
        """Remove a waiting utterance before it started."""
        utt.lane.waiting.remove(utt)
        self._forget(utt)
        utt.cut = True
        if utt.buffer:
            utt.buffer.abort()
        self._release(utt)
        if utt.req.stream:
            utt.req.stream.fail(RequestError("stopped"))
        if utt.req.client is not None:
            utt.req.client.close("stopped")
        with request_context(utt.req.id):
            log.info("%s stopped before it started", utt.req.id)
        if utt.req.client is None:  # else its front counts how it answered it
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
        self._release(utt)
        if utt.req.client is not None:
            utt.req.client.leave()  # a player waiting on it goes on (and ends) at once
        if "speaker" in utt.req.sinks and self.speaker:
            self.speaker.cut(utt)

    def _forget(self, utt: Utterance) -> None:
        """``utt`` has ended or gone: its id is free, and its client's going away no longer
        concerns it. The client lets go of it too: holding it, the client and the utterance
        (with its request and buffers) would form a cycle that only a full pass of the
        garbage collector frees, and those are rare in a process with torch's objects."""
        if self._ids.get(utt.req.id) is utt:  # a tee's copy shares its feeder's id
            del self._ids[utt.req.id]
            if utt.req.client is not None:
                utt.req.client.on_leave = None

    def _release(self, utt: Utterance) -> None:
        """Stop the synthesis that feeds ``utt`` once nobody reads it any more."""
        owner = utt.feeder or utt
        if owner.producer and not owner.producer.done() and all(
                u.cut or u.done.done() for u in (owner, *owner.tee)):
            owner.producer.cancel()

    def _start_producer(self, utt: Utterance) -> None:
        if utt.req.audio is not None or utt.feeder is not None or utt.buffer is not None:
            return  # played as it came, fed by another's synthesis, or already started
        utt.fmt = (utt.req.source.format if utt.req.source is not None else
                   self._engine().audio_format(utt.req.voice))
        ahead = (CLIENT_AHEAD_SECONDS if utt.lane is self.client_lane else
                 self.settings.buffer_seconds)
        utt.buffer = AudioBuffer(int(ahead * utt.fmt.rate))
        utt.req.timeline.started = time.monotonic()
        for copy in utt.tee:
            copy.fmt = utt.fmt
            copy.buffer = AudioBuffer(int(self.settings.buffer_seconds * utt.fmt.rate))
            copy.req.timeline.started = utt.req.timeline.started
        utt.producer = asyncio.create_task(self._produce(utt), name=f"herald-synth-{utt.req.id}",
                                           context=context_for(utt.req.id))

    def _engine(self) -> Synthesis:
        if self.engine is None:  # submit() refuses such a request: a bug if it gets here
            raise RuntimeError(NO_MODEL)
        return self.engine

    async def _produce(self, utt: Utterance) -> None:
        req = utt.req
        buffers = [u.buffer for u in (utt, *utt.tee) if u.buffer is not None]
        error: BaseException | None = None
        try:
            pieces = (req.source.pcm() if req.source is not None else
                      from_text(self._engine(), utt, self.synthesis, self._progress))
            async with contextlib.aclosing(pieces):
                async for piece in pieces:
                    self._progress()
                    for buffer in buffers:  # one whose reader left takes it at once
                        await buffer.put(piece)
        except asyncio.CancelledError:
            for buffer in buffers:
                buffer.abort()
            raise
        except Exception as e:
            error = e
        finally:
            for u in (utt, *utt.tee):
                u.req.timeline.synth_done = time.monotonic()
        for buffer in buffers:
            buffer.finish(error)
        self._recue()  # whole now: it can be the speaker's cue


    async def _play(self, utt: Utterance) -> None:
        req, t = utt.req, utt.req.timeline
        error: RequestError | None = None
        source: AsyncIterator[bytes]
        if req.audio is not None:
            voice = AUDIO_VOICE
            fmt = AudioFormat(req.audio_rate)
            t.started = t.synth_done = time.monotonic()  # nothing to synthesize: synth_ms 0
            source = slices(req.audio, fmt, AUDIO_SLICE_SECONDS)
        else:
            self._start_producer(utt)
            assert utt.buffer is not None and utt.fmt is not None
            voice = req.voice or self._engine().default_voice
            fmt = utt.fmt
            source = synthesized(utt.buffer)
        self._emit("started", req)
        log.info("%s started (queue %.0f ms)", req.id, (time.monotonic() - t.received) * 1000)
        streams = [self.network_sinks[s].open(req.id, fmt) for s in req.sinks if s != "speaker"]
        client = req.client
        if client is not None:
            client.open(fmt)
        on_speaker = "speaker" in req.sinks
        samples = 0
        underruns = 0
        skew: float | None = None

        async def pcm() -> AsyncIterator[bytes]:
            nonlocal samples, error
            try:
                async for data in source:
                    if utt.cut:  # stopped before the speaker had started on it
                        return
                    samples += len(data) // 2
                    for s in streams:
                        s.write(data)
                    if client is not None:
                        await client.write(data)  # the client's pace: back-pressure
                    if not on_speaker:
                        first_audio(t)
                    self._progress()
                    yield data
            except SynthesisFailed as e:  # play what came before it, then report
                error = e.error

        try:
            if on_speaker:
                assert self.speaker is not None
                stats = await self.speaker.play(
                    fmt, pcm(), partial(first_audio, t), key=utt,
                    pause=self.synthesis.paragraph_silence, start_at=req.play_at,
                    preroll=req.source.preroll if req.source is not None else 0.0)
                underruns, skew = stats.underruns, stats.skew
                utt.cut = utt.cut or stats.cut
            else:
                async for _ in pcm():
                    pass
        except SpeakerUnavailable as e:
            error = RequestError(f"speaker unavailable: {e}", req.id, "unavailable")
        except asyncio.CancelledError:
            utt.cut = True
        except Exception as e:
            log.exception("%s: playback failed", req.id)
            error = failure(e, req.id)
        finally:
            utt.cut = utt.cut or error is not None
            self._release(utt)
            if samples == 0 and not error and not utt.cut and req.audio is None:
                # "...": silence is not "finished" (HTTP says 400)
                error = RequestError(NOTHING_TO_SAY, req.id, "nothing-to-say")
            outcome = "error" if error else ("stopped" if utt.cut else "finished")
            for s in streams:
                try:
                    s.close(outcome)
                except Exception:
                    log.exception("%s: closing a sink failed", req.id)
            t.finished = time.monotonic()
            self._finish(utt, outcome, error, voice, samples / fmt.rate, underruns, skew)

    def _recue(self) -> None:
        """Keep the speaker's cue on the next speaker utterance while one plays, once the next
        is known whole: the speaker then goes on with it after the paragraph pause, in the
        same device stream, the moment the current one ends by itself. One that stops being
        next (an interrupt or a higher priority goes first, it was stopped) is withdrawn (if
        it had started, it fades out, and is heard whole in its turn); one that has become
        the current keeps it: its player claims it. One with a start time (``play_at``)
        is never cued: it starts at its time, not after the pause."""
        if self.speaker is None:
            return
        lane = self.speaker_lane
        nxt = lane.waiting[0] if lane.waiting and lane.running and not self._closing else None
        if nxt is not None and (not whole(nxt) or nxt.req.play_at is not None):
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
                pcm = b"".join(nxt.buffer.peek())
            self.speaker.cue(nxt, fmt, pcm, self.synthesis.paragraph_silence,
                             partial(self._cue_first_audio, nxt))

    def _cue_first_audio(self, utt: Utterance) -> None:
        """The speaker started the cue of ``utt`` (unless it was withdrawn meanwhile)."""
        if utt is self._cued or utt in self.speaker_lane.running:
            first_audio(utt.req.timeline)

    def _finish(self, utt: Utterance, outcome: str, error: RequestError | None, voice: str,
                audio_seconds: float, underruns: int, skew: float | None) -> None:
        req = utt.req
        if req.stream:
            req.stream.fail(RequestError(outcome))
        record = None
        # A client's job that sent no audio files no record: its front answered it (4xx).
        if req.client is None or audio_seconds or outcome == "finished":
            record = LatencyRecord.from_timeline(
                req.id, req.front, sink_names(req), voice, req.timeline, audio_seconds,
                underruns, "ok" if outcome == "finished" else outcome, skew)
            self.metrics.record(record)
        if req.client is not None:
            req.client.close(outcome, error, record)
        utt.lane.running.remove(utt)
        self._forget(utt)
        if error:
            log.warning("%s failed: %s", req.id, error)
        self._emit(outcome, req, error)
        if not utt.done.done():
            utt.done.set_result(outcome)
        self._pump(utt.lane)
        if self.engine is not None and not any(
                lane.running or lane.waiting for lane in self._lanes()):
            self.engine.rest()


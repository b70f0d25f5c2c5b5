"""A fleet worker: takes synthesis jobs from the fleet's share group and streams their audio
to the satellites that play them.

Every worker subscribes ``$share/<share_group>/F/jobs``, so the broker gives each job to one
of them. For each job, in order:

* a copy of a (job, attempt) already taken is ignored (a broker may deliver twice);
* a job past its ``expires`` is answered ``failed``/``too-old``, never spoken late;
* with ``fleet.slots`` jobs in hand, ``busy``: the owner sends it again, and the share group
  gives it to another worker;
* a job that cannot be served (unknown voice, bad text, an audio prefix outside the fleet)
  is answered ``failed`` with the code any front would give it;
* otherwise the worker subscribes to the job's ``cancel`` (and ``text``, for streamed text),
  submits it to this node's scheduler and answers ``claimed``. The job is then an ordinary
  request of front ``fleet`` (id = job id, the network lane): it shows on the worker's own
  event topic, metrics and latency records. Its audio goes to the job's topics through the
  ``fleet`` sink (``audio``); ``working`` goes out every ``fleet.heartbeat`` seconds while
  the worker holds it, ``done`` or ``failed`` (with the request error's code) at the end.

A new attempt of a job this worker still holds supersedes it (its owner gave up on the old
one): the old one is stopped first. ``cancel`` stops the job after the chunk being made, as
``stop`` does on a device. Everything here runs on the event loop; paho's thread only hands
messages over (``link``) and torch runs in the engine's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, cast

from ..context import Context
from ..errors import Code, RequestError, TextTooLong, failure
from ..jobs.fields import check_ssml, check_text, refuse_control
from ..jobs.request import Request, TextStream
from ..jobs.scheduler import Scheduler
from ..logs import request_context
from ..mqtt.reassembly import RecentIds
from ..mqtt.topics import TopicError
from ..settings import Settings
from .audio import FleetAudioSink, JobAudio
from .link import FleetLink
from .messages import Cancel, Job, JobState, JobStateName, TextPiece, VoiceInfo, decode

log = logging.getLogger(__name__)

FRONT = "fleet"  # the front and the sink of a job's request


@dataclass(eq=False)
class Held:
    """A job this worker has claimed (or is about to)."""

    job: Job
    request: Request
    subscriptions: list[str]
    text_chars: int = 0  # streamed text: characters in hand (the job's text and pieces)
    last_text: float = field(default_factory=time.monotonic)
    cancelled: bool = False  # by its owner: no state to send back
    error: RequestError | None = None  # from the scheduler's error event
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    heartbeat: asyncio.Task[None] | None = None


class Worker:
    name = "fleet worker"

    def __init__(self, settings: Settings, link: FleetLink, ctx: Context,
                 scheduler: Scheduler) -> None:
        self.settings = settings
        self.fleet = settings.fleet
        self.link = link
        self.topics = link.topics
        self.ctx = ctx
        self.scheduler = scheduler
        self.device_id = settings.device_id
        self.slots = self.fleet.slots or 2 * ctx.engine.workers
        self.held: dict[str, Held] = {}
        self.audio: dict[str, JobAudio] = {}  # read by the sink when a job's audio starts
        self.sink = FleetAudioSink(link.publish, self.audio)
        self._seen = RecentIds()  # "<job>#<attempt>" taken (or refused): a copy is ignored
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        scheduler = self.scheduler
        scheduler.register_sink(self.sink)
        scheduler.limit(FRONT, self.slots, "fleet.slots")
        # A held job runs at once: the engine shares its workers among the jobs by their
        # playback deadlines, as it does among any streams.
        scheduler.network_lane.slots = max(scheduler.network_lane.slots, self.slots)
        scheduler.add_listener(self._on_event)
        self.link.slots = self.slots
        self._refresh_voices()
        if self.ctx.voices is not None:
            self.ctx.voices.add_listener(lambda changes: self._refresh_voices(publish=True))
        self.link.subscribe(self.topics.jobs_shared, self._on_job)
        log.info("fleet worker: taking jobs from %s, %d at once (fleet.slots)",
                 self.topics.jobs_shared, self.slots)

    async def stop(self) -> None:
        """Take no more jobs; the scheduler has stopped the ones in hand (each answered
        ``failed``/``unavailable``, so its owner sends it to another worker)."""
        self.link.unsubscribe(self.topics.jobs_shared)
        for held in list(self.held.values()):
            if held.heartbeat is not None:
                held.heartbeat.cancel()
        for task in list(self._tasks):
            task.cancel()

    def _refresh_voices(self, publish: bool = False) -> None:
        voices = []
        for info in self.ctx.engine.catalog.infos():
            try:
                voices.append(VoiceInfo(name=info.name, language=info.config.language,
                                        rate=info.config.sample_rate,
                                        speakers=max(1, info.config.num_speakers)))
            except ValueError as e:  # a name or language no fleet message can carry
                log.warning("fleet worker: voice %s left out of the presence: %s", info.name,
                            e)
        self.link.voices = voices
        if publish:
            self.link.publish_presence()

    # ------------------------------------------------------------------ jobs

    def _on_job(self, topic: str, payload: bytes) -> None:
        job = decode(Job, payload, topic)
        if job is None:
            return
        key = f"{job.job}#{job.attempt}"
        if key in self._seen:
            log.debug("fleet job %s attempt %d delivered again: ignored", job.job, job.attempt)
            return
        self._seen.add(key)
        with request_context(job.job):
            self._take(job)

    def _take(self, job: Job) -> None:
        late = time.time() - job.expires
        if late > 0:
            self._refuse(job, RequestError(f"job expired {late:.1f} s before it reached "
                                           f"this worker: not spoken late", job.job,
                                           "too-old"))
            return
        held = self.held.get(job.job)
        if held is not None:
            if held.job.attempt >= job.attempt:
                log.info("fleet job %s: attempt %d arrived after attempt %d; ignored",
                         job.job, job.attempt, held.job.attempt)
                return
            log.info("fleet job %s: attempt %d supersedes attempt %d held here", job.job,
                     job.attempt, held.job.attempt)
            self._cancel(held)
            self._spawn(self._take_after(held, job))
            return
        if len(self.held) >= self.slots:
            log.info("fleet job %s attempt %d: busy (%d jobs in hand, fleet.slots)", job.job,
                     job.attempt, len(self.held))
            self._state(job, "busy")
            return
        try:
            req = self._request(job)
        except RequestError as e:
            self._refuse(job, e)
            return
        self._claim(job, req)

    async def _take_after(self, old: Held, job: Job) -> None:
        await old.ended.wait()
        with request_context(job.job):
            self._take(job)

    def _request(self, job: Job) -> Request:
        """The request a job stands for, checked as any front checks one (RequestError)."""
        rid, engine = job.job, self.ctx.engine
        try:
            self.topics.check_audio_prefix(job.audio)
        except TopicError as e:
            raise RequestError(str(e), rid) from None
        try:
            voice = engine.resolve_voice(job.voice)
            engine.check_speaker(voice, job.speaker)
        except Exception as e:
            raise failure(e, rid) from None
        max_text = self.settings.mqtt.max_text
        stream = TextStream() if job.stream else None
        if stream is None:
            check_text(job.text, max_text, "mqtt.max_text", rid)
            if job.format == "ssml":
                check_ssml(job.text, rid)
        else:
            refuse_control(job.text, rid)
            if len(job.text) > max_text:
                raise TextTooLong(f"text is {len(job.text)} characters; the limit is "
                                  f"{max_text} (mqtt.max_text)", rid)
            if job.text:
                stream.feed(job.text)
        o = job.options
        defaults = replace(self.scheduler.synthesis, gain=o.gain,
                           sentence_silence=o.sentence_silence)
        return Request(text=job.text, id=rid, voice=voice, speaker=job.speaker,
                       rate=o.length_scale, sinks=(FRONT,), front=FRONT, seed=o.seed,
                       noise_scale=o.noise_scale, noise_w=o.noise_w, stream=stream,
                       text_format=job.format, defaults=defaults)

    def _claim(self, job: Job, req: Request) -> None:
        subscriptions = [self.topics.job_cancel(job.job)]
        if job.stream:
            subscriptions.append(self.topics.job_text(job.job))
        held = Held(job, req, subscriptions, text_chars=len(job.text))
        # Subscribed before "claimed" goes out on the same connection: the broker has the
        # subscriptions by the time the owner sees the claim and sends the rest of the text.
        self.link.subscribe(subscriptions[0], lambda t, p: self._on_cancel(held, t, p))
        if job.stream:
            self.link.subscribe(subscriptions[1], lambda t, p: self._on_text(held, t, p))
        self.audio[job.job] = JobAudio(job.job, job.attempt, self.device_id, req.voice or "",
                                       job.audio, job.chunk_ms, job.skip_chunks,
                                       self.fleet.sync_delay if job.sync else None)
        try:
            done = self.scheduler.submit(req)
        except RequestError as e:
            self.link.unsubscribe(*subscriptions)
            del self.audio[job.job]
            self._refuse(job, e)
            return
        self.held[job.job] = held
        log.info("fleet job %s attempt %d from %s claimed (%d of %d slots)%s", job.job,
                 job.attempt, job.owner, len(self.held), self.slots,
                 f", from chunk {job.skip_chunks}" if job.skip_chunks else "")
        self._state(job, "claimed", text_offset=held.text_chars)
        held.heartbeat = asyncio.create_task(self._beat(held), name=f"fleet-beat-{job.job}")
        done.add_done_callback(lambda f: self._ended(held, f))

    def _refuse(self, job: Job, error: RequestError) -> None:
        log.warning("fleet job %s attempt %d from %s refused: %s", job.job, job.attempt,
                    job.owner, error)
        self.ctx.metrics.request(FRONT, "rejected")
        self._state(job, "busy" if error.code == "busy" else "failed", error=error)

    async def _beat(self, held: Held) -> None:
        """``working`` while the job is held; a streamed text that stops coming fails."""
        timeout = self.settings.mqtt.stream_timeout
        while True:
            await asyncio.sleep(self.fleet.heartbeat)
            self._state(held.job, "working", chunks=self._chunks(held),
                        text_offset=held.text_chars)
            stream = held.request.stream
            if (stream is not None and not stream.closed
                    and time.monotonic() - held.last_text > timeout):
                stream.fail(RequestError(f"no text for {timeout:g} s (mqtt.stream_timeout)",
                                         held.job.job, "timeout"))

    def _chunks(self, held: Held) -> int:
        stream = self.sink.streams.get(held.job.job)
        return stream.chunks if stream is not None and stream.job.attempt == held.job.attempt \
            else 0

    def _ended(self, held: Held, done: asyncio.Future[str]) -> None:
        job = held.job
        outcome = "error" if done.cancelled() or done.exception() else done.result()
        if held.heartbeat is not None:
            held.heartbeat.cancel()
        self.link.unsubscribe(*held.subscriptions)
        if self.held.get(job.job) is held:
            del self.held[job.job]
        if self.audio.get(job.job) is not None and self.audio[job.job].attempt == job.attempt:
            del self.audio[job.job]
        error = held.error if outcome == "error" else None
        if outcome == "error" and error is None:
            error = RequestError("synthesis failed", job.job, "synthesis-failed")
        stream = self.sink.streams.get(job.job)
        if stream is not None and stream.job.attempt == job.attempt:
            del self.sink.streams[job.job]
            stream.end(error)
        chunks = stream.chunks if stream is not None else 0
        with request_context(job.job):
            if held.cancelled:
                log.info("fleet job %s attempt %d cancelled after %d chunks", job.job,
                         job.attempt, chunks)
            elif outcome == "finished":
                self._state(job, "done", chunks=chunks, text_offset=held.text_chars)
            elif outcome == "stopped":
                self._state(job, "failed", chunks=chunks, error=RequestError(
                    f"worker {self.device_id} stopped it (shutting down, or a stop on its "
                    "device)", job.job, "unavailable"))
            else:
                self._state(job, "failed", chunks=chunks, error=error)
        held.ended.set()

    # ------------------------------------------------------------------ per-job messages

    def _on_cancel(self, held: Held, topic: str, payload: bytes) -> None:
        cancel = decode(Cancel, payload, topic)
        if cancel is None or self.held.get(held.job.job) is not held:
            return
        if cancel.attempt is not None and cancel.attempt != held.job.attempt:
            return
        with request_context(held.job.job):
            log.info("fleet job %s attempt %d: cancelled by its owner", held.job.job,
                     held.job.attempt)
            self._cancel(held)

    def _cancel(self, held: Held) -> None:
        held.cancelled = True
        with contextlib.suppress(RequestError):  # it has just ended
            self.scheduler.stop(held.job.job)

    def _on_text(self, held: Held, topic: str, payload: bytes) -> None:
        """A piece of streamed text: what it adds to the text in hand is fed on (a piece
        sent again, or overlapping, adds only what is new)."""
        piece = decode(TextPiece, payload, topic)
        stream = held.request.stream
        if piece is None or stream is None or stream.closed:
            return
        held.last_text = time.monotonic()
        if piece.offset > held.text_chars:
            log.warning("fleet job %s: text from offset %d, but only %d characters arrived "
                        "before it; ignored", held.job.job, piece.offset, held.text_chars)
            return
        new = piece.text[held.text_chars - piece.offset:]
        try:
            if new:
                refuse_control(new, held.job.job)
                limit = self.settings.mqtt.max_text
                if held.text_chars + len(new) > limit:
                    raise TextTooLong(f"streamed text is over {limit} characters "
                                      "(mqtt.max_text)", held.job.job)
                held.text_chars += len(new)
                held.request.text += new
            if new or piece.end:
                stream.feed(new, final=piece.end)
        except RequestError as e:
            stream.fail(e)

    # ------------------------------------------------------------------ out

    def _on_event(self, ev: dict[str, Any]) -> None:
        """The scheduler's error event for a job: the code its state carries."""
        held = self.held.get(str(ev.get("id")))
        if held is not None and ev.get("event") == "error":
            held.error = RequestError(str(ev.get("error")), held.job.job,
                                      cast(Code, ev.get("code", "synthesis-failed")))

    def _state(self, job: Job, state: JobStateName, chunks: int = 0, text_offset: int = 0,
               error: RequestError | None = None) -> None:
        code: Code | None = error.code if error is not None else None
        message = JobState(job=job.job, attempt=job.attempt, worker=self.device_id,
                           state=state, chunks=chunks, text_offset=text_offset,
                           error=str(error)[:2000] if error is not None else None, code=code)
        self.link.publish(self.topics.job_state(job.job), message.to_json())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

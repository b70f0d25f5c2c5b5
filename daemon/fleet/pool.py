"""The owner's side of a fleet job: what the node that received a request does to have it
synthesized by some worker and its audio delivered whole, whatever happens to the workers.

The owner sends the job on ``F/jobs`` (one worker of the share group gets it) and follows its
state on ``F/job/<job>/state``. Every send is a new attempt, and a worker's state names its
attempt, so the rules below hold on any MQTT 5 broker, whatever it redelivers:

* not claimed within ``claim_timeout``, or refused ``busy`` (after a short backoff): sent
  again, so the share group can give it to another worker. A ``busy`` answer proves the
  workers are there: the job waits for room as it would in a single herald's queue, resent
  at most every ``BUSY_BACKOFF_MAX`` seconds, and spends nothing of ``attempts``;
* claimed, then silent (no state, no chunk) for ``dead_after``: the worker is gone; the job is
  sent again with ``skip_chunks`` = the chunks received in a row, the old attempt cancelled,
  and a ``resumed`` event says who was lost and from which chunk it went on. The seed is
  fixed for the whole job, so the new worker's audio joins the old one's sample for sample;
* a state from an attempt that is not the current one (a late claim): that attempt is
  cancelled;
* after ``attempts`` sends that no worker answered: ``unavailable``, saying to start one.

Streamed text (``say/stream``) goes on ``F/job/<job>/text`` from the offset the claim names.
Stopping the request cancels the job. ``JobSource`` is a device request's audio source
(``daemon.synthesis.contracts.AudioSource``); a group announcement (``announce``) is a job of its
own, which every member plays from the group's audio (``daemon.fleet.receiver``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from tts.audio import AudioFormat
from tts.errors import VoiceError
from tts.options import SynthesisOptions
from tts.text import SentenceBuffer

from ..errors import RequestError, failure
from ..jobs.fields import SEED_RANGE
from ..jobs.request import Request
from ..jobs.utterance import skip_writing
from ..settings import Settings
from .incoming import Incoming
from .link import FleetLink
from .messages import Cancel, Job, JobOptions, JobState, Resumed, TextPiece, decode
from .receiver import Receiver
from .topics import FleetTopics
from .voices import FleetVoices

log = logging.getLogger(__name__)

EventSink = Callable[[dict[str, Any]], None]
BUSY_BACKOFF = 0.25  # seconds before a job refused busy is sent again; doubles each time
BUSY_BACKOFF_MAX = 1.0  # ... up to this: a slot that frees is taken within about a second
POLL = 0.25  # seconds: the longest the supervisor sleeps between two looks at its clocks


class Pool:
    """The jobs this node owns."""

    name = "fleet pool"

    def __init__(self, link: FleetLink, settings: Settings, voices: FleetVoices,
                 receiver: Receiver, synthesis: Callable[[], SynthesisOptions],
                 device_events: EventSink) -> None:
        self.link = link
        self.topics: FleetTopics = link.topics
        self.fleet = settings.fleet
        self.device_id = settings.device_id
        self.chunk_ms = settings.mqtt.audio.chunk_ms
        self.voices = voices
        self.receiver = receiver
        self.synthesis = synthesis  # the [synthesis] defaults requests are built on
        self.device_events = device_events
        self.jobs: dict[str, Supervisor] = {}
        self._announcements: dict[str, asyncio.Task[None]] = {}
        # A worker's last will is news to every job it holds: no need to wait for dead_after.
        voices.add_listener(self._presence_changed)

    def _presence_changed(self) -> None:
        for sup in self.jobs.values():
            sup.wake()

    # ------------------------------------------------------------------ requests

    def source(self, req: Request) -> JobSource:
        """A device request's audio, synthesized by the fleet (the scheduler's
        ``make_source`` on a node without a model). Raises RequestError when no worker
        offers its voice."""
        return JobSource(self, req, self._format(req))

    def _format(self, req: Request) -> AudioFormat:
        try:
            return self.voices.audio_format(req.voice)
        except VoiceError as e:
            raise failure(e, req.id) from None
        except RequestError as e:
            raise RequestError(str(e), req.id, e.code) from None

    def announce(self, req: Request, group: str, events: EventSink) -> None:
        """A group announcement this node received: synthesized once, streamed once to the
        group's audio, played by every member (this one too) at the same moment. Raises
        RequestError (nothing sent) when no worker can take it or the id is in use."""
        self._format(req)  # the same refusals as a device request
        incoming = self.receiver.expect(req.id, group)
        job = Supervisor(self, req, self.topics.group_audio(group), incoming, events, group)
        events({"event": "queued", "id": req.id})
        self._announcements[req.id] = task = asyncio.create_task(
            self._announce(job, events), name=f"herald-fleet-{req.id}")
        task.add_done_callback(lambda _: self._announcements.pop(req.id, None))

    async def _announce(self, job: Supervisor, events: EventSink) -> None:
        rid = job.req.id
        try:
            await job.run()
            if job.stopped:
                events({"event": "stopped", "id": rid})
                return
        except RequestError as e:
            log.warning("fleet: announcement %s failed: %s", rid, e)
            events({"event": "error", "id": rid, "error": str(e), "code": e.code})
            return
        except asyncio.CancelledError:
            events({"event": "stopped", "id": rid})
            raise
        finally:
            self.receiver.release(rid)  # this member's playback holds it as long as it needs
        events({"event": "finished", "id": rid})

    def stop_announcements(self, group: str, job_id: str | None = None) -> list[str]:
        """Cancel this node's announcements to ``group`` (one, or all); the ids."""
        stopped = []
        for rid in list(self._announcements):
            sup = self.jobs.get(rid)
            if sup is not None and sup.group == group and job_id in (None, rid):
                sup.stop()
                stopped.append(rid)
        return stopped

    async def start(self) -> None:
        """Nothing to start: jobs come with requests."""

    async def stop(self) -> None:
        tasks = list(self._announcements.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

    # ------------------------------------------------------------------ the wire

    def _on_state(self, topic: str, payload: bytes) -> None:
        job_id = self.topics.job_of(topic, "state")
        sup = self.jobs.get(job_id) if job_id is not None else None
        state = decode(JobState, payload, topic)
        if sup is not None and state is not None and state.job == job_id:
            sup.on_state(state)

    def publish(self, topic: str, payload: str) -> None:
        self.link.publish(topic, payload)


class JobSource:
    """A device request's audio from the fleet: the job is sent when the scheduler opens it
    (the request's turn, or the one before: prefetch), and cancelled when it closes it."""

    def __init__(self, pool: Pool, req: Request, fmt: AudioFormat) -> None:
        self.pool = pool
        self.req = req
        self._format = fmt
        self._job: Supervisor | None = None

    @property
    def format(self) -> AudioFormat:
        return self._format

    @property
    def preroll(self) -> float:
        """Its audio comes chunk by chunk over the network from a worker that has just begun
        (the first chunks come barely in time on a busy one): ``fleet.preroll`` of it is
        buffered before it plays, so a late second chunk is not a gap at the start."""
        return self.pool.fleet.preroll

    @property
    def waiting(self) -> bool:
        """The worker has all of the streamed text so far, and the rest is not written."""
        job = self._job
        return job is not None and job.writing()

    async def pcm(self) -> AsyncGenerator[bytes, None]:
        pool, req = self.pool, self.req
        incoming = pool.receiver.expect(req.id)
        sup = self._job = Supervisor(pool, req, pool.topics.device_audio(), incoming,
                                     pool.device_events,
                                     written=lambda: skip_writing(req.timeline))
        task = asyncio.create_task(sup.run(), name=f"herald-fleet-{req.id}")
        try:
            async for piece in incoming.pcm():
                yield piece
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RequestError):
                await task
            pool.receiver.release(req.id)  # once all of it is read, not when it has come


class Supervisor:
    """One job, from its first send to its audio received whole (or given up)."""

    def __init__(self, pool: Pool, req: Request, audio: str, incoming: Incoming,
                 events: EventSink, group: str | None = None,
                 written: Callable[[], None] | None = None) -> None:
        """``written``: called once a streamed text's first sentence is complete."""
        self.pool = pool
        self.written = written
        self.req = req
        self.audio = audio
        self.incoming = incoming
        self.events = events
        self.group = group
        fleet = pool.fleet
        self.claim_timeout, self.dead_after = fleet.claim_timeout, fleet.dead_after
        self.attempts = fleet.attempts
        self.attempt = 0
        self.unanswered = 0  # sends that no worker answered, not even ``busy``
        self.worker: str | None = None  # who claimed the current attempt
        self.claimed = False
        self.deadline = 0.0  # the current attempt is sent again if unclaimed by then
        self.heard = 0.0  # the current attempt's last state
        self.busy = 0  # busy answers in a row
        self.refused = False  # the current attempt was answered busy
        self.lost: tuple[str, int] | None = None  # a worker gone silent, and from which chunk
        self.failure: RequestError | None = None
        self.started = False
        self.stopped = False  # a stop cut it short (``stop``)
        opts = req.options(pool.synthesis())
        seed = req.seed if req.seed is not None else secrets.randbelow(SEED_RANGE[1] + 1)
        # The wire's gain must be above 0: a request at volume 0 is sent at -80 dB.
        self.options = JobOptions(seed=seed, length_scale=opts.length_scale,
                                  noise_scale=opts.noise_scale, noise_w=opts.noise_w,
                                  gain=max(opts.gain, 1e-4),
                                  sentence_silence=opts.sentence_silence)
        self.text: list[str] = [req.text] if req.stream is None else []
        self.text_end = req.stream is None
        self.forwarded = 0  # characters of streamed text the current worker has
        self.end_sent = False
        self._wake = asyncio.Event()
        incoming.on_progress = self._wake.set

    # ------------------------------------------------------------------ the supervision

    def stop(self) -> None:
        """Cut the job short: ``run`` returns at once and the worker is told to cancel.

        A flag, not a cancellation of the task that runs it: ``run`` checks it at every
        wake-up, so the stop holds whatever the task was awaiting when it came (a cancel
        can be lost where an awaited thing completes at that moment), and the worker is
        always told."""
        self.stopped = True
        self._wake.set()

    async def run(self) -> None:
        """Until the audio is here whole, or ``stop``; raises RequestError when the job
        cannot be done (after the incoming audio has been told so)."""
        pool, rid = self.pool, self.req.id
        pool.jobs[rid] = self
        pool.link.subscribe(pool.topics.job_state(rid), pool._on_state)
        feeder = (asyncio.create_task(self._feed(), name=f"herald-fleet-text-{rid}")
                  if self.req.stream is not None else None)
        try:
            self._send()
            while not self.incoming.complete and not self.stopped:
                if self.failure is not None:
                    raise self.failure
                if not self.started and self.incoming.start is not None:
                    self.started = True
                    if self.group is not None:
                        self.events({"event": "started", "id": rid})
                now = time.monotonic()
                if not self.claimed:
                    if now >= self.deadline:
                        self._send_again()
                elif (now - max(self.heard, self.incoming.heard) > self.dead_after
                      or self.worker is not None and self.pool.voices.gone(self.worker)):
                    self._worker_lost()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL):
                        await self._wake.wait()
        except RequestError as e:
            self.incoming.fail(e)
            raise
        finally:
            if feeder is not None:
                feeder.cancel()
            if not self.incoming.complete and self.attempt:
                pool.publish(pool.topics.job_cancel(rid), Cancel(attempt=None).to_json())
            pool.link.unsubscribe(pool.topics.job_state(rid))
            if pool.jobs.get(rid) is self:
                del pool.jobs[rid]

    def _send(self) -> None:
        pool, req = self.pool, self.req
        self.attempt += 1
        self.claimed, self.worker, self.refused = False, None, False
        self.deadline = time.monotonic() + self.claim_timeout
        self.forwarded, self.end_sent = 0, False
        now = time.time()
        job = Job(job=req.id, attempt=self.attempt, owner=pool.device_id,
                  text="".join(self.text), voice=req.voice or pool.voices.default_voice,
                  options=self.options, audio=self.audio, expires=now + self.claim_timeout
                  * self.attempts, sent=now, format=req.text_format, speaker=req.speaker,
                  chunk_ms=pool.chunk_ms, skip_chunks=self.incoming.received,
                  stream=req.stream is not None, sync=self.group is not None)
        log.debug("fleet: job %s attempt %d sent (from chunk %d)", req.id, self.attempt,
                  job.skip_chunks)
        pool.publish(pool.topics.jobs, job.to_json())

    def _send_again(self) -> None:
        if not self.refused:  # the last send was not answered busy: it counts
            self.unanswered += 1
        if self.unanswered >= self.attempts:
            if self.lost is not None:
                self._resumed(None)
            raise RequestError(f"no herald worker answered on {self.pool.topics.jobs} "
                               f"({self.attempts} sends, fleet.attempts): start one, see "
                               "README, \"A fleet\"", self.req.id, "unavailable")
        self._send()

    def wake(self) -> None:
        self._wake.set()

    def _worker_lost(self) -> None:
        lost, skip = self.worker or "?", self.incoming.received
        why = ("went offline" if self.pool.voices.gone(lost) else
               f"silent for {self.dead_after:g} s (fleet.dead_after)")
        log.warning("fleet: job %s: worker %s %s: sending it again from chunk %d", self.req.id,
                    lost, why, skip)
        self._cancel(self.attempt)
        self.lost = (lost, skip)
        self._send_again()

    def _cancel(self, attempt: int) -> None:
        self.pool.publish(self.pool.topics.job_cancel(self.req.id),
                          Cancel(attempt=attempt).to_json())

    def _resumed(self, worker: str | None) -> None:
        assert self.lost is not None
        lost, skip = self.lost
        self.lost = None
        self.events(Resumed(id=self.req.id, lost=lost, from_chunk=skip,
                            worker=worker).as_dict())

    def on_state(self, state: JobState) -> None:
        now = time.monotonic()
        if state.attempt != self.attempt:
            if state.state in ("claimed", "working") and state.attempt < self.attempt:
                self._cancel(state.attempt)  # one it gave up on: it must not go on
            return
        if state.state in ("claimed", "working"):
            if not self.claimed:
                self.claimed, self.worker, self.busy = True, state.worker, 0
                log.debug("fleet: job %s attempt %d claimed by %s", self.req.id,
                          self.attempt, state.worker)
                if self.lost is not None:
                    self._resumed(state.worker)
                if state.state == "claimed":
                    self.forwarded, self.end_sent = state.text_offset, False
                self._forward()
            self.heard = now
        elif state.state == "busy" and not self.claimed:
            self.busy += 1
            self.refused = True
            backoff = min(BUSY_BACKOFF_MAX, BUSY_BACKOFF * 2 ** (self.busy - 1))
            self.deadline = now + backoff * random.uniform(0.5, 1.0)
        elif state.state == "done":
            self.heard = now
        elif state.state == "failed":
            if state.code == "too-old":  # it sat too long somewhere: send a fresh one
                self.claimed, self.deadline = False, now
            else:
                self.failure = RequestError(state.error or "the worker failed", self.req.id,
                                            state.code or "synthesis-failed")
        self._wake.set()

    # ------------------------------------------------------------------ streamed text

    async def _feed(self) -> None:
        assert self.req.stream is not None
        sentences = SentenceBuffer()
        try:
            async for piece in self.req.stream.pieces():
                self.text.append(piece)
                self._forward()
                if self.written is not None and sentences.feed(piece):
                    self._first_sentence()
        except RequestError as e:
            self.failure = e
            self._wake.set()
            return
        self.text_end = True
        self._forward()
        self._first_sentence()

    def writing(self) -> bool:
        """A streamed text still being written, all of which the worker has: what it makes
        waits for the writer, not for herald."""
        return (self.req.stream is not None and not self.text_end and self.claimed
                and self.forwarded == sum(map(len, self.text)))

    def _first_sentence(self) -> None:
        """The writer (an LLM) has finished a sentence: from now on the worker has
        something to say, and the time before is not herald's (``skip_writing``)."""
        if self.written is not None:
            self.written()
            self.written = None

    def _forward(self) -> None:
        """What the current worker does not have of the streamed text, from its offset."""
        if not self.claimed or self.req.stream is None or self.end_sent:
            return
        text = "".join(self.text)
        rest = text[self.forwarded:]
        if not rest and not self.text_end:
            return
        piece = TextPiece(offset=self.forwarded, text=rest, end=self.text_end)
        self.pool.publish(self.pool.topics.job_text(self.req.id), piece.to_json())
        self.forwarded, self.end_sent = len(text), self.text_end

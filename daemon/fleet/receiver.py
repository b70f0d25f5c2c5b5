"""The satellite player: the audio the fleet addresses to this node, its device's and its
groups', put in order (``incoming``) and played through the scheduler like any request.

A device's audio is for the jobs this node owns: the pool reads it (``expect``), and the
request that asked for it plays it. A group's audio is for every member: each one, the
announcement's owner included, makes it a local request when its ``start`` arrives (id = the
job id, front ``fleet``, the speaker, ``play_at`` from the start), so each member publishes
``started``/``finished`` and its own latency record on its own device topics. A job whose
audio stops coming for longer than its owner would take to resume it on another worker
(``dead_after`` + ``claim_timeout`` x ``attempts``) ends with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from tts.audio import AudioFormat

from ..errors import RequestError
from ..jobs.request import Request
from ..jobs.scheduler import Scheduler
from ..mqtt.reassembly import RecentIds
from ..settings.fleet import FleetSettings
from .incoming import Incoming, IncomingSource
from .link import FleetLink
from .messages import AudioStart, AudioStop, decode
from .topics import AudioTopic, FleetTopics

log = logging.getLogger(__name__)

FRONT = "fleet"  # the front a member's playback of a group announcement is counted under
WATCH_EVERY = 0.5  # seconds between two looks for stalled jobs


@dataclass(eq=False)
class _Job:
    incoming: Incoming
    owned: bool = False  # this node's pool supervises it
    playing: asyncio.Future[str] | None = None  # its local request, once submitted
    done: bool = False
    holders: set[str] = field(default_factory=set)


class Receiver:
    name = "fleet receiver"

    def __init__(self, topics: FleetTopics, fleet: FleetSettings,
                 scheduler: Scheduler | None) -> None:
        self.topics = topics
        self.fleet = fleet
        self.scheduler = scheduler  # None: a node that plays nothing (a worker)
        self.groups = list(fleet.groups) if scheduler is not None else []
        self.stall = fleet.dead_after + fleet.claim_timeout * fleet.attempts
        self._prefixes = {topics.device_audio(): None} | {
            topics.group_audio(g): g for g in self.groups}
        self._jobs: dict[str, _Job] = {}
        self._ended = RecentIds()  # jobs done with here: what still comes of them is dropped
        self._watch: asyncio.Task[None] | None = None

    def attach(self, link: FleetLink) -> None:
        for prefix in self._prefixes:
            link.subscribe(FleetTopics.audio_filter(prefix), self._on_audio)

    async def start(self) -> None:
        self._watch = asyncio.create_task(self._watch_stalls(), name="herald-fleet-stalls")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for job in list(self._jobs.values()):
            job.incoming.fail(RequestError("herald is shutting down", job.incoming.job,
                                           "unavailable"))

    # ------------------------------------------------------------------ for the pool

    def expect(self, job_id: str, group: str | None = None) -> Incoming:
        """The owner's hold on a job's audio, taken before the job is sent; ``release``
        gives it back. Raises RequestError if the id is in use here."""
        if job_id in self._jobs or job_id in self._ended:
            raise RequestError(f"id {job_id!r} was used here already; use a new id", job_id)
        job = self._jobs[job_id] = _Job(Incoming(job_id, group), owned=True)
        job.holders.add("owner")
        return job.incoming

    def release(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is not None:
            job.owned = False
            self._let_go(job_id, job, "owner")

    # ------------------------------------------------------------------ for the groups

    def jobs_of(self, group: str) -> list[str]:
        return [j for j, job in self._jobs.items() if job.incoming.group == group]

    def cut(self, job_id: str) -> None:
        """Stop this member's playback of a group job (a group ``stop``, or its owner said
        it stopped)."""
        job = self._jobs.get(job_id)
        if job is None:
            return
        job.incoming.fail(RequestError("stopped", job_id))
        if job.playing is not None and self.scheduler is not None:
            with contextlib.suppress(RequestError):  # it ended meanwhile
                self.scheduler.stop(job_id)
        self._let_go(job_id, job, "audio")

    def end(self, job_id: str, error: RequestError) -> None:
        """The job's owner gave up on it: what came is played, then ``error``."""
        job = self._jobs.get(job_id)
        if job is not None and not job.owned:
            job.incoming.fail(error)
            self._let_go(job_id, job, "audio")

    # ------------------------------------------------------------------ the wire

    def _where(self, topic: str) -> tuple[AudioTopic, str | None] | None:
        """What an audio topic names, and whose audio it is (a group, or None: ours)."""
        for prefix, group in self._prefixes.items():
            where = FleetTopics.audio_topic(prefix, topic)
            if where is not None:
                return where, group
        return None

    def _on_audio(self, topic: str, payload: bytes) -> None:
        found = self._where(topic)
        if found is None:
            return
        where, group = found
        job_id = where.job
        job = self._jobs.get(job_id)
        if job is None:
            if job_id in self._ended or group is None:
                log.debug("fleet: audio of job %s, not expected here: dropped", job_id)
                return
            job = self._jobs[job_id] = _Job(Incoming(job_id, group))
            job.holders.add("audio")  # until it starts playing, or stalls
        incoming = job.incoming
        if where.part == "chunk":
            assert where.seq is not None
            incoming.chunk(where.seq, payload)
        elif where.part == "start":
            start = decode(AudioStart, payload, topic)
            if start is not None and incoming.started(start) and group is not None:
                self._play(job, start)
        else:
            stop = decode(AudioStop, payload, topic)
            if stop is not None:
                incoming.stopped(stop)

    def _play(self, job: _Job, start: AudioStart) -> None:
        """A group job's first start: play it here."""
        incoming = job.incoming
        job_id = incoming.job
        if self.scheduler is None:
            return
        req = Request(text="", id=job_id, voice=start.voice, sinks=("speaker",), front=FRONT,
                      source=IncomingSource(incoming, AudioFormat(start.rate)),
                      play_at=start.play_at)
        try:
            job.playing = self.scheduler.submit(req)
        except RequestError as e:
            log.warning("fleet: group %s announcement %s not played here: %s", incoming.group,
                        job_id, e)
            incoming.close()
            self._let_go(job_id, job, "audio")
            return
        job.holders.add("audio")
        job.playing.add_done_callback(lambda _: self._let_go(job_id, job, "audio"))

    def _let_go(self, job_id: str, job: _Job, holder: str) -> None:
        job.holders.discard(holder)
        if not job.holders and self._jobs.get(job_id) is job:
            del self._jobs[job_id]
            self._ended.add(job_id)
            job.incoming.close()

    async def _watch_stalls(self) -> None:
        """End the group jobs whose audio stopped coming (their owner is gone too, or it
        would have resumed them by now)."""
        while True:
            await asyncio.sleep(WATCH_EVERY)
            now = time.monotonic()
            for job_id, job in list(self._jobs.items()):
                incoming = job.incoming
                if job.owned or incoming.complete or now - incoming.heard < self.stall:
                    continue
                log.warning("fleet: group %s announcement %s: no audio for %.0f s (its owner "
                            "and worker are gone?): ending it", incoming.group, job_id,
                            now - incoming.heard)
                incoming.fail(RequestError(
                    f"the announcement's audio stopped coming for {self.stall:g} s "
                    "(fleet.dead_after + fleet.claim_timeout x fleet.attempts)", job_id,
                    "unavailable"))
                self._let_go(job_id, job, "audio")

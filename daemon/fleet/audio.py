"""A fleet job's audio: the MQTT audio stream (``daemon.sinks.mqtt_audio``) on the job's own
topics, ``<audio>/<job>/start``, ``.../chunk/<seq>``, ``.../stop``.

Three things differ from a device's audio topic, all for the satellites that play it:

* chunks are numbered from the start of the whole audio, and those before ``skip_chunks``
  are cut but not sent: a job resumed on another worker carries on where the satellites'
  audio stopped, each chunk under the seq it had, so a satellite plays each exactly once;
* ``start`` goes with the first chunk sent, so that ``play_at`` (``sync``: group members
  start together) counts from when audio is really on its way;
* ``stop`` waits for the worker, which knows why a job failed (``end``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tts import AudioFormat

from ..errors import RequestError
from ..settings import MqttAudioSettings
from ..sinks.mqtt_audio import MqttAudioStream
from .messages import AudioStart, AudioStop
from .topics import FleetTopics


@dataclass(frozen=True)
class JobAudio:
    """Where one job's audio goes, and what its ``start`` says."""

    job: str
    attempt: int
    worker: str
    voice: str
    prefix: str  # checked by FleetTopics.check_audio_prefix
    chunk_ms: int
    skip_chunks: int = 0
    sync_delay: float | None = None  # seconds from the first chunk sent to play_at


class _JobTopics:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def audio_start(self, request_id: str) -> str:
        return FleetTopics.audio_start(self.prefix, request_id)

    def audio_chunk(self, request_id: str, seq: int) -> str:
        return FleetTopics.audio_chunk(self.prefix, request_id, seq)

    def audio_stop(self, request_id: str) -> str:
        return FleetTopics.audio_stop(self.prefix, request_id)


class FleetAudioStream(MqttAudioStream):
    def __init__(self, sink: FleetAudioSink, job: JobAudio, fmt: AudioFormat) -> None:
        self.job = job
        self.started = False  # start sent
        self.outcome: str | None = None  # how the scheduler closed it
        self.play_at: float | None = None
        super().__init__(sink, job.job, fmt, _JobTopics(job.prefix), job.chunk_ms)

    def _start(self, start: dict[str, Any]) -> None:
        """Not yet: with the first chunk sent."""

    def _announce(self) -> None:
        if self.started:
            return
        self.started = True
        j = self.job
        if j.sync_delay is not None:
            self.play_at = time.time() + j.sync_delay
        start = AudioStart(rate=self.fmt.rate, job=j.job, attempt=j.attempt, worker=j.worker,
                           voice=j.voice, chunk_samples=self.chunk_samples,
                           play_at=self.play_at)
        self.sink.send(self.topics.audio_start(self.request_id), start.to_json())

    def _chunk(self, seq: int, data: bytes) -> None:
        if seq < self.job.skip_chunks:
            return  # the satellites have it from an earlier attempt
        self._announce()
        super()._chunk(seq, data)

    def _stop(self, outcome: str) -> None:
        self.outcome = outcome  # sent by end(), with the error if there was one

    def end(self, error: RequestError | None = None) -> None:
        """Send ``stop``: the audio is whole (``chunks`` of it from seq 0), or why not."""
        self._announce()
        outcome = "error" if error is not None else (self.outcome or "finished")
        stop = AudioStop(chunks=self.chunks, samples=self.samples,
                         outcome="error" if outcome == "error" else
                         "stopped" if outcome == "stopped" else "finished",
                         attempt=self.job.attempt,
                         error=str(error)[:2000] if error is not None else None,
                         code=error.code if error is not None else None)
        self.sink.send(self.topics.audio_stop(self.request_id), stop.to_json())


class FleetAudioSink:
    """The scheduler's ``fleet`` sink: a job's request (front ``fleet``, id = job id) goes to
    the job's topics, as ``jobs`` (the worker's, filled before it submits) says."""

    name = "fleet"

    def __init__(self, publish: Callable[[str, bytes | str], object],
                 jobs: Mapping[str, JobAudio]) -> None:
        self.settings = MqttAudioSettings(format="pcm", qos=1, retain=False)
        self.streams: dict[str, FleetAudioStream] = {}
        self._publish = publish
        self._jobs = jobs

    def open(self, request_id: str, fmt: AudioFormat) -> FleetAudioStream:
        stream = FleetAudioStream(self, self._jobs[request_id], fmt)
        self.streams[request_id] = stream
        return stream

    def send(self, topic: str, payload: bytes | str) -> None:
        self._publish(topic, payload)

    def encode(self, work: Callable[[Any], None], arg: Any) -> None:
        """PCM needs no encoder: nothing is queued here."""
        work(arg)

"""Audio out over MQTT: ``audio/<id>/start``, ``audio/<id>/chunk/<seq>``, ``audio/<id>/stop``.

The engine's chunks vary in length (small first, larger later); subscribers (a satellite
speaker, a recorder) are simpler when every chunk is the same duration, so the PCM is
re-cut into ``chunk_ms`` pieces here. Only the last chunk may be shorter.

With ``format = "opus"`` each piece goes through an Ogg Opus encoder (``tts.codec``) and a
chunk carries the Ogg pages that piece completed: the chunks joined in order are one Ogg
Opus file, and a subscriber can decode as they arrive. The encoding runs on one thread of
the sink's own, in order, so neither the event loop nor paho's network thread waits for it.

A fleet worker's audio (``daemon.fleet.audio``) is this same stream on a job's topics: it
overrides where the start, the chunks and the stop go, and when.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from tts import AudioFormat
from tts.codec import Encoder, encoder

from ..mqtt.topics import Topics
from ..settings import MqttAudioSettings
from ..thread_pools import pool

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes | str, int, bool], object]


class AudioOut(Protocol):
    """What a stream needs from its sink: the audio settings, publishing, the encoder's
    thread."""

    settings: MqttAudioSettings

    def send(self, topic: str, payload: bytes | str) -> None: ...
    def encode(self, work: Callable[[Any], None], arg: Any) -> None: ...


class AudioTopics(Protocol):
    """Where one stream's start, chunks and stop go (``daemon.mqtt.topics.Topics`` is one)."""

    def audio_start(self, request_id: str) -> str: ...
    def audio_chunk(self, request_id: str, seq: int) -> str: ...
    def audio_stop(self, request_id: str) -> str: ...


class MqttAudioStream:
    """One utterance's audio on its topics. ``write`` PCM as it comes, then ``close``.
    Chunks are ``chunk_ms`` long (the sink's setting unless given), numbered from 0."""

    def __init__(self, sink: AudioOut, request_id: str, fmt: AudioFormat,
                 topics: AudioTopics, chunk_ms: int | None = None) -> None:
        self.sink = sink
        self.request_id = request_id
        self.fmt = fmt
        self.topics = topics
        frame = fmt.width * fmt.channels
        self.chunk_samples = max(1, round(fmt.rate * (chunk_ms or sink.settings.chunk_ms)
                                          / 1000))
        self.chunk_bytes = self.chunk_samples * frame
        self._pending = bytearray()
        self.chunks = 0
        self.closed = False
        self.encoder: Encoder | None = None
        start: dict[str, Any] = {"format": "pcm", **fmt.as_dict()}
        if sink.settings.format != "pcm":
            self.encoder = encoder(sink.settings.format, fmt)
            out = self.encoder.audio_format
            start = {"format": self.encoder.format, "content_type": self.encoder.content_type,
                     "rate": out.rate, "channels": out.channels}
        self._pcm_samples = 0
        self._start(start)

    @property
    def samples(self) -> int:
        """Samples sent so far, at the start message's rate."""
        return self._pcm_samples if self.encoder is None else self.encoder.samples

    def write(self, pcm: bytes) -> None:
        self._pending += pcm
        while len(self._pending) >= self.chunk_bytes:
            self._piece(bytes(self._pending[: self.chunk_bytes]))
            del self._pending[: self.chunk_bytes]

    def close(self, outcome: str = "finished") -> None:
        if self.closed:
            return
        self.closed = True
        if self._pending:
            self._piece(bytes(self._pending))
            self._pending.clear()
        if self.encoder is None:
            self._stop(outcome)
        else:
            self.sink.encode(self._finish_encoding, outcome)

    def _piece(self, pcm: bytes) -> None:
        if self.encoder is None:
            self._pcm_samples += len(pcm) // (self.fmt.width * self.fmt.channels)
            self._send(pcm)
        else:
            self.sink.encode(self._encode, pcm)

    # On the sink's encoding thread, in the order they were queued:

    def _encode(self, pcm: bytes) -> None:
        assert self.encoder is not None
        data = self.encoder.feed(pcm)
        if data:
            self._send(data)

    def _finish_encoding(self, outcome: str) -> None:
        assert self.encoder is not None
        try:
            data = self.encoder.finish()
            if data:
                self._send(data)
        finally:
            self._stop(outcome)

    # Where and when each part goes (a fleet job's stream overrides these):

    def _start(self, start: dict[str, Any]) -> None:
        self.sink.send(self.topics.audio_start(self.request_id), json.dumps(start))

    def _stop(self, outcome: str) -> None:
        stop = {"chunks": self.chunks, "samples": self.samples, "outcome": outcome}
        self.sink.send(self.topics.audio_stop(self.request_id), json.dumps(stop))

    def _chunk(self, seq: int, data: bytes) -> None:
        self.sink.send(self.topics.audio_chunk(self.request_id, seq), data)

    def _send(self, data: bytes) -> None:
        self._chunk(self.chunks, data)
        self.chunks += 1


class MqttAudioSink:
    name = "mqtt"

    def __init__(self, publish: Publish, topics: Topics, settings: MqttAudioSettings) -> None:
        self.publish = publish
        self.topics = topics
        self.settings = settings
        self._encoding: ThreadPoolExecutor | None = None

    def open(self, request_id: str, fmt: AudioFormat) -> MqttAudioStream:
        return MqttAudioStream(self, request_id, fmt, self.topics)

    def send(self, topic: str, payload: bytes | str) -> None:
        self.publish(topic, payload, self.settings.qos, self.settings.retain)

    def encode(self, work: Callable[[Any], None], arg: Any) -> None:
        """Run ``work(arg)`` on the encoding thread, after everything queued before it."""
        if self._encoding is None:
            self._encoding = pool("herald-mqtt-enc")
        self._encoding.submit(self._logged, work, arg)

    @staticmethod
    def _logged(work: Callable[[Any], None], arg: Any) -> None:
        try:
            work(arg)
        except Exception:
            log.exception("MQTT audio: encoding failed")

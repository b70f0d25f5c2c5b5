"""Audio out over MQTT: ``audio/<id>/start``, ``audio/<id>/chunk/<seq>``, ``audio/<id>/stop``.

The engine's chunks vary in length (small first, larger later); subscribers (a satellite
speaker, a recorder) are simpler when every chunk is the same duration, so the PCM is
re-cut into ``chunk_ms`` pieces here. Only the last chunk may be shorter.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from tts import AudioFormat

from ..settings import MqttAudioSettings
from ..topics import Topics

Publish = Callable[[str, bytes | str, int, bool], object]


class MqttAudioStream:
    """One utterance's audio on its topics. ``write`` PCM as it comes, then ``close``."""

    def __init__(self, sink: MqttAudioSink, request_id: str, fmt: AudioFormat) -> None:
        self.sink = sink
        self.request_id = request_id
        self.fmt = fmt
        frame = fmt.width * fmt.channels
        self.chunk_bytes = max(1, round(fmt.rate * sink.settings.chunk_ms / 1000)) * frame
        self._pending = bytearray()
        self.chunks = 0
        self.bytes = 0
        self.closed = False
        sink.send(sink.topics.audio_start(request_id), json.dumps(fmt.as_dict()))

    @property
    def samples(self) -> int:
        return self.bytes // (self.fmt.width * self.fmt.channels)

    def write(self, pcm: bytes) -> None:
        self._pending += pcm
        while len(self._pending) >= self.chunk_bytes:
            self._send(bytes(self._pending[: self.chunk_bytes]))
            del self._pending[: self.chunk_bytes]

    def close(self, outcome: str = "finished") -> None:
        if self.closed:
            return
        self.closed = True
        if self._pending:
            self._send(bytes(self._pending))
            self._pending.clear()
        stop = {"chunks": self.chunks, "samples": self.samples, "outcome": outcome}
        self.sink.send(self.sink.topics.audio_stop(self.request_id), json.dumps(stop))

    def _send(self, data: bytes) -> None:
        self.sink.send(self.sink.topics.audio_chunk(self.request_id, self.chunks), data)
        self.chunks += 1
        self.bytes += len(data)


class MqttAudioSink:
    name = "mqtt"

    def __init__(self, publish: Publish, topics: Topics, settings: MqttAudioSettings) -> None:
        self.publish = publish
        self.topics = topics
        self.settings = settings

    def open(self, request_id: str, fmt: AudioFormat) -> MqttAudioStream:
        return MqttAudioStream(self, request_id, fmt)

    def send(self, topic: str, payload: bytes | str) -> None:
        self.publish(topic, payload, self.settings.qos, self.settings.retain)

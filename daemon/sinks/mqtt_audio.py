"""Audio out over MQTT: ``audio/<id>/start``, ``audio/<id>/chunk/<seq>``, ``audio/<id>/stop``.

The engine's chunks vary in length (small first, larger later); subscribers (a satellite
speaker, a recorder) are simpler when every chunk is the same duration, so the PCM is
re-cut into ``chunk_ms`` pieces here. Only the last chunk may be shorter.

With ``format = "opus"`` each piece goes through an Ogg Opus encoder (``tts.codec``) and a
chunk carries the Ogg pages that piece completed: the chunks joined in order are one Ogg
Opus file, and a subscriber can decode as they arrive. The encoding runs on one thread of
the sink's own, in order, so neither the event loop nor paho's network thread waits for it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tts import AudioFormat
from tts.codec import Encoder, encoder

from ..settings import MqttAudioSettings
from ..topics import Topics

log = logging.getLogger(__name__)

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
        self.closed = False
        self.encoder: Encoder | None = None
        start: dict[str, Any] = {"format": "pcm", **fmt.as_dict()}
        if sink.settings.format != "pcm":
            self.encoder = encoder(sink.settings.format, fmt)
            out = self.encoder.audio_format
            start = {"format": self.encoder.format, "content_type": self.encoder.content_type,
                     "rate": out.rate, "channels": out.channels}
        self._pcm_samples = 0
        sink.send(sink.topics.audio_start(request_id), json.dumps(start))

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

    def _stop(self, outcome: str) -> None:
        stop = {"chunks": self.chunks, "samples": self.samples, "outcome": outcome}
        self.sink.send(self.sink.topics.audio_stop(self.request_id), json.dumps(stop))

    def _send(self, data: bytes) -> None:
        self.sink.send(self.sink.topics.audio_chunk(self.request_id, self.chunks), data)
        self.chunks += 1


class MqttAudioSink:
    name = "mqtt"

    def __init__(self, publish: Publish, topics: Topics, settings: MqttAudioSettings) -> None:
        self.publish = publish
        self.topics = topics
        self.settings = settings
        self._encoding: ThreadPoolExecutor | None = None

    def open(self, request_id: str, fmt: AudioFormat) -> MqttAudioStream:
        return MqttAudioStream(self, request_id, fmt)

    def send(self, topic: str, payload: bytes | str) -> None:
        self.publish(topic, payload, self.settings.qos, self.settings.retain)

    def encode(self, work: Callable[[Any], None], arg: Any) -> None:
        """Run ``work(arg)`` on the encoding thread, after everything queued before it."""
        if self._encoding is None:
            self._encoding = ThreadPoolExecutor(1, thread_name_prefix="mqtt-audio-encode")
        self._encoding.submit(self._logged, work, arg)

    @staticmethod
    def _logged(work: Callable[[Any], None], arg: Any) -> None:
        try:
            work(arg)
        except Exception:
            log.exception("MQTT audio: encoding failed")

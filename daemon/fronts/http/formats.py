"""The audio formats an HTTP answer comes in: the ``response_format`` field (OpenAI's name,
since herald's ``format`` already means text or SSML), and the bytes that carry the audio,
raw or framed as server-sent events.

Encoding is ``tts.codec``'s. LAME and libopus take tens of milliseconds per second of audio
(more on a busy host), too long to hold the event loop, so their work runs on a small
thread pool, one job at a time per response, in order; FLAC, WAV and PCM cost next to
nothing and stay on the loop.

Server-sent events (``/tts/stream`` with ``Accept: text/event-stream``, and OpenAI's
``stream_format: "sse"``) follow OpenAI's speech stream: ``data:`` lines only, each a JSON
object whose ``type`` says what it is: ``speech.audio.delta`` with ``audio``, the next
encoded bytes in base64, then one ``speech.audio.done`` with ``usage``. herald counts no
tokens, so the usage is zeros; herald's own stream adds ``latency``, the utterance's
latency record.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Literal

from aiohttp import hdrs, web

from tts.audio import AudioFormat
from tts.codec import FORMATS, CodecName, Encoder, encode, encoder

from ...jobs.metrics import LatencyRecord
from ...thread_pools import pool
from .fields import ApiError, string_field

Events = Literal["herald", "openai"]  # whose server-sent events, or None for raw audio

SSE_CONTENT_TYPE = "text/event-stream"
STREAM_FORMATS = ("audio", "sse")  # OpenAI's ``stream_format``
_THREADED = frozenset({"mp3", "opus"})  # formats whose encoding leaves the loop
_pool = pool("herald-encode")
_NO_USAGE = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}


def response_format_field(fields: Mapping[str, Any], default: CodecName,
                          where: str = "") -> CodecName:
    """``response_format``: one of ``tts.codec.FORMATS``; 400 naming them otherwise."""
    value = string_field(fields, "response_format", where)
    if value is None:
        return default
    name = value.strip().lower()
    if name not in FORMATS:
        raise ApiError(400, f"{where}response_format {value!r} is not supported; supported: "
                       f"{', '.join(FORMATS)}", param="response_format")
    return name  # type: ignore[return-value]


def stream_format_field(fields: Mapping[str, Any]) -> bool:
    """OpenAI's ``stream_format``: "audio" (the default) or "sse"; True for SSE."""
    value = (string_field(fields, "stream_format") or "audio").strip().lower()
    if value not in STREAM_FORMATS:
        raise ApiError(400, f"stream_format {value!r} is not supported; supported: "
                       f"{', '.join(STREAM_FORMATS)}", param="stream_format")
    return value == "sse"


def wants_events(request: web.Request) -> bool:
    """The client asked for server-sent events (``Accept: text/event-stream``, not q=0)."""
    for part in request.headers.get(hdrs.ACCEPT, "").split(","):
        kind, *params = (p.strip().lower() for p in part.split(";"))
        if kind == SSE_CONTENT_TYPE and "q=0" not in params and "q=0.0" not in params:
            return True
    return False


async def encode_whole(name: CodecName, source: AudioFormat, pcm: bytes) -> bytes:
    """The whole utterance as one file, headers complete (``tts.codec.encode``), encoded off
    the loop where that costs."""
    if name in ("wav", "pcm"):
        return encode(name, source, pcm)
    return await asyncio.wrap_future(_pool.submit(encode, name, source, pcm))


class AudioBody:
    """One streamed response's bytes: s16le PCM in, encoded audio out, as it comes, raw or
    as server-sent events (``events``). ``close`` once the response ends, however it ends."""

    def __init__(self, name: CodecName, source: AudioFormat, events: Events | None = None
                 ) -> None:
        self._encoder: Encoder = encoder(name, source)
        self.events = events
        self.content_type = SSE_CONTENT_TYPE if events else self._encoder.content_type
        self._job: Future[bytes] | None = None  # the encoding job on the pool, if any

    async def feed(self, pcm: bytes) -> bytes:
        return self._frame(await self._encode(self._encoder.feed, pcm))

    async def finish(self, latency: Callable[[], LatencyRecord | None]) -> bytes:
        """The last bytes; for events, the done event (``latency`` gives herald's record)."""
        tail = self._frame(await self._encode(self._encoder.finish))
        if self.events is None:
            return tail
        done: dict[str, Any] = {"type": "speech.audio.done", "usage": dict(_NO_USAGE)}
        record = latency() if self.events == "herald" else None
        if record is not None:
            done["latency"] = record.as_dict()
        return tail + _event(done)

    def close(self) -> None:
        """Free the encoder; if a job of its is still running on the pool (the handler was
        cancelled while it waited), once that job has finished."""
        job = self._job
        if job is None:
            self._encoder.close()
        else:
            job.add_done_callback(lambda _: self._encoder.close())

    async def _encode(self, fn: Callable[..., bytes], *args: bytes) -> bytes:
        if self._encoder.format not in _THREADED:
            return fn(*args)
        self._job = _pool.submit(fn, *args)
        data = await asyncio.wrap_future(self._job)
        self._job = None
        return data

    def _frame(self, data: bytes) -> bytes:
        if self.events is None or not data:
            return data
        return _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})


def _event(payload: Mapping[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

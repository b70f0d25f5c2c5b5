"""One request to speak, whatever front it came from, and the parsing of MQTT payloads into it.

A request's text is either known up front (``say``) or arrives piece by piece
(``say/stream``, an LLM typing): ``TextStream`` turns pieces into complete sentences as soon
as each one ends, so synthesis can start before the rest has arrived.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tts import SynthesisOptions, VoiceError

from .metrics import Timeline
from .topics import TopicError, check_request_id

Mode = Literal["queue", "interrupt"]
SINKS = ("speaker", "mqtt")


class RequestError(ValueError):
    """A request that cannot be served, with the message to send back (and its id if known)."""

    def __init__(self, message: str, id: str | None = None) -> None:
        super().__init__(message)
        self.id = id


def new_id() -> str:
    """Short and unique enough to tell a day of requests apart in logs and topics."""
    return secrets.token_hex(4)


# --------------------------------------------------------------------------- text streams

# A sentence ends at . ! ? (or a run of them, optionally closed by a quote or bracket)
# followed by white space. The white space must have arrived: a piece ending in "3." may
# continue as "3.5".
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*\s+")


class TextStream:
    """Pieces of text in, complete sentences out (an async iterator), in order."""

    def __init__(self) -> None:
        self._pending = ""
        self._sentences: asyncio.Queue[str | None] = asyncio.Queue()
        self._error: Exception | None = None
        self.closed = False
        self.total_chars = 0

    def feed(self, piece: str, final: bool = False) -> None:
        if self.closed:
            raise RequestError("this stream has already ended")
        self.total_chars += len(piece)
        self._pending += piece
        while m := _SENTENCE_END.search(self._pending):
            self._emit(self._pending[: m.end()])
            self._pending = self._pending[m.end():]
        if final:
            self._emit(self._pending)
            self._pending = ""
            self.closed = True
            self._sentences.put_nowait(None)

    def fail(self, error: Exception) -> None:
        """End the stream with an error; whoever is reading gets it after the sentences so far."""
        if not self.closed:
            self.closed = True
            self._error = error
            self._sentences.put_nowait(None)

    def _emit(self, text: str) -> None:
        if text.strip():
            self._sentences.put_nowait(text.strip())

    async def sentences(self) -> AsyncIterator[str]:
        while (sentence := await self._sentences.get()) is not None:
            yield sentence
        if self._error is not None:
            raise self._error


# --------------------------------------------------------------------------- the request


@dataclass(eq=False)
class Request:
    text: str  # the whole text; for a stream, what has arrived so far is in `stream`
    id: str = field(default_factory=new_id)
    voice: str | None = None  # resolved voice name (None: the engine's default)
    speaker: str | int | None = None
    rate: float | None = None  # length scale: > 1 slower
    volume: float = 1.0  # 0..1, applied to this request's samples
    mode: Mode = "queue"
    priority: int = 0  # higher first
    sinks: tuple[str, ...] = ("speaker",)
    ts: float | None = None  # sender's wall clock (Unix seconds) when it asked
    front: str = "mqtt"
    timeline: Timeline = field(default_factory=Timeline)
    seed: int | None = None
    noise_scale: float | None = None
    noise_w: float | None = None
    stream: TextStream | None = None

    def options(self, base: SynthesisOptions) -> SynthesisOptions:
        """This request's synthesis options on top of the configured defaults."""
        return SynthesisOptions(
            length_scale=self.rate if self.rate is not None else base.length_scale,
            noise_scale=self.noise_scale if self.noise_scale is not None else base.noise_scale,
            noise_w=self.noise_w if self.noise_w is not None else base.noise_w,
            speaker=self.speaker if self.speaker is not None else base.speaker,
            gain=base.gain * self.volume,
            seed=self.seed,
            sentence_silence=base.sentence_silence,
        )

    async def segments(self) -> AsyncIterator[str]:
        """The text in the pieces synthesis should run on: all of it, or sentence by sentence."""
        if self.stream is None:
            yield self.text
            return
        async for sentence in self.stream.sentences():
            yield sentence


# --------------------------------------------------------------------------- MQTT payloads


class _Fields(BaseModel):
    """The JSON fields of `say` (and of the first `say/stream` piece)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str
    id: str | None = None
    voice: str | None = None
    speaker: str | int | None = None
    rate: float | None = Field(None, gt=0, le=10)
    volume: float | None = Field(None, ge=0, le=1)
    mode: Mode = "queue"
    priority: int = Field(0, ge=-1000, le=1000)
    sinks: list[str] | None = None
    ts: float | None = None
    seed: int | None = None
    noise_scale: float | None = Field(None, ge=0, le=2)
    noise_w: float | None = Field(None, ge=0, le=2)

    @field_validator("sinks")
    @classmethod
    def _sinks(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            bad = [s for s in v if s not in SINKS]
            if bad or not v:
                raise ValueError(f"sinks must be a non-empty list of {', '.join(SINKS)}")
        return v


class _StreamFields(_Fields):
    id: str  # required: it ties the pieces together
    seq: int | None = Field(None, ge=0)
    final: bool = False


@dataclass(frozen=True)
class Limits:
    """What the front allows, and how it resolves names (checked before anything queues)."""

    max_text: int
    default_sinks: tuple[str, ...]
    resolve_voice: Callable[[str | None], str]  # name or None -> installed name (UnknownVoice)
    max_age: float | None = None


def decode_text(payload: bytes) -> str:
    """Strict UTF-8 with no control characters other than tab and line breaks."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"payload is not valid UTF-8 (byte {e.start}); send UTF-8 text "
                           "or JSON") from None
    if any(ord(c) < 32 and c not in "\t\r\n" for c in text) or "\x7f" in text:
        raise RequestError("payload contains binary data (control characters); send UTF-8 "
                           "text or JSON")
    return text


def _json_object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise RequestError(f"malformed JSON: {e}") from None
    if not isinstance(data, dict):
        raise RequestError("JSON payload must be an object like {\"text\": \"...\"}")
    return data


def _validation_message(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field missing"
    return f"{where}: {msg}" if where else msg


def _check_text(text: str, limits: Limits, id: str | None) -> str:
    if not text.strip():
        raise RequestError("empty text: nothing to say", id)
    if len(text) > limits.max_text:
        raise RequestError(f"text is {len(text)} characters; the limit is {limits.max_text} "
                           "(mqtt.max_text): split it into several requests", id)
    return text


def _build(f: _Fields, limits: Limits, front: str, timeline: Timeline | None,
           stream: TextStream | None = None) -> Request:
    rid = f.id
    if rid is not None:
        try:
            check_request_id(rid)
        except TopicError as e:
            raise RequestError(str(e)) from None
    if limits.max_age is not None and f.ts is not None:
        age = time.time() - f.ts
        if age > limits.max_age:
            raise RequestError(f"request is {age:.0f} s old (ts), older than mqtt.max_age "
                               f"{limits.max_age:g} s: not spoken late", rid)
    try:
        voice = limits.resolve_voice(f.voice)
    except VoiceError as e:
        raise RequestError(str(e), rid) from None
    req = Request(text=f.text, voice=voice, speaker=f.speaker, rate=f.rate,
                  volume=1.0 if f.volume is None else f.volume, mode=f.mode,
                  priority=f.priority,
                  sinks=tuple(dict.fromkeys(f.sinks)) if f.sinks else limits.default_sinks,
                  ts=f.ts, front=front, timeline=timeline or Timeline(), seed=f.seed,
                  noise_scale=f.noise_scale, noise_w=f.noise_w, stream=stream)
    if rid is not None:
        req.id = rid
    return req


def parse_say(payload: bytes, limits: Limits, front: str = "mqtt",
              timeline: Timeline | None = None) -> Request:
    """A `say` payload: plain UTF-8 text, or a JSON object with at least ``text``."""
    text = decode_text(payload)
    if not text.lstrip().startswith("{"):
        _check_text(text, limits, None)
        return _build(_Fields(text=text), limits, front, timeline)
    data = _json_object(text)
    rid = data.get("id") if isinstance(data.get("id"), str) else None
    try:
        f = _Fields.model_validate(data)
    except ValidationError as e:
        raise RequestError(_validation_message(e), rid) from None
    _check_text(f.text, limits, rid)
    return _build(f, limits, front, timeline)


@dataclass(frozen=True)
class StreamPiece:
    id: str
    seq: int | None
    text: str
    final: bool
    fields: _StreamFields


def parse_stream_piece(payload: bytes) -> StreamPiece:
    """One `say/stream` piece: JSON ``{id, seq, text, final}`` (+ request fields on the first)."""
    data = _json_object(decode_text(payload))
    rid = data.get("id") if isinstance(data.get("id"), str) else None
    try:
        f = _StreamFields.model_validate(data)
    except ValidationError as e:
        raise RequestError(_validation_message(e), rid) from None
    try:
        check_request_id(f.id)
    except TopicError as e:
        raise RequestError(str(e)) from None
    return StreamPiece(f.id, f.seq, f.text, f.final, f)


def stream_request(piece: StreamPiece, limits: Limits, front: str = "mqtt",
                   timeline: Timeline | None = None) -> Request:
    """The request a stream's first piece opens; its text arrives through ``req.stream``."""
    req = _build(piece.fields, limits, front, timeline, stream=TextStream())
    req.text = ""  # grows as pieces arrive (the front feeds the stream in order)
    return req

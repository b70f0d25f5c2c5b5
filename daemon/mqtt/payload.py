"""MQTT payloads read into requests: ``say`` (plain text or a JSON object) and ``say/stream``
pieces. The MQTT front and the fleet (which carries ``say`` to another node) both read them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import field_validator

from tts.errors import VoiceError

from ..errors import RequestError, failure
from ..jobs.fields import (
    CONTROL,
    Fields,
    boolean,
    check_ssml,
    check_text,
    json_object,
    number,
    refuse_control,
    string,
)
from ..jobs.metrics import Timeline
from ..jobs.request import Request, TextStream
from .topics import TopicError, check_request_id


class _StreamFields(Fields):
    """A ``say/stream`` piece: the request's fields (read from the first piece) and what
    only a stream has, its pieces' order and end."""

    id: str  # required: it ties the pieces together
    seq: int | None = None
    final: bool = False

    @field_validator("id", mode="before")
    @classmethod
    def _stream_id(cls, v: object) -> str:
        if v is None:
            raise RequestError("missing 'id': it ties a stream's pieces together")
        return string(v, "id")

    @field_validator("seq", mode="before")
    @classmethod
    def _seq(cls, v: object) -> int | None:
        return None if v is None else int(number(v, "seq", 0, None, integer=True))

    @field_validator("final", mode="before")
    @classmethod
    def _final(cls, v: object) -> bool:
        return boolean(v, "final")


@dataclass(frozen=True)
class Limits:
    """What the front allows, and how it resolves names (checked before anything queues)."""

    max_text: int
    default_sinks: tuple[str, ...]
    resolve_voice: Callable[[str | None], str]  # name or None -> installed name (UnknownVoice)
    check_speaker: Callable[[str, str | int | None], None]  # installed voice, speaker (VoiceError)
    max_age: float | None = None


def decode_text(payload: bytes) -> str:
    """Strict UTF-8 with no control characters other than tab and line breaks."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"payload is not valid UTF-8 (byte {e.start}); send UTF-8 text "
                           "or JSON", code="bad-text") from None
    if CONTROL.search(text):
        raise RequestError("payload contains binary data (control characters); send UTF-8 "
                           "text or JSON", code="bad-text")
    return text


def _build(f: Fields, limits: Limits, front: str, timeline: Timeline | None,
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
                               f"{limits.max_age:g} s: not spoken late", rid, "too-old")
    try:
        voice = limits.resolve_voice(f.voice)
        limits.check_speaker(voice, f.speaker)
    except VoiceError as e:
        raise failure(e, rid) from None
    except RequestError as e:  # the voices are elsewhere, and unreachable (a satellite's)
        raise RequestError(str(e), rid, e.code) from None
    if f.format == "ssml" and stream is None:
        check_ssml(f.text, rid)
    req = Request(text=f.text, voice=voice, speaker=f.speaker, rate=f.rate,
                  volume=1.0 if f.volume is None else f.volume, mode=f.mode,
                  priority=f.priority,
                  sinks=tuple(dict.fromkeys(f.sinks)) if f.sinks else limits.default_sinks,
                  ts=f.ts, front=front, timeline=timeline or Timeline(), seed=f.seed,
                  noise_scale=f.noise_scale, noise_w=f.noise_w, stream=stream,
                  text_format=f.format)
    if rid is not None:
        req.id = rid
    return req


def parse_say(payload: bytes, limits: Limits, front: str = "mqtt",
              timeline: Timeline | None = None) -> Request:
    """A `say` payload: plain UTF-8 text, or a JSON object with at least ``text``."""
    text = decode_text(payload)
    if not text.lstrip().startswith("{"):
        check_text(text, limits.max_text, "mqtt.max_text")
        return _build(Fields(text=text), limits, front, timeline)
    data = json_object(text)
    rid = data.get("id") if isinstance(data.get("id"), str) else None
    f = Fields.read(data, rid)
    check_text(f.text, limits.max_text, "mqtt.max_text", rid)
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
    data = json_object(decode_text(payload))
    rid = data.get("id") if isinstance(data.get("id"), str) else None
    f = _StreamFields.read(data, rid)
    try:
        check_request_id(f.id)
    except TopicError as e:
        raise RequestError(str(e)) from None
    return StreamPiece(f.id, f.seq, refuse_control(f.text, f.id), f.final, f)


def stream_request(piece: StreamPiece, limits: Limits, front: str = "mqtt",
                   timeline: Timeline | None = None) -> Request:
    """The request a stream's first piece opens; its text arrives through ``req.stream``."""
    stream = TextStream()
    req = _build(piece.fields, limits, front, timeline, stream=stream)
    req.text = ""  # grows as pieces arrive (the front feeds the stream in order)
    return req

"""One request to speak, whatever front it came from, and the parsing of MQTT payloads into it.

A request's text is either known up front (``say``) or arrives piece by piece
(``say/stream``, an LLM typing): ``TextStream`` turns pieces into complete sentences as soon
as each one ends, so synthesis can start before the rest has arrived. Either way the text is
plain text with bracket tags or, with ``format: "ssml"``, SSML (``Request.text_format``).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tts import AudioChunk, SynthesisOptions, VoiceError
from tts.text import (
    DEFAULT_MAX_CHARS,
    MarkupError,
    Sentence,
    SentenceBuffer,
    TagParser,
    TextFormat,
    parse_ssml,
)

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


@dataclass(frozen=True)
class Passage:
    """Text for one ``engine.stream`` call: whole sentences of a request.

    A streamed text is spoken passage by passage, and the engine adds no pause after the
    last sentence of a call, so the caller says ``pause_after`` between passages (only when
    another passage follows): the same pauses as the text spoken whole.
    """

    text: str
    paragraph_end: bool = False  # its last sentence ends a paragraph (a blank line follows)
    terminated: bool = True  # its last sentence ends with sentence punctuation

    def pause_after(self, sentence_silence: float, paragraph_silence: float) -> float:
        if self.paragraph_end:
            return paragraph_silence
        return sentence_silence if self.terminated else 0.0

    @staticmethod
    def join(passages: list[Passage]) -> Passage:
        """Several passages as one call, keeping where sentences and paragraphs end (the
        engine splits the joined text into the same sentences again)."""
        parts = []
        for p in passages[:-1]:
            parts += [p.text, "\n\n" if p.paragraph_end else " " if p.terminated else "\n"]
        last = passages[-1]
        return Passage("".join(parts) + last.text, last.paragraph_end, last.terminated)


def pause_chunk(seconds: float, rate: int) -> AudioChunk:
    """Silence between passages, as the engine makes it between sentences: zero samples."""
    return AudioChunk(np.zeros(max(0, round(seconds * rate)), np.float32), 0, False)


class TextStream:
    """Pieces of text in, passages to synthesize out (an async iterator), in order.

    Sentences are found by ``tts.text.SentenceBuffer``, the splitter the engine uses on a
    whole text, so a streamed text is spoken in the same sentences as the same text sent in
    one piece ("Dr. Smith" stays together, "3." waits to see whether "5" follows). Each
    sentence is released as soon as what follows proves it complete.

    Bracket tags work inside any sentence; the ones that last (``[rate 0.8]``, ``[voice
    NAME]``, ``【慢速】``) also carry over to the sentences after them, as in a whole text:
    every passage starts with the tags in force where it begins. SSML can only be parsed
    whole, so an SSML stream is one passage, released when the stream ends.
    """

    def __init__(self, text_format: TextFormat = "text",
                 max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.text_format = text_format
        self.closed = False
        self.total_chars = 0
        self._buffer = SentenceBuffer(max_chars)
        self._tags = TagParser()  # the rate and voice in force after the sentences so far
        self._ssml: list[str] = []
        self._ready: deque[tuple[str, Passage]] = deque()  # (tags in force, sentence)
        self._wake = asyncio.Event()
        self._error: Exception | None = None

    def feed(self, piece: str, final: bool = False) -> None:
        if self.closed:
            raise RequestError("this stream has already ended")
        self.total_chars += len(piece)
        if self.text_format == "ssml":
            self._ssml.append(piece)
            if final and "".join(self._ssml).strip():
                self._ready.append(("", Passage("".join(self._ssml))))
        else:
            for sentence in self._buffer.feed(piece) + (self._buffer.flush() if final else []):
                self._add(sentence)
        if final:
            self.closed = True
        self._wake.set()

    def fail(self, error: Exception) -> None:
        """End the stream with an error; whoever is reading gets it after the sentences so far."""
        if not self.closed:
            self.closed = True
            self._error = error
            self._wake.set()

    def _add(self, sentence: Sentence) -> None:
        tags = "".join(filter(None, (
            f"[voice {self._tags.voice}]" if self._tags.voice else "",
            f"[rate {self._tags.rate:g}]" if self._tags.rate != 1.0 else "")))
        self._tags.parse(sentence.text)  # only to follow [rate] and [voice]; the engine warns
        self._ready.append((tags, Passage(sentence.text, sentence.paragraph_end,
                                          sentence.terminated)))

    async def _take(self) -> list[tuple[str, Passage]] | None:
        """Everything released so far (waiting for something); None at the end."""
        while not self._ready:
            if self.closed:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                return None
            self._wake.clear()
            await self._wake.wait()
        taken = list(self._ready)
        self._ready.clear()
        return taken

    async def passages(self, join: bool = False) -> AsyncIterator[Passage]:
        """Sentence by sentence; with ``join``, all sentences complete at the time in one
        passage (fewer engine calls when the text arrives faster than it is spoken)."""
        while (taken := await self._take()) is not None:
            groups = [taken] if join else [[item] for item in taken]
            for group in groups:
                tags = group[0][0]
                joined = Passage.join([p for _, p in group])
                yield replace(joined, text=f"{tags} {joined.text}" if tags else joined.text)

    async def sentences(self) -> AsyncIterator[str]:
        """The sentences' texts as they complete (no tags carried over)."""
        while (taken := await self._take()) is not None:
            for _, passage in taken:
                yield passage.text


# --------------------------------------------------------------------------- the request


@dataclass(eq=False)
class Request:
    """What to say (or, with ``audio``, what to play), how, where to, and when it arrived."""

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
    text_format: TextFormat = "text"  # "ssml": the text (or the streamed text) is SSML
    # Audio to play as it is instead of text to synthesize (Hermes playBytes): s16le mono PCM
    # at ``audio_rate``. It waits its turn in the speaker queue like any utterance.
    audio: bytes | None = None
    audio_rate: int = 0

    def options(self, base: SynthesisOptions) -> SynthesisOptions:
        """This request's synthesis options on top of the configured defaults (only the
        fields a request can set are replaced; the rest, pauses included, stay configured)."""
        return replace(
            base,
            length_scale=self.rate if self.rate is not None else base.length_scale,
            noise_scale=self.noise_scale if self.noise_scale is not None else base.noise_scale,
            noise_w=self.noise_w if self.noise_w is not None else base.noise_w,
            speaker=self.speaker if self.speaker is not None else base.speaker,
            gain=base.gain * self.volume,
            seed=self.seed,
        )

    async def passages(self) -> AsyncIterator[Passage]:
        """The text in the pieces synthesis should run on: all of it, or sentence by sentence.

        One engine call per streamed sentence, not several joined, so that the audio of a
        sentence never depends on how fast the text arrived (a fixed ``seed`` gives the same
        samples every time)."""
        if self.stream is None:
            yield Passage(self.text)
            return
        async for passage in self.stream.passages():
            yield passage


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
    format: TextFormat = "text"

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


def check_ssml(text: str, request_id: str | None = None) -> None:
    """Refuse malformed SSML before anything is queued (the engine would refuse it too, but
    only once the request's turn came, after ``queued`` and ``started``)."""
    try:
        parse_ssml(text)
    except MarkupError as e:
        raise RequestError(str(e), request_id) from None


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
    stream = TextStream(piece.fields.format)
    req = _build(piece.fields, limits, front, timeline, stream=stream)
    req.text = ""  # grows as pieces arrive (the front feeds the stream in order)
    return req

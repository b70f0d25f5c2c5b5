"""One request to speak, whatever front it came from, and the parsing of MQTT payloads into it.

A request's text is either known up front (``say``) or arrives piece by piece
(``say/stream``, an LLM typing) through a ``TextStream``, whose sentences the engine's
planner releases as soon as each one ends, so synthesis can start before the rest has
arrived. Either way the text is plain text with bracket tags or, with ``format: "ssml"``,
SSML (``Request.text_format``).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tts.errors import VoiceError
from tts.text import MarkupError, TextFormat, parse_ssml
from tts.text.markup import MAX_RATE, MIN_RATE

from ..errors import EmptyText, RequestError, TextTooLong, failure
from ..mqtt.topics import TopicError, check_request_id
from .metrics import Timeline

if TYPE_CHECKING:
    from tts.compose import Planner, Step
    from tts.options import SynthesisOptions

    from ..sinks.client import ClientSink
    from ..synthesis.contracts import AudioSource

Mode = Literal["queue", "interrupt"]
SINKS = ("speaker", "mqtt")
# A request's ``rate`` (a length scale, > 1 slower), the same on every front: the bounds of
# markup's speed factors, which are symmetric around 1, so they bound either reading.
RATE_RANGE = (MIN_RATE, MAX_RATE)
# A request's ``seed``, the same range on every front. torch's generator takes any 64-bit
# value; a bigger one would fail only when synthesis starts, after ``queued`` and ``started``.
SEED_RANGE = (0, 2**63 - 1)
def new_id() -> str:
    """Short and unique enough to tell a day of requests apart in logs and topics."""
    return secrets.token_hex(4)


# --------------------------------------------------------------------------- text streams


class TextStream:
    """Text arriving in pieces (``say/stream``, Wyoming's ``synthesize-chunk``: an LLM
    typing), handed in order from the front that receives it to whoever speaks it.

    Only a pipe: ``steps`` gives the text to the engine's planner (``tts.compose.Planner``),
    the one a whole text goes through, so a streamed text is spoken in the same sentences,
    with the same tags carried over and the same pauses, as the same text sent in one piece;
    and each sentence as soon as what follows proves it complete.
    """

    def __init__(self) -> None:
        self.closed = False
        self.total_chars = 0
        self._pieces: list[str] = []
        self._wake = asyncio.Event()
        self._error: Exception | None = None

    def feed(self, piece: str, final: bool = False) -> None:
        if self.closed:
            raise RequestError("this stream has already ended")
        self.total_chars += len(piece)
        self._pieces.append(piece)
        if final:
            self.closed = True
        self._wake.set()

    def fail(self, error: Exception) -> None:
        """End the stream with an error; whoever is reading gets it after the sentences so far."""
        if not self.closed:
            self.closed = True
            self._error = error
            self._wake.set()

    async def _take(self) -> str | None:
        """The text that arrived since the last call (waiting for some); None at the end."""
        while not self._pieces:
            if self.closed:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                return None
            self._wake.clear()
            await self._wake.wait()
        text = "".join(self._pieces)
        self._pieces.clear()
        return text

    async def pieces(self) -> AsyncGenerator[str, None]:
        """The text as it arrives, unplanned (for a worker elsewhere to plan); raises the
        stream's error at its end."""
        while (text := await self._take()) is not None:
            yield text

    async def steps(self, planner: Planner) -> AsyncGenerator[list[Step], None]:
        """The planned text, one sentence's steps at a time as each one completes, so its
        audio never depends on how the text was cut or how fast it came (a fixed seed starts
        afresh on each sentence). SSML can only be parsed whole: it comes at the end, as one
        batch, like an SSML text sent whole."""
        while (text := await self._take()) is not None:
            for batch in _by_sentence(planner.feed(text)):
                yield batch
        rest = planner.finish()
        for batch in ([rest] if planner.fmt == "ssml" and rest else _by_sentence(rest)):
            yield batch


def _by_sentence(steps: list[Step]) -> list[list[Step]]:
    batches: list[list[Step]] = []
    for step in steps:
        if batches and batches[-1][-1].sentence == step.sentence:
            batches[-1].append(step)
        else:
            batches.append([step])
    return batches


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
    # Wall clock (Unix seconds) at which its first sample is to come out of the speaker, a
    # little in the future: several speakers start one announcement together. None: as
    # soon as possible. Set by herald itself, never from a front's payload.
    play_at: float | None = None
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
    # The client connection that waits for the audio (an HTTP response, a Wyoming client):
    # a sink of this job alone, next to the named ``sinks``.
    client: ClientSink | None = None
    # Audio made elsewhere to play instead of synthesizing ``text`` here
    # (``daemon.synthesis.contracts.AudioSource``: a fleet worker's).
    source: AudioSource | None = None
    # The defaults this request is synthesized on instead of the configured [synthesis]
    # ones: a fleet job carries its owner's gain and sentence pause (daemon.fleet.worker).
    defaults: SynthesisOptions | None = None

    @property
    def whole(self) -> bool:
        """Nobody plays the audio before it is all made: its one consumer is a client that
        takes it whole (an HTTP WAV, a batch item), with no speaker or MQTT stream beside."""
        return not self.sinks and self.client is not None and self.client.whole

    def options(self, base: SynthesisOptions) -> SynthesisOptions:
        """This request's synthesis options on top of the configured defaults (only the
        fields a request can set are replaced; the rest, pauses included, stay configured)."""
        base = self.defaults or base
        return replace(
            base,
            length_scale=self.rate if self.rate is not None else base.length_scale,
            noise_scale=self.noise_scale if self.noise_scale is not None else base.noise_scale,
            noise_w=self.noise_w if self.noise_w is not None else base.noise_w,
            speaker=self.speaker if self.speaker is not None else base.speaker,
            gain=base.gain * self.volume,
            seed=self.seed,
        )


# --------------------------------------------------------------------------- MQTT payloads


class _Fields(BaseModel):
    """The JSON fields of `say` (and of the first `say/stream` piece)."""

    # NaN and infinity are valid JSON to Python's parser; no field here means anything by them
    # (a NaN ts would even pass the max_age check).
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    text: str
    id: str | None = None
    voice: str | None = None
    speaker: str | int | None = None
    rate: float | None = Field(None, ge=RATE_RANGE[0], le=RATE_RANGE[1])
    volume: float | None = Field(None, ge=0, le=1)
    mode: Mode = "queue"
    priority: int = Field(0, ge=-1000, le=1000)
    sinks: list[str] | None = None
    ts: float | None = None
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    noise_scale: float | None = Field(None, ge=0, le=2)
    noise_w: float | None = Field(None, ge=0, le=2)
    format: TextFormat = "text"

    @field_validator("speaker", mode="before")
    @classmethod
    def _speaker(cls, v: object) -> object:
        """One message for the union (pydantic would report "speaker.str: Input should be a
        valid string" for 1.5); true/false are not speaker numbers."""
        if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int))):
            shown = json.dumps(v) if isinstance(v, (bool, float)) else f"a {type(v).__name__}"
            raise ValueError(f"must be a speaker name or a whole number (its index), not {shown}")
        return v

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
    check_speaker: Callable[[str, str | int | None], None]  # installed voice, speaker (VoiceError)
    max_age: float | None = None


# C0 controls but tab and line breaks, and DEL: in a text field they are binary junk or a
# broken client, never something to pronounce.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def decode_text(payload: bytes) -> str:
    """Strict UTF-8 with no control characters other than tab and line breaks."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"payload is not valid UTF-8 (byte {e.start}); send UTF-8 text "
                           "or JSON", code="bad-text") from None
    if _CONTROL.search(text):
        raise RequestError("payload contains binary data (control characters); send UTF-8 "
                           "text or JSON", code="bad-text")
    return text


def parse_json(text: str) -> Any:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise RequestError(f"malformed JSON: {e}") from None
    except RecursionError:  # [[[[...: Python's parser recurses once per level
        raise RequestError("malformed JSON: nested too deeply; send a flat object like "
                           '{"text": "..."}') from None
    if _SURROGATE_ESCAPE.search(text):
        check_unicode(json.dumps(data, ensure_ascii=False), "JSON")
    return data


# A \uD800-\uDFFF escape: JSON may pair two into one character, or leave one unpaired.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def check_unicode(text: str, what: str = "text") -> str:
    """Refuse an unpaired UTF-16 surrogate (JSON can carry one as ``"\\ud800"``): it is no
    character, and espeak-ng, which takes UTF-8, would fail on it mid-synthesis."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"{what} holds an unpaired UTF-16 surrogate "
                           f"(U+{ord(text[e.start]):04X}); send valid Unicode") from None
    return text


def json_object(text: str, example: str = '{"text": "..."}') -> dict[str, Any]:
    data = parse_json(text)
    if not isinstance(data, dict):
        raise RequestError(f"JSON payload must be an object like {example}")
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


def refuse_control(text: str, id: str | None = None, *, field: str = "text",
                   where: str = "") -> str:
    """Refuse control characters in a text or a streamed piece of one."""
    control = _CONTROL.search(text)
    if control:
        raise RequestError(f"{where}{field} holds a control character "
                           f"(U+{ord(control.group()):04X} at {control.start()}); send plain "
                           "text", id, "bad-text")
    return text


def check_text(text: str, max_text: int, setting: str, id: str | None = None, *,
               field: str = "text", where: str = "",
               hint: str = "split it into several requests") -> str:
    """The one verdict on a text, whatever front it came from: refuse control characters,
    text with nothing to say in it, or more than ``max_text`` characters (``setting`` names
    the limit's key, so the message says what could be changed). Each front answers in its
    own protocol (HTTP: 400 and 413; MQTT: an error event; Wyoming: an error)."""
    refuse_control(text, id, field=field, where=where)
    if not text.strip():
        raise EmptyText(f"{where}empty {field}: nothing to say", id)
    if len(text) > max_text:
        raise TextTooLong(f"{where}{field} is {len(text)} characters; the limit is {max_text} "
                          f"({setting}): {hint}", id)
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


def check_ssml(text: str, request_id: str | None = None) -> None:
    """Refuse malformed SSML before anything is queued (the engine would refuse it too, but
    only once the request's turn came, after ``queued`` and ``started``)."""
    try:
        parse_ssml(text)
    except MarkupError as e:
        raise RequestError(str(e), request_id, "bad-markup") from None


def parse_say(payload: bytes, limits: Limits, front: str = "mqtt",
              timeline: Timeline | None = None) -> Request:
    """A `say` payload: plain UTF-8 text, or a JSON object with at least ``text``."""
    text = decode_text(payload)
    if not text.lstrip().startswith("{"):
        check_text(text, limits.max_text, "mqtt.max_text")
        return _build(_Fields(text=text), limits, front, timeline)
    data = json_object(text)
    rid = data.get("id") if isinstance(data.get("id"), str) else None
    try:
        f = _Fields.model_validate(data)
    except ValidationError as e:
        raise RequestError(_validation_message(e), rid) from None
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
    try:
        f = _StreamFields.model_validate(data)
    except ValidationError as e:
        raise RequestError(_validation_message(e), rid) from None
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

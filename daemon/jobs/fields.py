"""What a request's fields mean, the same on every front: one pydantic model of them, and the
checks of a text to speak. Each front reads its own wire form (an MQTT payload, an HTTP body,
a Hermes message, a Wyoming event, a fleet job) into these, so a field is accepted or refused
with the same words wherever it came from."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tts.text import MarkupError, TextFormat, parse_ssml
from tts.text.markup import MAX_RATE, MIN_RATE

from ..errors import EmptyText, RequestError, TextTooLong
from .request import SINKS, Mode

# A request's ``rate`` (a length scale, > 1 slower), the same on every front: the bounds of
# markup's speed factors, which are symmetric around 1, so they bound either reading.
RATE_RANGE = (MIN_RATE, MAX_RATE)
# A request's ``seed``, the same range on every front. torch's generator takes any 64-bit
# value; a bigger one would fail only when synthesis starts, after ``queued`` and ``started``.
SEED_RANGE = (0, 2**63 - 1)


class Fields(BaseModel):
    """A request's fields, as every front reads them."""

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


# C0 controls but tab and line breaks, and DEL: in a text field they are binary junk or a
# broken client, never something to pronounce.
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


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


def validation_message(e: ValidationError) -> str:
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
    control = CONTROL.search(text)
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


def check_ssml(text: str, request_id: str | None = None) -> None:
    """Refuse malformed SSML before anything is queued (the engine would refuse it too, but
    only once the request's turn came, after ``queued`` and ``started``)."""
    try:
        parse_ssml(text)
    except MarkupError as e:
        raise RequestError(str(e), request_id, "bad-markup") from None

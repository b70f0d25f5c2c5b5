"""What a request's fields mean, the same on every front: one pydantic model of them, and the
checks of a text to speak. Each front reads its own wire form (an MQTT payload, an HTTP body,
a Hermes message, a Wyoming event, a fleet job) into these, so a field is accepted or refused
with the same words wherever it came from."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

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
# A request's ``noise_scale`` and ``noise_w``, ``volume`` (a gain of 0..1) and ``priority``.
NOISE_RANGE = (0, 2)
VOLUME_RANGE = (0, 1)
PRIORITY_RANGE = (-1000, 1000)


MODES: tuple[Mode, ...] = ("queue", "interrupt")
TEXT_FORMATS: tuple[TextFormat, ...] = ("text", "ssml")
# Each number field's range and whether it is whole.
_NUMBERS: dict[str, tuple[float | None, float | None, bool]] = {
    "rate": (*RATE_RANGE, False), "volume": (*VOLUME_RANGE, False),
    "noise_scale": (*NOISE_RANGE, False), "noise_w": (*NOISE_RANGE, False),
    "ts": (None, None, False), "seed": (*SEED_RANGE, True),
    "priority": (*PRIORITY_RANGE, True),
}

# A field's value given as text (an HTTP form or query string): the words that mean true/false.
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
# Why a required field is needed, said when it is missing.
_NEEDED = {"text": "the text to speak", "id": "it ties a stream's pieces together"}


def kind_of(value: object) -> str:
    """A value's JSON kind, as a refusal names what was sent instead."""
    return {dict: "an object", list: "a list", bool: "true/false", type(None): "null",
            int: "a number", float: "a number", str: "a string"}.get(type(value), "that")


def shown(value: object, limit: int = 60) -> str:
    """A value as a refusal quotes it: a 5000-digit ``seed`` is not echoed whole."""
    text = json.dumps(value) if isinstance(value, bool) or value is None else repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def absent(value: object, strings: bool) -> bool:
    """No value: null, or an empty string where the value came as text (``strings``: a form
    sends an empty input as "")."""
    return value is None or (strings and value == "")


def string(value: object, name: str) -> str:
    """A text field's value (``name``: the field as the client named it)."""
    if not isinstance(value, str):
        raise RequestError(f"{name!r} must be a string, not {kind_of(value)}")
    return value


def number(value: object, name: str, lo: float | None, hi: float | None,
           integer: bool = False, strings: bool = False) -> float:
    """A number within [lo, hi] (either bound None: open), refused in one wording on every
    front. A whole float (2.0) is a whole number; true/false are no numbers, nor are NaN and
    infinity, which Python's JSON parser takes (a NaN ``ts`` would pass the max_age check);
    a string is one only where the value came as text (``strings``)."""
    kind = "a whole number" if integer else "a number"
    bounds = (f" from {lo} to {hi}" if lo is not None and hi is not None
              else f" of {lo} or more" if lo is not None else "")
    allowed = (f"from {lo} to {hi}" if lo is not None and hi is not None
               else f"{lo} or more" if lo is not None else f"{hi} or less")
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        if isinstance(value, str) and not strings:
            raise ValueError
        if integer and isinstance(value, float) and not value.is_integer():
            raise ValueError  # int(1.5) would quietly be 1
        parsed = int(value) if integer and not isinstance(value, float) else float(value)
        if not math.isfinite(parsed):
            raise ValueError
        result = int(parsed) if integer else parsed
    except (ValueError, OverflowError):  # OverflowError: float(10**400)
        raise RequestError(f"{name!r} must be {kind}{bounds}, not {shown(value)}") from None
    if (lo is not None and result < lo) or (hi is not None and result > hi):
        raise RequestError(f"{name!r} is {shown(result)}; it must be {allowed}")
    return result


def boolean(value: object, name: str, strings: bool = False) -> bool:
    """true or false; as text (``strings``) also yes/no, on/off, 1/0, and "" for false."""
    if isinstance(value, bool):
        return value
    if strings and isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise RequestError(f"{name!r} must be true or false, not {shown(value)}")


def choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    """One of a few words, spelt exactly: "SSML" is refused naming "ssml"."""
    if not isinstance(value, str) or value not in choices:
        raise RequestError(f"{name!r} must be one of {', '.join(choices)}, not {shown(value)}")
    return value


def unknown_field(key: str, known: Iterable[str], where: str = "") -> RequestError:
    """A field nobody reads: refused, since a misspelt ``voise`` would otherwise be spoken in
    the default voice without a word."""
    return RequestError(f"{where}unknown field {shown(key)}; known fields: "
                        f"{', '.join(sorted(known))}")


def _strings(info: ValidationInfo) -> bool:
    """This field's value came as text (``Fields.read``'s ``texts``)."""
    texts = info.context.get("texts", ()) if info.context else ()
    return info.field_name in texts


def _name(info: ValidationInfo) -> str:
    """The field's name as the client sent it (OpenAI's ``input`` is our ``text``)."""
    names = info.context.get("names", {}) if info.context else {}
    field = info.field_name or ""
    return str(names.get(field, field))


def _default(model: type[BaseModel], info: ValidationInfo) -> Any:
    """The field's own default, which a value of null (or "" as text) stands for."""
    return model.model_fields[info.field_name or ""].default


class Fields(BaseModel):
    """A request's fields, as every front reads them: a field means the same, and is refused
    in the same words (``read``), whichever front it came through. A front reads into it
    only the fields its wire form has; what that form alone has (HTTP's ``stream``, Hermes'
    ``siteId``, Wyoming's event structure) stays the front's."""

    # Every field's own validator below checks and converts its value (strictly: a number in
    # a JSON string is no number), so the refusal names the field and what it takes.
    model_config = ConfigDict(extra="forbid", strict=True)

    text: str
    id: str | None = None
    voice: str | None = None
    speaker: str | int | None = None
    rate: float | None = None  # length scale, > 1 slower
    volume: float | None = None
    mode: Mode = "queue"
    priority: int = 0  # higher first
    sinks: list[str] | None = None
    ts: float | None = None  # the sender's wall clock (Unix seconds) when it asked
    seed: int | None = None
    noise_scale: float | None = None
    noise_w: float | None = None
    format: TextFormat = "text"

    @classmethod
    def read(cls, data: Mapping[str, Any], request_id: str | None = None, *, where: str = "",
             texts: Collection[str] = (), names: Mapping[str, str] | None = None) -> Self:
        """``data`` as these fields, or a ``RequestError`` saying which field is wrong and what
        it takes. ``texts``: the fields whose value came as text (a form, a query string), so
        "1.5" is a number there and "" no value; ``names``: a field's name on the front's
        wire."""
        try:
            return cls.model_validate(data, context={"texts": frozenset(texts),
                                                     "names": dict(names or {})})
        except ValidationError as e:
            message = validation_message(e, cls.model_fields, names)
            raise RequestError(where + message, request_id) from None

    @field_validator("text", mode="before")
    @classmethod
    def _text(cls, v: object, info: ValidationInfo) -> str:
        name = _name(info)
        if v is None:
            raise RequestError(f"missing {name!r}: {_NEEDED['text']}")
        return string(v, name)

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, v: object, info: ValidationInfo) -> str | None:
        return None if v is None else string(v, _name(info))

    @field_validator("voice", mode="before")
    @classmethod
    def _voice(cls, v: object, info: ValidationInfo) -> str | None:
        """An empty voice is no voice: the default one speaks, on every front."""
        return None if v is None or v == "" else string(v, _name(info))

    @field_validator("speaker", mode="before")
    @classmethod
    def _speaker(cls, v: object, info: ValidationInfo) -> str | int | None:
        """A speaker's name or its index; true/false and 1.5 are neither."""
        if v is None or v == "":
            return None
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            got = repr(v) if isinstance(v, float) else kind_of(v)  # 1.5, not "a number"
            raise RequestError(f"{_name(info)!r} must be a speaker name or a whole number "
                               f"(its index), not {got}")
        return v

    @field_validator("rate", "volume", "noise_scale", "noise_w", "ts", "seed", "priority",
                     mode="before")
    @classmethod
    def _number(cls, v: object, info: ValidationInfo) -> float | None:
        """null (or "" as text) is the default, for these as for every field."""
        strings = _strings(info)
        if absent(v, strings):
            return _default(cls, info)  # type: ignore[no-any-return]
        lo, hi, integer = _NUMBERS[info.field_name or ""]
        return number(v, _name(info), lo, hi, integer, strings)

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, v: object, info: ValidationInfo) -> str:
        if absent(v, _strings(info)):
            return _default(cls, info)  # type: ignore[no-any-return]
        return choice(v, _name(info), MODES)

    @field_validator("format", mode="before")
    @classmethod
    def _format(cls, v: object, info: ValidationInfo) -> str:
        if absent(v, _strings(info)):
            return _default(cls, info)  # type: ignore[no-any-return]
        return choice(v, _name(info), TEXT_FORMATS)

    @field_validator("sinks", mode="before")
    @classmethod
    def _sinks(cls, v: object, info: ValidationInfo) -> list[str] | None:
        if v is None:
            return None
        if (not isinstance(v, list) or not v
                or not all(isinstance(s, str) and s in SINKS for s in v)):
            raise RequestError(f"{_name(info)!r} must be a non-empty list of "
                               f"{', '.join(SINKS)}, not {shown(v)}")
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


def validation_message(e: ValidationError, known: Iterable[str] = (),
                       names: Mapping[str, str] | None = None) -> str:
    """The first fault pydantic found, in the words every front refuses it with; ``known``:
    the fields the model takes, which a refusal of an unknown one lists."""
    err = e.errors()[0]
    loc = [str(p) for p in err["loc"]]
    names = names or {}
    field = names.get(loc[0], loc[0]) if loc else ""
    if err["type"] == "extra_forbidden":
        return str(unknown_field(field, (names.get(k, k) for k in known)))
    if err["type"] == "missing":
        need = _NEEDED.get(loc[0], "") if loc else ""
        return f"missing {field!r}" + (f": {need}" if need else "")
    msg = err["msg"].removeprefix("Value error, ")
    return msg if err["type"] == "value_error" or not loc else f"{field!r}: {msg}"


def refuse_control(text: str, id: str | None = None, *, field: str = "text",
                   where: str = "") -> str:
    """Refuse control characters in a text or a streamed piece of one."""
    control = CONTROL.search(text)
    if control:
        raise RequestError(f"{where}{field!r} holds a control character "
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
        raise EmptyText(f"{where}empty {field!r}: nothing to say", id)
    if len(text) > max_text:
        raise TextTooLong(f"{where}{field!r} is {len(text)} characters; the limit is {max_text} "
                          f"({setting}): {hint}", id)
    return text


def check_ssml(text: str, request_id: str | None = None) -> None:
    """Refuse malformed SSML before anything is queued (the engine would refuse it too, but
    only once the request's turn came, after ``queued`` and ``started``)."""
    try:
        parse_ssml(text)
    except MarkupError as e:
        raise RequestError(str(e), request_id, "bad-markup") from None

"""Reading an HTTP request: its fields (JSON, form, multipart or plain text), each field
checked with an error that says what to send instead, and the refusal a bad one gets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import hdrs, web

from tts import SynthesisOptions
from tts.codec import CodecName
from tts.text import MarkupError, TextFormat, parse_ssml

from ...errors import HeraldError, RequestError
from ...jobs.fields import json_object

log = logging.getLogger("daemon.fronts.http")


SPEECH_FIELDS = frozenset({"text", "voice", "speaker", "rate", "seed", "stream", "format",
                           "response_format"})
TEXT_FORMATS = ("text", "ssml")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

# Outcome label for refused requests in herald_requests{front="http"}.
_REASONS = {400: "bad_request", 401: "unauthorized", 404: "not_found",
            405: "method_not_allowed", 408: "timeout", 413: "too_large",
            415: "unsupported_media_type", 429: "busy", 503: "unavailable"}
# A request error's code (daemon.errors.Code) as HTTP answers it: the status, and the
# outcome label when it is not the status's own.
STATUS: dict[str, tuple[int, str | None]] = {
    "bad-request": (400, None), "bad-text": (400, None), "empty-text": (400, None),
    "bad-markup": (400, None), "bad-voice": (400, None), "nothing-to-say": (400, None),
    "too-old": (400, None), "text-too-long": (413, None), "timeout": (408, None),
    "unknown-voice": (404, "unknown_voice"), "busy": (429, None),
    "unavailable": (503, None), "synthesis-failed": (500, "error"),
}


class ApiError(HeraldError):
    """A refused request: the status, and a message that tells the client what to do."""

    def __init__(self, status: int, message: str, reason: str | None = None,
                 headers: Mapping[str, str] | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param  # the field at fault, for OpenAI's error shape
        self.reason = reason or _REASONS.get(status, "error")
        self.headers = dict(headers or {})

    @classmethod
    def of(cls, e: RequestError, retry_after: int) -> ApiError:
        """A request error, any front's, as HTTP answers it."""
        status, reason = STATUS.get(e.code, (400, None))
        headers: dict[str, str] | None = (
            {hdrs.RETRY_AFTER: str(retry_after)} if status in (429, 503) else None)
        return cls(status, str(e), reason, headers)


@dataclass(frozen=True)
class Speech:
    """One utterance asked for, checked: the voice is installed and the speaker exists."""

    text: str
    voice: str
    options: SynthesisOptions
    stream: bool = False
    filename: str = ""
    text_format: TextFormat = "text"
    response_format: CodecName = "wav"  # the audio format the answer comes in


async def read_fields(request: web.Request) -> dict[str, Any]:
    """The request's fields from JSON, a form, or a text/plain body (the text itself).

    Query parameters count too, below the body: ``curl --data-binary @file.txt -H
    'Content-Type: text/plain' '.../tts/stream?voice=...'`` works.
    """
    fields: dict[str, Any] = dict(request.query)
    if not request.body_exists:
        return fields
    ctype = request.content_type if hdrs.CONTENT_TYPE in request.headers else ""
    if ctype in ("", "application/json") or ctype.endswith("+json"):
        fields.update(json_object(decode_utf8(await request.read(), "request body")))
    elif ctype == "application/x-www-form-urlencoded":
        text = decode_utf8(await request.read(), "form body")
        try:
            fields.update(parse_qsl(text, keep_blank_values=True, errors="strict"))
        except UnicodeDecodeError:
            raise ApiError(400, "a form field is not valid UTF-8 once %-decoded") from None
    elif ctype == "multipart/form-data":
        fields.update(await read_multipart(request))
    elif ctype == "text/plain":
        fields["text"] = decode_utf8(await request.read(), "request body")
    else:
        raise ApiError(415, f"unsupported Content-Type {ctype!r}: send application/json, "
                       "a form (urlencoded or multipart) or text/plain")
    return fields


def decode_utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"{what} is not valid UTF-8 (bad byte at offset {e.start}): "
                       "send text encoded as UTF-8") from None


async def read_multipart(request: web.Request) -> dict[str, Any]:
    try:
        form = await request.post()
    except (UnicodeDecodeError, LookupError):
        raise ApiError(400, "a form field is not valid UTF-8") from None
    except ValueError as e:
        raise ApiError(400, f"malformed multipart form: {e}") from None
    out: dict[str, Any] = {}
    for key, value in form.items():
        if key in out:
            continue
        if isinstance(value, web.FileField):  # an uploaded text file
            raw = await asyncio.to_thread(value.file.read)
            out[key] = decode_utf8(raw, f"uploaded file {value.filename!r}")
        elif isinstance(value, (bytes, bytearray)):
            out[key] = decode_utf8(bytes(value), f"form field {key!r}")
        else:
            out[key] = value
    return out


def kind_of(value: object) -> str:
    return {dict: "an object", list: "a list", bool: "true/false", type(None): "null",
            int: "a number", float: "a number", str: "a string"}.get(type(value), "that")


def string_field(fields: Mapping[str, Any], key: str, where: str = "") -> str | None:
    value = fields.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{where}{key!r} must be a string, not {kind_of(value)}")
    return value


def shown(value: object, limit: int = 60) -> str:
    """A value as an error message quotes it: a 5000-digit ``seed`` is not echoed whole."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def number_field(fields: Mapping[str, Any], key: str, lo: float, hi: float, where: str = "",
            integer: bool = False) -> float | None:
    value = fields.get(key)
    if value is None or value == "":
        return None
    kind = "a whole number" if integer else "a number"
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        if integer and isinstance(value, float) and not value.is_integer():
            raise ValueError  # int(1.5) would quietly be 1
        number = int(value) if integer else float(value)
    except (ValueError, OverflowError):  # OverflowError: float(10**400)
        raise ApiError(400, f"{where}{key!r} must be {kind} from {lo} to {hi}, "
                       f"not {shown(value)}") from None
    if not lo <= number <= hi:
        raise ApiError(400, f"{where}{key!r} is {shown(number)}; it must be from {lo} to {hi}")
    return number


def bool_field(fields: Mapping[str, Any], key: str, where: str = "") -> bool:
    value = fields.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ApiError(400, f"{where}{key!r} must be true or false, not {shown(value)}")


def format_field(fields: Mapping[str, Any], text: str, where: str = "") -> TextFormat:
    """``format``: "text" (bracket tags work in it) or "ssml", which must parse (400 says
    where it doesn't)."""
    value = (string_field(fields, "format", where) or "text").strip().lower()
    if value == "text":
        return "text"
    if value != "ssml":
        raise ApiError(400, f"{where}'format' must be one of {', '.join(TEXT_FORMATS)}, "
                       f"not {shown(value)}")
    try:
        parse_ssml(text)
    except MarkupError as e:
        raise ApiError(400, f"{where}{e}") from None
    return "ssml"


def speaker_field(fields: Mapping[str, Any], where: str = "") -> str | int | None:
    value = fields.get("speaker")
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        shown = repr(value) if isinstance(value, float) else kind_of(value)  # not "a number"
        raise ApiError(400, f"{where}'speaker' must be a speaker name or a whole number (its "
                       f"index), not {shown}")
    return value

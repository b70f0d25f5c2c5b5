"""Reading an HTTP request: its fields (JSON, form, multipart or plain text), each field
checked with an error that says what to send instead, and the refusal a bad one gets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from aiohttp import hdrs, web

from tts import SynthesisOptions
from tts.codec import CodecName
from tts.text import TextFormat

from ...errors import Code, HeraldError, RequestError
from ...jobs.fields import Fields, absent, boolean, json_object, number, string

log = logging.getLogger("daemon.fronts.http")

T = TypeVar("T")


# The request fields an HTTP speech request takes (``Fields``: the same as on every front),
# and those only HTTP has.
REQUEST_FIELDS = frozenset({"text", "voice", "speaker", "rate", "seed", "format"})
SPEECH_FIELDS = REQUEST_FIELDS | {"stream", "response_format"}

# Outcome label for refused requests in herald_requests{front="http"}.
_REASONS = {400: "bad_request", 401: "unauthorized", 404: "not_found",
            405: "method_not_allowed", 408: "timeout", 413: "too_large",
            415: "unsupported_media_type", 429: "busy", 503: "unavailable"}
# A request error's code as HTTP answers it: the status, and the outcome label when it is not
# the status's own. The one place a code becomes a status: every refusal HTTP sends for a
# request, whichever layer refused it, is a ``RequestError`` answered through ``ApiError.of``.
STATUS: dict[Code, tuple[int, str | None]] = {
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


class HttpFields(dict[str, Any]):
    """An HTTP request's fields, and which of them came as text (the query string, a form):
    only those read "1.5" as a number and "" as no value. A JSON body's are typed, and
    checked as strictly as on every other front."""

    def __init__(self, values: Mapping[str, Any], texts: Iterable[str] = ()) -> None:
        super().__init__(values)
        self.texts = set(texts)

    def given(self, values: Mapping[str, Any], as_text: bool) -> None:
        self.update(values)
        if as_text:
            self.texts |= set(values)
        else:
            self.texts -= set(values)


def texts_of(fields: Mapping[str, Any]) -> frozenset[str]:
    """The fields that came as text: a batch item, a JSON object, has none."""
    return frozenset(fields.texts) if isinstance(fields, HttpFields) else frozenset()


async def read_fields(request: web.Request) -> HttpFields:
    """The request's fields from JSON, a form, or a text/plain body (the text itself).

    Query parameters count too, below the body: ``curl --data-binary @file.txt -H
    'Content-Type: text/plain' '.../tts/stream?voice=...'`` works.
    """
    fields = HttpFields(request.query, texts=request.query)
    if not request.body_exists:
        return fields
    ctype = request.content_type if hdrs.CONTENT_TYPE in request.headers else ""
    if ctype in ("", "application/json") or ctype.endswith("+json"):
        body = json_object(decode_utf8(await request.read(), "request body"))
        fields.given(body, as_text=False)
    elif ctype == "application/x-www-form-urlencoded":
        text = decode_utf8(await request.read(), "form body")
        try:
            fields.given(dict(parse_qsl(text, keep_blank_values=True, errors="strict")),
                         as_text=True)
        except UnicodeDecodeError:
            raise ApiError(400, "a form field is not valid UTF-8 once %-decoded") from None
    elif ctype == "multipart/form-data":
        fields.given(await read_multipart(request), as_text=True)
    elif ctype == "text/plain":
        fields.given({"text": decode_utf8(await request.read(), "request body")}, as_text=True)
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


# HTTP's own fields, which no other front has, read as HTTP always read them: "1.5" is a
# number and "" no value, in a JSON body as in a form.


def string_field(fields: Mapping[str, Any], key: str, where: str = "") -> str | None:
    """One of HTTP's own text fields (``filename``, ``response_format``)."""
    value = fields.get(key)
    if absent(value, strings=True):
        return None
    return http_field(lambda: string(value, key), where)


def number_field(fields: Mapping[str, Any], key: str, lo: float, hi: float,
                 where: str = "") -> float | None:
    """One of HTTP's own number fields (OpenAI's ``speed``), refused in the words a request
    field is."""
    value = fields.get(key)
    if absent(value, strings=True):
        return None
    return http_field(lambda: number(value, key, lo, hi, strings=True), where)


def bool_field(fields: Mapping[str, Any], key: str, where: str = "") -> bool:
    """One of HTTP's own switches (``stream``)."""
    value = fields.get(key, False)
    return http_field(lambda: boolean(value, key, strings=True), where)


def http_field(read: Callable[[], T], where: str) -> T:
    """A field read by the shared readers, its refusal prefixed with the batch item it is in."""
    try:
        return read()
    except RequestError as e:
        raise RequestError(f"{where}{e}", e.id, e.code) from None


def request_fields(fields: Mapping[str, Any], where: str = "") -> Fields:
    """The request fields among an HTTP request's, read as every front reads them."""
    data = {k: v for k, v in fields.items() if k in REQUEST_FIELDS}
    return Fields.read(data, where=where, texts=texts_of(fields) & REQUEST_FIELDS)

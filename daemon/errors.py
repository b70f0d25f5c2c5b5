"""The daemon's error vocabulary, in one place so every layer (fronts, fleet, sinks, jobs)
says "no" alike: the root of every error raised on purpose, so a caller can catch "herald
said no" (a bad request, a bad setting, a front that cannot start) apart from a bug; and a
request's refusal or failure, with the code every front reports it by."""

from __future__ import annotations

from typing import Literal

from tts.errors import UnknownVoice, VoiceError
from tts.text import MarkupError


class HeraldError(Exception):
    """An error of the daemon layer whose message is meant for the user."""


# Text that passed every check but in which espeak-ng found nothing to pronounce ("...", a
# lone tag): every front refuses it with this, rather than reporting silence as spoken.
NOTHING_TO_SAY = "the text has nothing espeak-ng can pronounce: send words"


# Why a request is refused or failed, the same on every front: Wyoming sends the code as its
# ``error`` code, MQTT puts it in the error event, HTTP maps it to a status
# (``daemon.fronts.http.fields.STATUS``). The message says what to do about it.
Code = Literal[
    "bad-request",  # a field is malformed, missing, unknown or out of range
    "bad-text",  # control characters, invalid UTF-8, an unpaired surrogate
    "empty-text",  # nothing but white space
    "text-too-long",  # over the front's limit
    "bad-markup",  # malformed SSML
    "unknown-voice",  # no installed voice has that name or speaks that language
    "bad-voice",  # the voice has no such speaker
    "nothing-to-say",  # espeak-ng found nothing to pronounce ("...")
    "too-old",  # older than its ts allows (mqtt.max_age)
    "busy",  # admission: the front's share of the work is taken; retry later
    "timeout",  # the client sent its request too slowly, or nothing for too long
    "unavailable",  # a sink is off or failed, or herald is shutting down
    "synthesis-failed",  # the engine failed: herald's fault, the log has details
]


class RequestError(HeraldError, ValueError):
    """A request that cannot be served: the message to send back, why (``code``), and its
    id if known."""

    code: Code = "bad-request"

    def __init__(self, message: str, id: str | None = None, code: Code | None = None) -> None:
        super().__init__(message)
        self.id = id
        if code is not None:
            self.code = code


class EmptyText(RequestError):
    """The text has nothing to say in it."""

    code: Code = "empty-text"


class TextTooLong(RequestError):
    """More text than the front takes at once."""

    code: Code = "text-too-long"


def failure(e: BaseException, request_id: str | None = None) -> RequestError:
    """What an error raised while a request was served means to its client: the same
    code on every front, whatever layer raised it."""
    if isinstance(e, RequestError):
        return e
    text = str(e) or type(e).__name__
    if isinstance(e, MarkupError):
        return RequestError(text, request_id, "bad-markup")
    if isinstance(e, UnknownVoice):
        return RequestError(text, request_id, "unknown-voice")
    if isinstance(e, VoiceError):
        return RequestError(text, request_id, "bad-voice")
    return RequestError(f"synthesis failed: {text}", request_id, "synthesis-failed")

"""The Wyoming vocabulary herald speaks: its program name, the refusals a client gets an
``error`` event for, and the library's event classes checked beyond what the library checks."""

from __future__ import annotations

from typing import TypeVar, cast

from wyoming.event import Event, Eventable

from ...errors import HeraldError, RequestError
from ...jobs.fields import check_unicode

PROGRAM = "herald"
FRONT = "wyoming"


class WyomingError(HeraldError):
    """The Wyoming front could not start (address in use, bad socket path, ...)."""


# --- failures ---------------------------------------------------------------------------------


class Refused(HeraldError):
    """A request or event the client gets an ``error`` event for."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


def refusal(e: RequestError) -> Refused:
    """A request error, any front's, as a Wyoming ``error``: its code is the error code."""
    return Refused(e.code, str(e))


class ProtocolError(Refused):
    """Refused outside any request (malformed or out-of-place events): counted on its own."""


class TimedOut(Refused):
    """The client took too long: to send an event it had begun (``reason`` read), or to send
    anything at all (idle). It is told so (code ``timeout``) and the connection ends."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__("timeout", text)
        self.reason = reason


class ClientGone(Exception):
    """The client closed or reset the connection while we were writing to it."""


class ClientStalled(Exception):
    """The client stopped reading: one event could not be written within write_timeout."""


E = TypeVar("E", bound=Eventable)


def parse_event(kind: type[E], event: Event) -> E:
    """The library's event class from an event, or a clear refusal if its data is wrong."""
    try:
        parsed = cast(E, kind.from_event(event))
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise Refused("bad-request", f"{event.type} event has bad data ({e!r}); "
                       "see the Wyoming protocol for its fields") from None
    for attr in ("text",):
        if hasattr(parsed, attr) and not isinstance(getattr(parsed, attr), str):
            raise Refused("bad-request", f"{event.type}.data.{attr} must be a string")
        if hasattr(parsed, attr):
            try:
                check_unicode(getattr(parsed, attr), f"{event.type}.data.{attr}")
            except RequestError as e:
                raise Refused("bad-request", str(e)) from None
    wanted = event.data.get("voice") or {}
    # The library reads a voice that is not an object as no voice, and drops a speaker that
    # comes without a voice name: the default would speak instead, without a word.
    if not isinstance(wanted, dict):
        raise Refused("bad-request", f"{event.type}.data.voice must be an object like "
                       '{"name": "en_US-joe-medium"} or {"language": "en"}')
    if wanted.get("speaker") not in (None, "") and not wanted.get("name"):
        raise Refused("bad-request", f"{event.type}.data.voice.speaker needs voice.name: "
                       "name the voice the speaker belongs to")
    voice = getattr(parsed, "voice", None)
    if voice is not None:
        for attr, types, what in (("name", str, "a string"), ("language", str, "a string"),
                                  ("speaker", (str, int), "a speaker name or number")):
            value = getattr(voice, attr)
            if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
                raise Refused("bad-request", f"{event.type}.data.voice.{attr} must be {what}")
    return parsed


# --- one audio stream to one client -----------------------------------------------------------

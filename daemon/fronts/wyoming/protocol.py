"""The Wyoming vocabulary herald speaks: its program name, the refusals a client gets an
``error`` event for, and the library's event classes checked beyond what the library checks."""

from __future__ import annotations

from typing import TypeVar, cast

from wyoming.event import Event, Eventable

from ...errors import HeraldError, RequestError
from ...jobs.fields import Fields, check_unicode

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
    if voice is not None and voice.language is not None and not isinstance(voice.language, str):
        raise Refused("bad-request", f"{event.type}.data.voice.language must be a string")
    try:
        check_unicode(read_fields(event.type, parsed).text, f"{event.type}.data.text")
    except RequestError as e:
        raise Refused("bad-request", str(e)) from None
    return parsed


def read_fields(kind: str, parsed: Eventable) -> Fields:
    """An event's text, voice name and speaker as every front reads a request's fields, named
    as the event carries them. The library hands them over unchecked: 42 as a text, true as
    a speaker."""
    voice = getattr(parsed, "voice", None)
    where = f"{kind}.data."
    return Fields.read(
        # a synthesize-start has no text: it comes in the chunks, each checked as it comes
        {"text": getattr(parsed, "text", ""),
         "voice": None if voice is None else voice.name,
         "speaker": None if voice is None else voice.speaker},
        names={"text": f"{where}text", "voice": f"{where}voice.name",
               "speaker": f"{where}voice.speaker"})


# --- one audio stream to one client -----------------------------------------------------------

"""Hermes (Rhasspy / Snips) compatibility: ``hermes/tts/say`` in, ``hermes/tts/sayFinished`` out.

Only requests for our ``site_id`` are taken; the reply echoes the request's ``id`` and
``sessionId`` so a dialogue manager can continue the session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .request import Limits, Request, RequestError, decode_text, new_id
from .topics import TopicError, check_request_id


@dataclass(frozen=True)
class HermesSay:
    request: Request
    hermes_id: str | None
    session_id: str | None
    site_id: str


def parse_hermes_say(payload: bytes, site_id: str, limits: Limits,
                     timeline: Any = None) -> HermesSay | None:
    """The request in a ``hermes/tts/say`` payload; None when it is for another site."""
    try:
        data = json.loads(decode_text(payload))
    except ValueError as e:
        raise RequestError(f"hermes/tts/say: malformed JSON: {e}") from None
    if not isinstance(data, dict):
        raise RequestError("hermes/tts/say: payload must be a JSON object")
    if data.get("siteId", "default") != site_id:
        return None
    text = data.get("text")
    if not isinstance(text, str) or not text.strip():
        raise RequestError("hermes/tts/say: empty text: nothing to say")
    if len(text) > limits.max_text:
        raise RequestError(f"hermes/tts/say: text is {len(text)} characters; the limit is "
                           f"{limits.max_text} (mqtt.max_text)")
    hermes_id = data.get("id") if isinstance(data.get("id"), str) else None
    rid = new_id()
    if hermes_id:
        try:
            rid = check_request_id(hermes_id)
        except TopicError:
            pass
    lang = data.get("lang") if isinstance(data.get("lang"), str) else None
    voice = limits.resolve_voice(None) if not lang else _voice_for(lang, limits)
    req = Request(text=text, id=rid, voice=voice, sinks=limits.default_sinks, front="mqtt")
    if timeline is not None:
        req.timeline = timeline
    session = data.get("sessionId") if isinstance(data.get("sessionId"), str) else None
    return HermesSay(req, hermes_id, session, site_id)


def _voice_for(lang: str, limits: Limits) -> str:
    try:
        return limits.resolve_voice(lang)
    except Exception:
        return limits.resolve_voice(None)  # Rhasspy sends its own language; speak anyway


def say_finished(say: HermesSay) -> str:
    return json.dumps({"id": say.hermes_id, "sessionId": say.session_id, "siteId": say.site_id})

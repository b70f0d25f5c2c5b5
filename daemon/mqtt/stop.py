"""The payload of a ``stop``, the same on the device's topic and on an announcement group's:
nothing, ``PRESS`` (Home Assistant's button) or any text stops everything; ``{"id": ...}``
stops one request."""

from __future__ import annotations

from ..errors import RequestError
from ..jobs.fields import json_object
from .payload import decode_text

_STOP_TEXT_MAX = 256  # bytes: "PRESS", "stop", {"id": ...}


def stop_target(payload: bytes) -> str | None:
    """The id a ``stop`` names; None: stop everything."""
    if len(payload) > _STOP_TEXT_MAX:
        raise RequestError("stop payload too long: send nothing, PRESS, or {\"id\": \"...\"}")
    text = decode_text(payload).strip()
    if not text.startswith("{"):
        return None
    request_id = json_object(text, '{"id": "..."}').get("id")
    if not isinstance(request_id, str):
        raise RequestError("stop JSON must be {\"id\": \"...\"}")
    return request_id

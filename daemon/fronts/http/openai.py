"""OpenAI's speech API, ``POST /v1/audio/speech``, so clients written for it work unchanged:
MP3 unless ``response_format`` says otherwise, ``stream_format: "sse"`` for OpenAI's speech
events, and errors in OpenAI's shape (``openai_error``), which its client libraries read.

The audio streams as it is synthesized, as OpenAI's does, except a WAV: that one is sent
whole, its sizes filled in, for players that trust them."""

from __future__ import annotations

import logging
from dataclasses import replace

from aiohttp import web

from ...jobs.fields import RATE_RANGE, Fields
from ...jobs.metrics import Timeline
from .fields import ApiError, Speech, number_field, read_fields
from .formats import response_format_field, stream_format_field
from .speech import SpeechApi

log = logging.getLogger("daemon.fronts.http")


# OpenAI's voice names: clients written for its API send one of these; they get our default.
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin",
                           "nova", "onyx", "sage", "shimmer", "verse"})


async def openai_speech(api: SpeechApi, request: web.Request) -> web.StreamResponse:
    """OpenAI's ``POST /v1/audio/speech``: model ignored, its voice names -> our default."""
    t = Timeline()
    fields = await read_fields(request)
    # OpenAI's names for our fields; the rest of its fields (``model``...) are not ours to refuse.
    f = Fields.read({"text": fields.get("input"), "voice": fields.get("voice")},
                    names={"text": "input"})
    text = api.text(f, "input")
    name = f.voice
    catalog = api.ctx.engine.catalog
    if name and name.lower() in OPENAI_VOICES and name not in {
            i.name for i in catalog.infos()}:
        name = None
    fmt = response_format_field(fields, "mp3")
    events = stream_format_field(fields)
    speed = number_field(fields, "speed", *RATE_RANGE)  # 1/x of a rate: same bounds
    voice = api.voice(name, None)
    # speed is relative to the voice's own pace, which its config sets
    base = api.ctx.synthesis
    scale = base.length_scale if speed is None else \
        catalog.resolve(voice).config.length_scale / speed
    speech = Speech(text, voice, replace(base, length_scale=scale), response_format=fmt)
    if events:
        return await api.send_stream(request, speech, t, "openai")
    if fmt == "wav":
        return await api.send_whole(request, speech, t)
    return await api.send_stream(request, speech, t)


def openai_error(e: ApiError) -> dict[str, object]:
    """A refusal as OpenAI's API words it: its client libraries read ``message``, ``type``,
    ``param`` and ``code`` from it (``openai.BadRequestError`` and the like)."""
    kind = "server_error" if e.status >= 500 else "invalid_request_error"
    return {"error": {"message": e.message, "type": kind, "param": e.param,
                      "code": e.reason}}

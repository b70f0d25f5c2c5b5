"""OpenAI's speech API, ``POST /v1/audio/speech``, so clients written for it work unchanged."""

from __future__ import annotations

import logging
from dataclasses import replace

from aiohttp import web

from ...metrics import Timeline
from ...request import (
    RATE_RANGE,
)
from .fields import ApiError, Speech, number_field, read_fields, shown, string_field
from .speech import SpeechApi

log = logging.getLogger("daemon.fronts.http")


# OpenAI's voice names: clients written for its API send one of these; they get our default.
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin",
                           "nova", "onyx", "sage", "shimmer", "verse"})
OPENAI_FORMATS = ("wav", "pcm")


async def openai_speech(api: SpeechApi, request: web.Request) -> web.StreamResponse:
    """OpenAI's ``POST /v1/audio/speech``: model ignored, its voice names -> our default."""
    t = Timeline()
    fields = await read_fields(request)
    text = api.text(fields, "input")
    name = string_field(fields, "voice")
    catalog = api.ctx.engine.catalog
    if name and name.lower() in OPENAI_VOICES and name not in {
            i.name for i in catalog.infos()}:
        name = None
    fmt = (string_field(fields, "response_format") or "wav").lower()
    if fmt not in OPENAI_FORMATS:
        raise ApiError(400, f"response_format {shown(fmt)} is not supported; supported: "
                       f"{', '.join(OPENAI_FORMATS)}")
    speed = number_field(fields, "speed", *RATE_RANGE)  # 1/x of a rate: same bounds
    voice = api.voice(name, None)
    # speed is relative to the voice's own pace, which its config sets
    base = api.ctx.synthesis
    scale = base.length_scale if speed is None else \
        catalog.resolve(voice).config.length_scale / speed
    speech = Speech(text, voice, replace(base, length_scale=scale))
    if fmt == "pcm":
        return await api.send_stream(request, speech, t, "audio/pcm", header=False)
    return await api.send_whole(request, speech, t)

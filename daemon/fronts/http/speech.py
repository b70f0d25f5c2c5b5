"""Speaking over HTTP: ``POST /tts`` and ``/tts/stream``, and what every synthesis endpoint
shares: turning fields into a checked utterance, handing it to the scheduler as a job, and
sending its audio whole or as the engine makes it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import replace
from typing import Any

from aiohttp import hdrs, web

from tts import VoiceError
from tts.audio import AudioFormat
from tts.codec import CONTENT_TYPES, output_format

from ...context import Context
from ...errors import RequestError, failure
from ...jobs.fields import Fields, check_ssml, check_text, unknown_field
from ...jobs.metrics import Timeline
from ...jobs.request import Request
from ...settings import HttpSettings
from ...sinks.client import ClientSink
from .fields import (
    SPEECH_FIELDS,
    Speech,
    bool_field,
    http_field,
    read_fields,
    request_fields,
)
from .formats import AudioBody, Events, encode_whole, response_format_field, wants_events

log = logging.getLogger("daemon.fronts.http")


class SpeechApi:
    """The synthesis side of the HTTP front, shared by its speech, OpenAI and batch routes.

    Each utterance is a job of the scheduler, like every front's (one admission policy, one
    latency record, the status and ``/metrics`` see it); its audio comes back through a
    ``ClientSink`` that this handler drains into the response. A client that hangs up cancels
    its handler (``handler_cancellation``), which makes the sink leave: the job stops."""

    name = "http"

    def __init__(self, settings: HttpSettings, ctx: Context) -> None:
        self.settings = settings
        self.ctx = ctx
        ctx.scheduler.limit(self.name, settings.max_concurrent, "http.max_concurrent")

    async def speech(self, fields: Mapping[str, Any], where: str = "",
                      known: frozenset[str] = SPEECH_FIELDS) -> Speech:
        """Fields -> a checked utterance. An unknown field is refused: a misspelt ``voise``
        would otherwise be spoken in the default voice without a word."""
        unknown = sorted(set(fields) - known)
        if unknown:
            raise unknown_field(unknown[0], known, where)
        f = request_fields(fields, where)
        text = self.text(f, "text", where)
        if f.format == "ssml":
            http_field(lambda: check_ssml(text), where)
        base = self.ctx.synthesis
        options = replace(base, length_scale=base.length_scale if f.rate is None else f.rate,
                          speaker=f.speaker, seed=f.seed)
        voice = self.voice(f.voice, options.speaker)
        return Speech(text, voice, options, stream=bool_field(fields, "stream", where),
                      text_format=f.format,
                      response_format=response_format_field(fields, "wav", where))

    def text(self, f: Fields, key: str, where: str = "") -> str:
        """The text checked against HTTP's limit (``key``: its name on the wire)."""
        return check_text(f.text, self.settings.max_text_chars,
                          "http.max_text_chars", field=key, where=where)

    def voice(self, name: str | None, speaker: str | int | None) -> str:
        """The installed voice asked for by name or language (404 if none); the speaker
        checked against it (400)."""
        engine = self.ctx.engine
        try:
            voice = engine.resolve_voice(name, default=self.ctx.state.voice)
            engine.check_speaker(voice, speaker)
        except VoiceError as e:
            raise failure(e) from None
        return voice

    # ------------------------------------------------------------------ synthesis endpoints

    async def tts(self, request: web.Request) -> web.StreamResponse:
        t = Timeline()
        speech = await self.speech(await read_fields(request))
        if speech.stream:
            return await self.send_stream(request, speech, t,
                                          "herald" if wants_events(request) else None)
        return await self.send_whole(request, speech, t)

    async def tts_stream(self, request: web.Request) -> web.StreamResponse:
        t = Timeline()
        speech = await self.speech(await read_fields(request))
        return await self.send_stream(request, speech, t,
                                      "herald" if wants_events(request) else None)

    def submit(self, speech: Speech, t: Timeline, whole: bool = False) -> Request:
        """The utterance as a job of the scheduler, its audio to come through ``pcm``
        (``whole``: taken only once it is all made). Raises RequestError (``busy`` beyond
        http.max_concurrent)."""
        o = speech.options
        req = Request(text=speech.text, voice=speech.voice, speaker=o.speaker,
                      rate=o.length_scale, noise_scale=o.noise_scale, noise_w=o.noise_w,
                      seed=o.seed, sinks=(), front=self.name,
                      timeline=t, text_format=speech.text_format,
                      client=ClientSink(self.name, whole=whole))
        self.ctx.scheduler.submit(req)
        return req

    async def pcm(self, req: Request) -> AsyncGenerator[bytes, None]:
        """The job's audio as it is synthesized. A job that fails raises its RequestError
        (before any audio, the guard answers it with its status); closing this generator
        early (the client hung up, its handler cancelled) stops the job."""
        client = req.client
        assert client is not None
        try:
            while (piece := await client.read()) is not None:
                yield piece
            if client.error is not None:
                raise client.error
        finally:
            client.leave()

    async def synthesize_all(self, req: Request) -> bytes:
        """The whole utterance as PCM (for a WAV with exact sizes, or a ZIP entry)."""
        async with contextlib.aclosing(self.pcm(req)) as pieces:
            return b"".join([piece async for piece in pieces])

    async def send_whole(self, request: web.Request, speech: Speech,
                         t: Timeline) -> web.Response:
        req = self.submit(speech, t, whole=True)
        fmt = self.ctx.engine.audio_format(speech.voice)
        body = await encode_whole(speech.response_format, fmt, await self.synthesize_all(req))
        return web.Response(body=body, headers=self.audio_headers(
            req, output_format(speech.response_format, fmt),
            CONTENT_TYPES[speech.response_format]))

    async def send_stream(self, request: web.Request, speech: Speech, t: Timeline,
                          events: Events | None = None) -> web.StreamResponse:
        """Each chunk's audio, encoded as ``speech.response_format`` (and framed as
        server-sent ``events`` if asked for), the moment the engine hands it over. Nothing
        can fail as a 4xx once the first chunk is out: a failure after it ends the response
        short (the latency record and the log say why)."""
        req = self.submit(speech, t)
        client = req.client
        assert client is not None
        fmt = self.ctx.engine.audio_format(speech.voice)
        body = AudioBody(speech.response_format, fmt, events)
        resp = web.StreamResponse(headers=self.audio_headers(
            req, output_format(speech.response_format, fmt), body.content_type))
        try:
            with contextlib.closing(body):
                async with contextlib.aclosing(self.pcm(req)) as pieces:
                    async for piece in pieces:
                        data = await body.feed(piece)
                        if not resp.prepared:  # the first chunk: nothing can fail as a 4xx now
                            await resp.prepare(request)
                        await resp.write(data)
                await resp.write(await body.finish(lambda: client.record))
            await resp.write_eof()
        except RequestError:
            if not resp.prepared:
                raise
            if request.transport is not None:
                request.transport.abort()  # not a clean end: the client must not take it as one
        except ConnectionError:
            pass  # gone: the job stopped when its sink left
        return resp

    def audio_headers(self, req: Request, fmt: AudioFormat,
                      content_type: str) -> dict[str, str]:
        """``fmt``: what the client decodes (Opus at 48 kHz, the rest at the voice's rate)."""
        return {hdrs.CONTENT_TYPE: content_type, hdrs.CACHE_CONTROL: "no-store",
                "X-Herald-Id": req.id, "X-Herald-Voice": req.voice or "",
                "X-Sample-Rate": str(fmt.rate), "X-Sample-Width": str(fmt.width),
                "X-Channels": str(fmt.channels)}

"""Speaking over HTTP: ``POST /tts`` and ``/tts/stream``, and what every synthesis endpoint
shares: the concurrency slots, turning fields into a checked utterance, sending audio whole or
as the engine makes it, and the latency record each utterance files."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import hdrs, web

from tts import AudioChunk, UnknownVoice, VoiceError, to_pcm16
from tts.audio import AudioFormat
from tts.codec import CONTENT_TYPES
from tts.text import MarkupError

from ...context import Context
from ...logcontext import current_request
from ...metrics import LatencyRecord, Timeline
from ...request import (
    RATE_RANGE,
    SEED_RANGE,
    check_text,
)
from ...settings import HttpSettings
from .fields import (
    SPEECH_FIELDS,
    ApiError,
    NothingToSay,
    Speech,
    bool_field,
    format_field,
    kind_of,
    number_field,
    read_fields,
    shown,
    speaker_field,
    string_field,
)
from .formats import AudioBody, Events, encode_whole, response_format_field, wants_events

log = logging.getLogger("daemon.fronts.http")


@dataclass
class Run:
    """What a latency record needs, gathered while one utterance is synthesized and sent."""

    speech: Speech
    t: Timeline
    fmt: AudioFormat  # the voice's, looked up once
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    samples: int = 0
    answered: bool = False  # the engine produced audio, so the request gets a latency record
    outcome: str = "error"


class SpeechApi:
    """The synthesis side of the HTTP front, shared by its speech, OpenAI and batch routes."""

    name = "http"

    def __init__(self, settings: HttpSettings, ctx: Context) -> None:
        self.settings = settings
        self.ctx = ctx
        self.active = 0  # synthesis slots in use

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """One of ``max_concurrent`` synthesis slots, or 429."""
        s = self.settings
        if self.active >= s.max_concurrent:
            raise ApiError(429, f"busy: all {s.max_concurrent} synthesis slots are in use "
                           f"(http.max_concurrent); retry in {s.retry_after_seconds} s",
                           headers={hdrs.RETRY_AFTER: str(s.retry_after_seconds)})
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1

    async def speech(self, fields: Mapping[str, Any], where: str = "",
                      known: frozenset[str] = SPEECH_FIELDS) -> Speech:
        """Fields -> a checked utterance. An unknown field is refused: a misspelt ``voise``
        would otherwise be spoken in the default voice without a word."""
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ApiError(400, f"{where}unknown field {shown(unknown[0])}; known fields: "
                           f"{', '.join(sorted(known))}")
        text = self.text(fields, "text", where)
        text_format = format_field(fields, text, where)
        rate = number_field(fields, "rate", *RATE_RANGE, where=where)
        seed = number_field(fields, "seed", *SEED_RANGE, where=where, integer=True)
        base = self.ctx.synthesis
        options = replace(base, length_scale=base.length_scale if rate is None else rate,
                          speaker=speaker_field(fields, where),
                          seed=None if seed is None else int(seed))
        voice = self.voice(string_field(fields, "voice", where), options.speaker)
        return Speech(text, voice, options, stream=bool_field(fields, "stream", where),
                      text_format=text_format,
                      response_format=response_format_field(fields, "wav", where))

    def text(self, fields: Mapping[str, Any], key: str, where: str = "") -> str:
        value = fields.get(key)
        if value is None:
            raise ApiError(400, f"{where}missing {key!r}: the text to speak")
        if not isinstance(value, str):
            raise ApiError(400, f"{where}{key!r} must be a string, not {kind_of(value)}")
        return check_text(value, self.settings.max_text_chars,
                          "http.max_text_chars", field=repr(key), where=where)

    def voice(self, name: str | None, speaker: str | int | None) -> str:
        """The installed voice asked for by name or language (404 if none); the speaker
        checked against it (400)."""
        engine = self.ctx.engine
        try:
            voice = engine.resolve_voice(name, default=self.ctx.state.voice)
        except UnknownVoice as e:
            raise ApiError(404, str(e), reason="unknown_voice") from None
        try:
            engine.check_speaker(voice, speaker)
        except VoiceError as e:
            raise ApiError(400, str(e)) from None
        return voice

    # ------------------------------------------------------------------ synthesis endpoints

    async def tts(self, request: web.Request) -> web.StreamResponse:
        t = Timeline()
        with self.slot():
            speech = await self.speech(await read_fields(request))
            if speech.stream:
                return await self.send_stream(request, speech, t,
                                              "herald" if wants_events(request) else None)
            return await self.send_whole(request, speech, t)

    async def tts_stream(self, request: web.Request) -> web.StreamResponse:
        t = Timeline()
        with self.slot():
            speech = await self.speech(await read_fields(request))
            return await self.send_stream(request, speech, t,
                                          "herald" if wants_events(request) else None)

    def run(self, speech: Speech, t: Timeline) -> Run:
        return Run(speech, t, self.ctx.engine.audio_format(speech.voice))

    @contextlib.contextmanager
    def measured(self, run: Run) -> Iterator[None]:
        """Files the utterance's latency record, however it ends, and shows the utterance in
        the device status while it runs. A client that went away
        (``ConnectionError``, or its handler cancelled) is no error: the record says stopped,
        one line logs how far it got, and the exception goes on up to end the handler, which
        returns quietly (aiohttp has nothing left to send)."""
        self.ctx.status.begin(run.id, self.name)
        token = current_request.set(run.id)  # this handler's log lines are about the run
        try:
            yield
        except (ConnectionError, asyncio.CancelledError):
            run.outcome = "stopped"
            log.info("HTTP %s: client went away after %.1f s of audio", run.id,
                     run.samples / run.fmt.rate)
            raise
        finally:
            if run.answered:
                self.record(run)
            current_request.reset(token)
            self.ctx.status.end(run.id)

    async def synthesize_all(self, run: Run) -> bytes:
        """The whole utterance as PCM (for a WAV with exact sizes, or a ZIP entry)."""
        parts: list[bytes] = []
        async with contextlib.aclosing(self.chunks(run)) as chunks:
            async for chunk in chunks:
                parts.append(to_pcm16(chunk.samples))
                run.samples += len(chunk.samples)
        run.t.synth_done = time.monotonic()
        return b"".join(parts)

    async def send_whole(self, request: web.Request, speech: Speech,
                          t: Timeline) -> web.Response:
        run = self.run(speech, t)
        with self.measured(run):
            pcm = await self.synthesize_all(run)
            body = await encode_whole(speech.response_format, run.fmt, pcm)
            t.first_audio = time.monotonic()  # the whole file is this sink's first audio
            run.outcome = "ok"
        return web.Response(body=body, headers=self.audio_headers(
            run, CONTENT_TYPES[speech.response_format]))

    async def send_stream(self, request: web.Request, speech: Speech, t: Timeline,
                           events: Events | None = None) -> web.StreamResponse:
        """Each chunk's audio, encoded as ``speech.response_format`` (and framed as
        server-sent ``events`` if asked for), the moment the engine hands it over."""
        run = self.run(speech, t)
        body = AudioBody(speech.response_format, run.fmt, events)
        resp = web.StreamResponse(headers=self.audio_headers(run, body.content_type))
        with contextlib.suppress(ConnectionError), self.measured(run), \
                contextlib.closing(body):  # gone: see measured
            async with contextlib.aclosing(self.chunks(run)) as chunks:
                async for chunk in chunks:
                    data = await body.feed(to_pcm16(chunk.samples))
                    if not resp.prepared:  # the first chunk: nothing can fail as a 4xx now
                        await resp.prepare(request)
                    await resp.write(data)
                    if t.first_audio is None:
                        t.first_audio = time.monotonic()
                    run.samples += len(chunk.samples)
            t.synth_done = time.monotonic()
            await resp.write(await body.finish(lambda: self.latency(run, "ok")))
            await resp.write_eof()
            run.outcome = "ok"
        return resp

    async def chunks(self, run: Run) -> AsyncGenerator[AudioChunk, None]:
        """The engine's chunks. Failing before the first one is the client's error (4xx)."""
        speech = run.speech
        run.t.started = time.monotonic()
        stream = self.ctx.engine.stream(speech.text, speech.voice, speech.options,
                                        speech.text_format)
        async with contextlib.aclosing(stream):
            try:
                first = await anext(stream, None)
            except MarkupError as e:  # checked in speech() already; the engine agrees
                raise ApiError(400, str(e)) from None
            except UnknownVoice as e:
                raise ApiError(404, str(e), reason="unknown_voice") from None
            except VoiceError as e:
                raise ApiError(400, str(e)) from None
            if first is None:
                raise NothingToSay()
            run.answered = True
            yield first
            async for chunk in stream:
                yield chunk

    def audio_headers(self, run: Run, content_type: str) -> dict[str, str]:
        fmt = run.fmt
        return {hdrs.CONTENT_TYPE: content_type, hdrs.CACHE_CONTROL: "no-store",
                "X-Herald-Id": run.id, "X-Herald-Voice": run.speech.voice,
                "X-Sample-Rate": str(fmt.rate), "X-Sample-Width": str(fmt.width),
                "X-Channels": str(fmt.channels)}

    def latency(self, run: Run, outcome: str | None = None) -> LatencyRecord:
        return LatencyRecord.from_timeline(
            run.id, self.name, self.name, run.speech.voice, run.t, run.samples / run.fmt.rate,
            outcome=outcome or run.outcome)

    def record(self, run: Run) -> None:
        self.ctx.metrics.record(self.latency(run))


"""HTTP API, kiosk web page and Prometheus ``/metrics``.

Audio leaves as the engine makes it: ``/tts/stream`` sends the WAV header at once and then
each chunk's PCM, so ``curl -N ... | aplay`` starts speaking while the rest of the text is
still being synthesized. Everything a request can get wrong (token, size, fields, voice,
speaker, nothing to say) is found before the status line goes out, because once audio has
started the status can no longer say what went wrong. That includes malformed SSML
(``format: "ssml"``): it is parsed before synthesis and refused with 400, line and column.

There is no queue here: a request beyond ``max_concurrent`` is refused with 429 and a
``Retry-After`` rather than left waiting on a socket, so a burst cannot pile up unbounded
work behind the speaker and every other front.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
import uuid
import zipfile
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, cast
from urllib.parse import parse_qsl

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field, SecretStr

from tts import AudioChunk, SynthesisOptions, UnknownVoice, VoiceError, to_pcm16, wav_bytes
from tts.audio import AudioFormat, wav_stream_header
from tts.text import MarkupError, TextFormat, parse_ssml

from ..context import Context
from ..logcontext import current_request
from ..metrics import LatencyRecord, Timeline
from ..request import (
    NOTHING_TO_SAY,
    RATE_RANGE,
    SEED_RANGE,
    RequestError,
    TextTooLong,
    check_text,
    json_object,
    parse_json,
)
from . import is_loopback_host

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parent / "web"

# OpenAI's voice names: clients written for its API send one of these; they get our default.
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin",
                           "nova", "onyx", "sage", "shimmer", "verse"})
OPENAI_FORMATS = ("wav", "pcm")
SPEECH_FIELDS = frozenset({"text", "voice", "speaker", "rate", "seed", "stream", "format"})
TEXT_FORMATS = ("text", "ssml")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_UNSAFE_FILENAME = re.compile(r"[^\w.-]+")
_PUBLIC_PATHS = ("/", "/healthz")  # and /static/: no data there, and the page asks for the token

# Outcome label for refused requests in herald_requests{front="http"}.
_REASONS = {400: "bad_request", 401: "unauthorized", 404: "not_found",
            405: "method_not_allowed", 413: "too_large", 415: "unsupported_media_type",
            429: "busy"}


class HttpSettings(BaseModel):
    enabled: bool = True
    host: str = Field("127.0.0.1", min_length=1,
                      description="address to listen on; 0.0.0.0 for every interface")
    port: int = Field(8000, ge=0, le=65535, description="0 picks a free port")
    token: SecretStr | None = Field(
        None, description="bearer token required on every endpoint but /healthz and the page")
    max_text_chars: int = Field(5000, ge=1, description="longer texts get 413")
    max_batch: int = Field(50, ge=1, le=50, description="items per /tts/batch")
    max_concurrent: int = Field(4, ge=1, description="syntheses at once; more get 429")
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="request body size limit")
    retry_after_seconds: int = Field(2, ge=1, description="Retry-After sent with 429")


class ApiError(Exception):
    """A refused request: the status, and a message that tells the client what to do."""

    def __init__(self, status: int, message: str, reason: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason or _REASONS.get(status, "error")
        self.headers = dict(headers or {})


class NothingToSay(ApiError):
    """The text passed every check, but espeak-ng found no words in it (``"..."``)."""

    def __init__(self) -> None:
        super().__init__(400, NOTHING_TO_SAY)


@dataclass(frozen=True)
class Speech:
    """One utterance asked for, checked: the voice is installed and the speaker exists."""

    text: str
    voice: str
    options: SynthesisOptions
    stream: bool = False
    filename: str = ""
    text_format: TextFormat = "text"


@dataclass
class _Run:
    """What a latency record needs, gathered while one utterance is synthesized and sent."""

    speech: Speech
    t: Timeline
    fmt: AudioFormat  # the voice's, looked up once
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    samples: int = 0
    answered: bool = False  # the engine produced audio, so the request gets a latency record
    outcome: str = "error"


class HttpFront:
    name = "http"

    def __init__(self, settings: HttpSettings, ctx: Context) -> None:
        self.settings = settings
        self.ctx = ctx
        self.port: int | None = None  # the bound port, once started
        self._runner: web.AppRunner | None = None
        self._active = 0

    # ------------------------------------------------------------------ lifecycle

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard],
                              client_max_size=self.settings.max_body_bytes)
        r = app.router
        r.add_post("/tts", self._tts)
        r.add_post("/tts/stream", self._tts_stream)
        r.add_post("/tts/batch", self._batch)
        r.add_post("/v1/audio/speech", self._openai_speech)
        r.add_get("/voices", self._voices)
        r.add_get("/healthz", self._healthz)
        r.add_get("/metrics", self._metrics)
        r.add_get("/", self._index)
        r.add_static("/static/", WEB_DIR, append_version=False)
        return app

    async def start(self) -> None:
        s = self.settings
        # handler_cancellation: a client that hangs up cancels its handler, and with it the
        # synthesis; shutdown_timeout: SIGTERM must not wait a minute for open streams.
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None,
                                     shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.host, s.port)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            self._runner = None
            raise OSError(e.errno, f"cannot listen on {s.host}:{s.port} for HTTP ({e.strerror});"
                          " set http.host / http.port, or http.enabled = false") from e
        self.port = int(self._runner.addresses[0][1])
        log.info("HTTP API and web page on http://%s:%d/%s", s.host, self.port,
                 " (bearer token required)" if s.token else "")
        if s.token is None and not is_loopback_host(s.host):
            log.warning("HTTP is bound to %s without http.token: anyone who can reach this "
                        "port can make herald speak; set http.token", s.host)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ guard

    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        """Token check, and one JSON error shape for every refusal, ours or aiohttp's."""
        try:
            self._check_token(request)
            return await handler(request)
        except ApiError as e:
            return self._refuse(request, e)
        except RequestError as e:  # the checks every front shares
            status = 413 if isinstance(e, TextTooLong) else 400
            return self._refuse(request, ApiError(status, str(e)))
        except web.HTTPException as e:  # aiohttp's: unknown path, wrong method, huge body
            if e.status < 400:
                raise
            if isinstance(e, web.HTTPRequestEntityTooLarge):
                message = (f"request body is larger than {self.settings.max_body_bytes} bytes "
                           "(http.max_body_bytes)")
            elif e.status == 404:
                message = (f"no such endpoint {request.method} {request.path}; see the README "
                           "for /tts, /tts/stream, /tts/batch, /v1/audio/speech, /voices")
            elif e.status == 405:
                message = (f"{request.method} is not allowed on {request.path}; use "
                           f"{e.headers.get(hdrs.ALLOW, 'another method')}")
            else:
                message = f"{e.reason} for {request.method} {request.path}"
            headers = {k: v for k, v in e.headers.items() if k in (hdrs.ALLOW,)}
            return self._refuse(request, ApiError(e.status, message, headers=headers))
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            log.exception("HTTP %s %s failed", request.method, request.path)
            if request.writer.output_size > 0:  # status already sent: aiohttp drops the link
                raise
            self.ctx.metrics.request(self.name, "error")
            return web.json_response({"error": "internal error; the herald log has details"},
                                     status=500)

    def _check_token(self, request: web.Request) -> None:
        token = self.settings.token
        path = request.path
        if token is None or path in _PUBLIC_PATHS or path.startswith("/static/"):
            return
        scheme, _, given = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), token.get_secret_value().encode()):
            raise ApiError(401, "missing or wrong bearer token: send "
                           "'Authorization: Bearer <http.token>'",
                           headers={hdrs.WWW_AUTHENTICATE: 'Bearer realm="herald"'})

    def _refuse(self, request: web.Request, e: ApiError) -> web.Response:
        log.info("HTTP %d for %s %s from %s: %s", e.status, request.method, request.path,
                 request.remote, e.message)
        self.ctx.metrics.request(self.name, e.reason)
        return web.json_response({"error": e.message}, status=e.status, headers=e.headers)

    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        """One of ``max_concurrent`` synthesis slots, or 429."""
        s = self.settings
        if self._active >= s.max_concurrent:
            raise ApiError(429, f"busy: all {s.max_concurrent} synthesis slots are in use "
                           f"(http.max_concurrent); retry in {s.retry_after_seconds} s",
                           headers={hdrs.RETRY_AFTER: str(s.retry_after_seconds)})
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1

    # ------------------------------------------------------------------ reading requests

    async def _fields(self, request: web.Request) -> dict[str, Any]:
        """The request's fields from JSON, a form, or a text/plain body (the text itself).

        Query parameters count too, below the body: ``curl --data-binary @file.txt -H
        'Content-Type: text/plain' '.../tts/stream?voice=...'`` works.
        """
        fields: dict[str, Any] = dict(request.query)
        if not request.body_exists:
            return fields
        ctype = request.content_type if hdrs.CONTENT_TYPE in request.headers else ""
        if ctype in ("", "application/json") or ctype.endswith("+json"):
            fields.update(json_object(_utf8(await request.read(), "request body")))
        elif ctype == "application/x-www-form-urlencoded":
            text = _utf8(await request.read(), "form body")
            try:
                fields.update(parse_qsl(text, keep_blank_values=True, errors="strict"))
            except UnicodeDecodeError:
                raise ApiError(400, "a form field is not valid UTF-8 once %-decoded") from None
        elif ctype == "multipart/form-data":
            fields.update(await _multipart(request))
        elif ctype == "text/plain":
            fields["text"] = _utf8(await request.read(), "request body")
        else:
            raise ApiError(415, f"unsupported Content-Type {ctype!r}: send application/json, "
                           "a form (urlencoded or multipart) or text/plain")
        return fields

    async def _speech(self, fields: Mapping[str, Any], where: str = "",
                      known: frozenset[str] = SPEECH_FIELDS) -> Speech:
        """Fields -> a checked utterance. An unknown field is refused: a misspelt ``voise``
        would otherwise be spoken in the default voice without a word."""
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ApiError(400, f"{where}unknown field {_shown(unknown[0])}; known fields: "
                           f"{', '.join(sorted(known))}")
        text = self._text(fields, "text", where)
        text_format = _text_format(fields, text, where)
        rate = _number(fields, "rate", *RATE_RANGE, where=where)
        seed = _number(fields, "seed", *SEED_RANGE, where=where, integer=True)
        base = self.ctx.synthesis
        options = replace(base, length_scale=base.length_scale if rate is None else rate,
                          speaker=_speaker(fields, where),
                          seed=None if seed is None else int(seed))
        voice = self._voice(_string(fields, "voice", where), options.speaker)
        return Speech(text, voice, options, stream=_bool(fields, "stream", where),
                      text_format=text_format)

    def _text(self, fields: Mapping[str, Any], key: str, where: str = "") -> str:
        value = fields.get(key)
        if value is None:
            raise ApiError(400, f"{where}missing {key!r}: the text to speak")
        if not isinstance(value, str):
            raise ApiError(400, f"{where}{key!r} must be a string, not {_kind(value)}")
        return check_text(value, self.settings.max_text_chars,
                          "http.max_text_chars", field=repr(key), where=where)

    def _voice(self, name: str | None, speaker: str | int | None) -> str:
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

    async def _tts(self, request: web.Request) -> web.StreamResponse:
        t = Timeline()
        with self._slot():
            speech = await self._speech(await self._fields(request))
            if speech.stream:
                return await self._send_stream(request, speech, t, "audio/wav")
            return await self._send_whole(request, speech, t)

    async def _tts_stream(self, request: web.Request) -> web.StreamResponse:
        t = Timeline()
        with self._slot():
            speech = await self._speech(await self._fields(request))
            return await self._send_stream(request, speech, t, "audio/wav")

    async def _openai_speech(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's ``POST /v1/audio/speech``: model ignored, its voice names -> our default."""
        t = Timeline()
        with self._slot():
            fields = await self._fields(request)
            text = self._text(fields, "input")
            name = _string(fields, "voice")
            catalog = self.ctx.engine.catalog
            if name and name.lower() in OPENAI_VOICES and name not in {
                    i.name for i in catalog.infos()}:
                name = None
            fmt = (_string(fields, "response_format") or "wav").lower()
            if fmt not in OPENAI_FORMATS:
                raise ApiError(400, f"response_format {_shown(fmt)} is not supported; supported: "
                               f"{', '.join(OPENAI_FORMATS)}")
            speed = _number(fields, "speed", *RATE_RANGE)  # 1/x of a rate: same bounds
            voice = self._voice(name, None)
            # speed is relative to the voice's own pace, which its config sets
            base = self.ctx.synthesis
            scale = base.length_scale if speed is None else \
                catalog.resolve(voice).config.length_scale / speed
            speech = Speech(text, voice, replace(base, length_scale=scale))
            if fmt == "pcm":
                return await self._send_stream(request, speech, t, "audio/pcm", header=False)
            return await self._send_whole(request, speech, t)

    async def _batch(self, request: web.Request) -> web.StreamResponse:
        """A ZIP streamed entry by entry: every item is checked before the first byte."""
        received = time.monotonic()
        with self._slot():
            items = await self._batch_items(request)
            resp = web.StreamResponse(headers={
                hdrs.CONTENT_TYPE: "application/zip", hdrs.CACHE_CONTROL: "no-store",
                hdrs.CONTENT_DISPOSITION: 'attachment; filename="herald.zip"'})
            await resp.prepare(request)
            sink = _ZipSink()
            with contextlib.suppress(ConnectionError):  # the client went away: see _measured
                with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED) as zf:
                    for speech in items:
                        run = self._run(speech, Timeline(received=received))
                        with self._measured(run):
                            try:
                                pcm = await self._synthesize_all(run)
                            except NothingToSay:
                                log.warning("HTTP batch item %s has nothing to pronounce; it "
                                            "gets an empty WAV", speech.filename)
                                pcm = b""
                            info = zipfile.ZipInfo(speech.filename, time.localtime()[:6])
                            zf.writestr(info, wav_bytes(pcm, run.fmt))
                            await resp.write(sink.drain())
                            run.t.first_audio = time.monotonic()
                            run.outcome = "ok"
                await resp.write(sink.drain())  # the central directory
                await resp.write_eof()
            return resp

    async def _batch_items(self, request: web.Request) -> list[Speech]:
        ctype = request.content_type if hdrs.CONTENT_TYPE in request.headers else ""
        if ctype not in ("", "application/json") and not ctype.endswith("+json"):
            raise ApiError(415, f"/tts/batch takes a JSON body, not {ctype!r}")
        body = parse_json(_utf8(await request.read(), "request body"))
        items = body.get("items") if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise ApiError(400, 'send a JSON list [{"text": ..., "voice": ..., "filename": '
                           '...}, ...] (or {"items": [...]})')
        if not items:
            raise ApiError(400, "the batch is empty: nothing to speak")
        if len(items) > self.settings.max_batch:
            raise ApiError(413, f"the batch has {len(items)} items; the limit is "
                           f"{self.settings.max_batch} (http.max_batch): send several batches")
        taken: set[str] = set()
        out = []
        for i, item in enumerate(items):
            where = f"item {i}: "
            if not isinstance(item, dict):
                raise ApiError(400, f"{where}must be an object like {{\"text\": \"Hello\"}}, "
                               f"not {_kind(item)}")
            speech = await self._speech(item, where, SPEECH_FIELDS | {"filename"})
            name = _unique_filename(_string(item, "filename", where), i, taken)
            out.append(replace(speech, filename=name))
        return out

    def _run(self, speech: Speech, t: Timeline) -> _Run:
        return _Run(speech, t, self.ctx.engine.audio_format(speech.voice))

    @contextlib.contextmanager
    def _measured(self, run: _Run) -> Iterator[None]:
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
                self._record(run)
            current_request.reset(token)
            self.ctx.status.end(run.id)

    async def _synthesize_all(self, run: _Run) -> bytes:
        """The whole utterance as PCM (for a WAV with exact sizes, or a ZIP entry)."""
        parts: list[bytes] = []
        async with contextlib.aclosing(self._chunks(run)) as chunks:
            async for chunk in chunks:
                parts.append(to_pcm16(chunk.samples))
                run.samples += len(chunk.samples)
        run.t.synth_done = time.monotonic()
        return b"".join(parts)

    async def _send_whole(self, request: web.Request, speech: Speech,
                          t: Timeline) -> web.Response:
        run = self._run(speech, t)
        with self._measured(run):
            pcm = await self._synthesize_all(run)
            body = wav_bytes(pcm, run.fmt)
            t.first_audio = time.monotonic()  # the whole file is this sink's first audio
            run.outcome = "ok"
        return web.Response(body=body, headers=self._audio_headers(run, "audio/wav"))

    async def _send_stream(self, request: web.Request, speech: Speech, t: Timeline,
                           content_type: str, header: bool = True) -> web.StreamResponse:
        """Header, then each chunk's PCM the moment the engine hands it over."""
        run = self._run(speech, t)
        resp = web.StreamResponse(headers=self._audio_headers(run, content_type))
        with contextlib.suppress(ConnectionError), self._measured(run):  # gone: see _measured
            async with contextlib.aclosing(self._chunks(run)) as chunks:
                async for chunk in chunks:
                    if not resp.prepared:  # the first chunk: nothing can fail as a 4xx now
                        await resp.prepare(request)
                        if header:
                            await resp.write(wav_stream_header(run.fmt))
                    await resp.write(to_pcm16(chunk.samples))
                    if t.first_audio is None:
                        t.first_audio = time.monotonic()
                    run.samples += len(chunk.samples)
            t.synth_done = time.monotonic()
            await resp.write_eof()
            run.outcome = "ok"
        return resp

    async def _chunks(self, run: _Run) -> AsyncGenerator[AudioChunk, None]:
        """The engine's chunks. Failing before the first one is the client's error (4xx)."""
        speech = run.speech
        run.t.started = time.monotonic()
        stream = cast(AsyncGenerator[AudioChunk, None], self.ctx.engine.stream(
            speech.text, speech.voice, speech.options, speech.text_format))
        async with contextlib.aclosing(stream):
            try:
                first = await anext(stream, None)
            except MarkupError as e:  # checked in _speech already; the engine agrees
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

    def _audio_headers(self, run: _Run, content_type: str) -> dict[str, str]:
        fmt = run.fmt
        return {hdrs.CONTENT_TYPE: content_type, hdrs.CACHE_CONTROL: "no-store",
                "X-Herald-Id": run.id, "X-Herald-Voice": run.speech.voice,
                "X-Sample-Rate": str(fmt.rate), "X-Sample-Width": str(fmt.width),
                "X-Channels": str(fmt.channels)}

    def _record(self, run: _Run) -> None:
        self.ctx.metrics.record(LatencyRecord.from_timeline(
            run.id, self.name, self.name, run.speech.voice, run.t, run.samples / run.fmt.rate,
            outcome=run.outcome))

    # ------------------------------------------------------------------ the rest

    async def _voices(self, request: web.Request) -> web.Response:
        catalog = self.ctx.engine.catalog
        return web.json_response([i.summary(i.name == self.ctx.state.voice)
                                  for i in catalog.infos()])

    async def _healthz(self, request: web.Request) -> web.Response:
        """200 ``ok``, or 503 ``stalled`` with the problem while work in hand can't move."""
        problem = self.ctx.status.problem()
        body: dict[str, Any] = {
            "status": "ok" if problem is None else "stalled", "version": self.ctx.version,
            "active": self._active, "voices": [i.name for i in self.ctx.engine.catalog.infos()]}
        if problem is not None:
            body["problem"] = problem
        return web.json_response(body, status=200 if problem is None else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.ctx.metrics.registry),
                            headers={hdrs.CONTENT_TYPE: CONTENT_TYPE_LATEST})

    async def _index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(WEB_DIR / "index.html", headers={hdrs.CACHE_CONTROL: "no-cache"})


class _ZipSink:
    """A write-only, unseekable file for ``zipfile``: the handler drains it after each entry,
    so a batch holds one WAV in memory at a time, not fifty."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._pos = 0

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        self._pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def drain(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


# ---------------------------------------------------------------------- field parsing

def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"{what} is not valid UTF-8 (bad byte at offset {e.start}): "
                       "send text encoded as UTF-8") from None


async def _multipart(request: web.Request) -> dict[str, Any]:
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
            out[key] = _utf8(raw, f"uploaded file {value.filename!r}")
        elif isinstance(value, (bytes, bytearray)):
            out[key] = _utf8(bytes(value), f"form field {key!r}")
        else:
            out[key] = value
    return out


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", bool: "true/false", type(None): "null",
            int: "a number", float: "a number", str: "a string"}.get(type(value), "that")


def _string(fields: Mapping[str, Any], key: str, where: str = "") -> str | None:
    value = fields.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{where}{key!r} must be a string, not {_kind(value)}")
    return value


def _shown(value: object, limit: int = 60) -> str:
    """A value as an error message quotes it: a 5000-digit ``seed`` is not echoed whole."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _number(fields: Mapping[str, Any], key: str, lo: float, hi: float, where: str = "",
            integer: bool = False) -> float | None:
    value = fields.get(key)
    if value is None or value == "":
        return None
    kind = "a whole number" if integer else "a number"
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        if integer and isinstance(value, float) and not value.is_integer():
            raise ValueError  # int(1.5) would quietly be 1
        number = int(value) if integer else float(value)
    except (ValueError, OverflowError):  # OverflowError: float(10**400)
        raise ApiError(400, f"{where}{key!r} must be {kind} from {lo} to {hi}, "
                       f"not {_shown(value)}") from None
    if not lo <= number <= hi:
        raise ApiError(400, f"{where}{key!r} is {_shown(number)}; it must be from {lo} to {hi}")
    return number


def _bool(fields: Mapping[str, Any], key: str, where: str = "") -> bool:
    value = fields.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ApiError(400, f"{where}{key!r} must be true or false, not {_shown(value)}")


def _text_format(fields: Mapping[str, Any], text: str, where: str = "") -> TextFormat:
    """``format``: "text" (bracket tags work in it) or "ssml", which must parse (400 says
    where it doesn't)."""
    value = (_string(fields, "format", where) or "text").strip().lower()
    if value == "text":
        return "text"
    if value != "ssml":
        raise ApiError(400, f"{where}'format' must be one of {', '.join(TEXT_FORMATS)}, "
                       f"not {_shown(value)}")
    try:
        parse_ssml(text)
    except MarkupError as e:
        raise ApiError(400, f"{where}{e}") from None
    return "ssml"


def _speaker(fields: Mapping[str, Any], where: str = "") -> str | int | None:
    value = fields.get("speaker")
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        shown = repr(value) if isinstance(value, float) else _kind(value)  # not "a number"
        raise ApiError(400, f"{where}'speaker' must be a speaker name or a whole number (its "
                       f"index), not {shown}")
    return value


def _unique_filename(raw: str | None, index: int, taken: set[str]) -> str:
    """A safe ``NAME.wav`` for a ZIP entry: no directories, no odd characters, no repeats."""
    base = PurePosixPath((raw or "").replace("\\", "/")).name
    if base.lower().endswith(".wav"):
        base = base[:-4]
    stem = _UNSAFE_FILENAME.sub("_", base).strip("._-")[:80] or f"{index + 1:03d}"
    name, n = f"{stem}.wav", 2
    while name.lower() in taken:
        name, n = f"{stem}-{n}.wav", n + 1
    taken.add(name.lower())
    return name

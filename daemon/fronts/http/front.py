"""The HTTP front: the app, its routes and guard, the kiosk web page and Prometheus ``/metrics``.

Audio leaves as the engine makes it: ``/tts/stream`` sends each chunk the moment it is
encoded (a WAV: the header, then PCM), so ``curl -N ... | aplay`` starts speaking while the
rest of the text is still being synthesized. Everything a request can get wrong (token,
size, fields, voice, speaker, format, nothing to say) is found before the status line goes
out, because once audio has started the status can no longer say what went wrong. That
includes malformed SSML (``format: "ssml"``): it is parsed before synthesis and refused
with 400, line and column.

Every utterance is a job of the scheduler, as every front's is. HTTP's share is
``max_concurrent`` jobs: one more is refused with 429 and a ``Retry-After`` rather than left
waiting on a socket, so a burst cannot pile up unbounded work behind the speaker and every
other front. Any front's refusal (``RequestError``) is answered by its code
(``fields.STATUS``).

Connections are capped and timed (``connection.Connection``): at most ``max_connections``
open, idle ones closed after ``idle_timeout``, a request's headers and body each due within
their timeout (408 otherwise).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ...context import Context
from ...errors import RequestError
from ...settings import HttpSettings
from .. import is_loopback_host
from ..limits import Connections
from .batch import batch
from .connection import Connection
from .fields import ApiError
from .openai import openai_error, openai_speech
from .speech import SpeechApi

log = logging.getLogger("daemon.fronts.http")

WEB_DIR = Path(__file__).resolve().parent / "web"

_PUBLIC_PATHS = ("/", "/healthz")  # and /static/: no data there, and the page asks for the token


class HttpFront:
    name = "http"

    def __init__(self, settings: HttpSettings, ctx: Context) -> None:
        self.settings = settings
        self.ctx = ctx
        self.port: int | None = None  # the bound port, once started
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.speech = SpeechApi(settings, ctx)
        self.limits = Connections(self.name, settings.max_connections,
                                  "http.max_connections", ctx.metrics)

    # ------------------------------------------------------------------ lifecycle

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard],
                              client_max_size=self.settings.max_body_bytes)
        r = app.router
        r.add_post("/tts", self.speech.tts)
        r.add_post("/tts/stream", self.speech.tts_stream)
        r.add_post("/tts/batch", partial(batch, self.speech))
        r.add_post("/v1/audio/speech", partial(openai_speech, self.speech))
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
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        # The listening socket is ours rather than a web.TCPSite's, so that each connection
        # gets herald's handler (its cap and deadlines). keepalive_timeout is aiohttp's idle
        # timeout; lingering_time bounds how long a refused request's unread body is still
        # read (so its client sees the answer) before the connection closes.
        handler_args: dict[str, Any] = {
            "loop": loop, "access_log": None, "keepalive_timeout": s.idle_timeout,
            "lingering_time": 2.0}
        try:
            self._listener = await loop.create_server(
                lambda: Connection(server, s, self.limits, **handler_args), s.host, s.port)
        except OSError as e:
            await self._runner.cleanup()
            self._runner = None
            raise OSError(e.errno, f"cannot listen on {s.host}:{s.port} for HTTP ({e.strerror});"
                          " set http.host / http.port, or http.enabled = false") from e
        self.port = int(self._listener.sockets[0].getsockname()[1])
        log.info("HTTP API and web page on http://%s:%d/%s", s.host, self.port,
                 " (bearer token required)" if s.token else "")
        if s.token is None and not is_loopback_host(s.host):
            log.warning("HTTP is bound to %s without http.token: anyone who can reach this "
                        "port can make herald speak; set http.token", s.host)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()  # no new connections; the runner closes the open ones
            self._listener = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ guard

    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        """The cap, the token check, and one JSON error shape for every refusal, ours or
        aiohttp's."""
        conn = request.protocol
        if isinstance(conn, Connection):
            if not conn.admitted:
                return self._over_cap(request, conn)
            conn.serving(request)
        try:
            self._check_token(request)
            return await handler(request)
        except ApiError as e:
            return self._refuse(request, e)
        except RequestError as e:  # the checks and the jobs every front shares
            if request.writer.output_size > 0:  # status already sent: aiohttp drops the link
                log.warning("HTTP %s %s ended early: %s", request.method, request.path, e)
                raise
            return self._refuse(request, ApiError.of(e, self.settings.retry_after_seconds))
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
            return web.json_response(self._error_body(request, ApiError(
                500, "internal error; the herald log has details")), status=500)
        finally:
            if isinstance(conn, Connection):
                conn.served(request)

    def _over_cap(self, request: web.Request, conn: Connection) -> web.Response:
        """503 for a connection over ``max_connections``, which is then closed."""
        self.limits.refused(conn.peer)
        e = ApiError(503, f"too many connections: {self.limits.busy_text}",
                     headers={hdrs.RETRY_AFTER: str(self.settings.retry_after_seconds)})
        response = web.json_response(self._error_body(request, e), status=e.status,
                                     headers=e.headers)
        response.force_close()
        return response

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
        return web.json_response(self._error_body(request, e), status=e.status,
                                 headers=e.headers)

    @staticmethod
    def _error_body(request: web.Request, e: ApiError) -> dict[str, object]:
        """herald's error shape, or OpenAI's on its API (``/v1/``)."""
        return openai_error(e) if request.path.startswith("/v1/") else {"error": e.message}

    # ------------------------------------------------------------------ the rest

    async def _voices(self, request: web.Request) -> web.Response:
        if self.ctx.voices is not None:  # a voice added since is listed
            await self.ctx.voices.refresh()
        catalog = self.ctx.engine.catalog
        return web.json_response([i.summary(i.name == self.ctx.state.voice)
                                  for i in catalog.infos()])

    async def _healthz(self, request: web.Request) -> web.Response:
        """200 ``ok``, or 503 ``stalled`` with the problem while work in hand can't move."""
        problem = self.ctx.status.problem()
        body: dict[str, Any] = {
            "status": "ok" if problem is None else "stalled", "version": self.ctx.version,
            "active": self.ctx.scheduler.count(self.speech.name),
            "voices": [i.name for i in self.ctx.engine.catalog.infos()]}
        if problem is not None:
            body["problem"] = problem
        return web.json_response(body, status=200 if problem is None else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.ctx.metrics.registry),
                            headers={hdrs.CONTENT_TYPE: CONTENT_TYPE_LATEST})

    async def _index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(WEB_DIR / "index.html", headers={hdrs.CACHE_CONTROL: "no-cache"})

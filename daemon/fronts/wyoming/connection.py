"""Wyoming server: Home Assistant's text-to-speech protocol, over TCP or a Unix socket.

The transport is the ``wyoming`` library's own (``AsyncServer.from_uri``, its event framing and
event classes); this module is only the behaviour: what a connection may send, what it gets
back, and how one misbehaving client is kept from hurting the others.

Rules a reader should know before changing anything here:

* Each connection runs in its own task (the library's server makes one per client). Every
  write has a deadline (``write_timeout``), and the bytes that may wait for a slow client are
  bounded (asyncio's write buffer plus a fixed kernel send buffer), so a client that stops
  reading is dropped and its synthesis cancelled instead of growing memory or pinning a worker.
* Reading has deadlines too: an event's announced data and payload must arrive within
  ``read_timeout`` of its header line, and a connection may send nothing for at most
  ``idle_timeout`` (``stream_timeout`` inside an open text stream, whose text may come from a
  language model that pauses) while no request is being answered; while audio is being sent
  it is never idle. At most ``max_connections`` are served at once: one more is told ``busy``.
* An error ends the connection after the ``error`` event: Home Assistant ignores ``error``
  events and would otherwise wait for an ``audio-stop`` / ``synthesize-stopped`` that never
  comes. A vanished client just ends its connection; the server keeps serving everyone else.
* Audio goes out as the engine makes it (one ``audio-chunk`` per engine chunk), never a whole
  sentence at a time; a streamed text (``synthesize-start`` / ``-chunk`` / ``-stop``) is spoken
  sentence by sentence as each one completes, inside ONE ``audio-start`` ... ``audio-stop``.
  Its sentences are found by the planner a whole text goes through (``Engine.planner``), so
  streamed and whole text sound the same.
* ``text_format: ssml`` (on ``synthesize`` and ``synthesize-start``) is SSML; malformed SSML
  gets an ``error`` with code ``bad-markup`` and the line and column. A streamed SSML text
  can only be parsed whole, so it is spoken when ``synthesize-stop`` arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections import deque
from collections.abc import Awaitable
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from wyoming.error import Error
from wyoming.event import Event, async_read_event
from wyoming.info import (
    Describe,
    SelectProgram,
)
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from tts import (
    SynthesisOptions,
    UnknownVoice,
    VoiceError,
)
from tts.text import TextFormat

from ...errors import RequestError
from ...jobs.fields import check_ssml, check_text
from .output import AudioOut, StreamedText
from .protocol import (
    FRONT,
    PROGRAM,
    ClientGone,
    ClientStalled,
    ProtocolError,
    Refused,
    TimedOut,
    parse_event,
    refusal,
)

if TYPE_CHECKING:
    from .front import WyomingFront

log = logging.getLogger("herald.wyoming")

# asyncio's write buffer for one client; together with the kernel send buffer this is all the
# audio that can pile up behind a client that stops reading.
_TRANSPORT_HIGH_WATER = 64 * 1024
# Events read ahead while a request is answered; then reading waits for the answer too.
_PENDING = 16
# Events a TTS server never receives: a client sending them is talking to the wrong service.
_NOT_FOR_TTS = frozenset({
    "audio-start", "audio-chunk", "audio-stop", "transcribe", "transcript", "detect",
    "detection", "recognize", "intent", "not-recognized", "handled", "not-handled",
    "run-pipeline", "run-satellite", "pause-satellite",
})


class BoundedReader:
    """The connection's StreamReader, refusing an event that declares more data or payload
    than ``limit`` or does not send it within ``timeout``: the library would wait for and
    buffer whatever length a client declares, for as long as it takes."""

    def __init__(self, reader: asyncio.StreamReader, limit: int, timeout: float) -> None:
        self._reader = reader
        self._limit = limit
        self._timeout = timeout
        self.mid_event = False  # an event's header line is in, its data or payload not yet

    async def readline(self) -> bytes:
        line = await self._reader.readline()
        self.mid_event = bool(line)
        return line

    async def readexactly(self, n: int) -> bytes:
        if n > self._limit:
            raise ProtocolError("event-too-large", f"an event declared {n} bytes; the limit is "
                                 f"{self._limit} (wyoming.max_event_bytes)")
        try:
            async with asyncio.timeout(self._timeout):
                return await self._reader.readexactly(n)
        except TimeoutError:
            raise TimedOut("read", f"an event announced {n} bytes of data or payload that did "
                           f"not arrive within {self._timeout:g} s (wyoming.read_timeout); send "
                           "each event whole") from None

    def at_eof(self) -> bool:
        return self._reader.at_eof()


class Connection(AsyncEventHandler):
    """One client. ``handle_event`` is the protocol; ``run`` adds what the library's loop
    lacks: the allow-list, telling a client its event was malformed, and a bounded read."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 front: WyomingFront) -> None:
        super().__init__(reader, writer)
        self.front = front
        self.ctx = front.ctx
        self.settings = front.settings
        self.peer = peer_text(writer)
        self.stream: StreamedText | None = None
        self._job: asyncio.Task[None] | None = None  # answering a request; events wait
        self._closing = False
        self._active = asyncio.get_running_loop().time()  # an event last read or written

    # transport -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Read events while a request's audio is being sent, so a client that goes away is
        seen at once (its job stops within a chunk), not when its audio is next written.
        Events that arrive meanwhile wait their turn (at most ``_PENDING``, then reading
        waits too): a request is answered whole before the next event is handled."""
        task = asyncio.current_task()
        assert task is not None
        self.front.connections[task] = self
        self._is_running = True
        read: asyncio.Task[Event | None] | None = None
        admitted: bool | None = None
        try:
            if not self.front.allows(peer_address(self.writer)):
                log.warning("refused Wyoming connection from %s: not in wyoming.allow (%s)",
                            self.peer, self.front.allow_text)
                return
            admitted = self.front.limits.open()
            if not admitted:
                await self._refuse_busy()
                return
            self._bound_buffers()
            log.debug("%s connected", self.peer)
            reader = BoundedReader(self.reader, self.settings.max_event_bytes,
                                   self.settings.read_timeout)
            pending: deque[Event] = deque()
            while self._is_running and not self._closing:
                if read is None and len(pending) < _PENDING:
                    read = asyncio.create_task(self._read(reader))
                done, _ = await asyncio.wait(
                    [t for t in (read, self._job) if t is not None],
                    timeout=self._quiet_left(reader), return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    if self._quiet_left(reader) == 0:
                        if read is not None:
                            read.cancel()
                            read = None
                        await self.fail(self._idle())
                    continue
                if self._job is not None and self._job.done():
                    self._job = None  # it answered (or failed) the request itself
                if read is not None and read.done():
                    event, read = read.result(), None
                    if event is None:
                        break  # gone, or refused (and told so)
                    pending.append(event)
                while pending and self._job is None and not self._closing:
                    if not await self.handle_event(pending.popleft()):
                        break
        finally:
            for running in (read, self._job):
                if running is not None and not running.done():
                    running.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await running
            if self.stream is not None:
                await self.stream.cancel()
                self.stream = None
            self.front.connections.pop(task, None)
            if admitted is not None:
                self.front.limits.close(admitted)
            self.writer.close()
            log.debug("%s disconnected", self.peer)

    def _quiet_left(self, reader: BoundedReader) -> float | None:
        """Seconds this connection may still stay quiet; None while that is not in question:
        a request is being answered (its audio is being sent), or an event is half read
        (``read_timeout`` is in charge)."""
        if self._job is not None or reader.mid_event:
            return None
        limit = self.settings.stream_timeout if self.stream else self.settings.idle_timeout
        return max(0.0, self._active + limit - asyncio.get_running_loop().time())

    def _idle(self) -> TimedOut:
        if self.stream is not None:
            return TimedOut("idle", f"the text stream got nothing for "
                            f"{self.settings.stream_timeout:g} s (wyoming.stream_timeout); "
                            "end it with synthesize-stop")
        return TimedOut("idle", f"nothing was sent for {self.settings.idle_timeout:g} s "
                        "(wyoming.idle_timeout); connect again for the next request")

    async def _refuse_busy(self) -> None:
        """Tell a connection over the cap so, then close it once it has hung up (or after a
        moment): closing with its request unread would reset the connection, and the
        ``error`` could be lost with it."""
        self.front.limits.refused(self.peer)
        try:
            await self.send(Error(text=f"too many connections: "
                                  f"{self.front.limits.busy_text}", code="busy").event())
            if self.writer.can_write_eof():
                self.writer.write_eof()
            async with asyncio.timeout(min(self.settings.read_timeout, 2.0)):
                while await self.reader.read(65536):
                    pass
        except (ClientGone, ClientStalled, TimeoutError, ConnectionError):
            pass

    async def _read(self, reader: BoundedReader) -> Event | None:
        """The next event; None when the client has gone or sent what can't be read (it has
        been told why)."""
        try:
            event = await async_read_event(cast(asyncio.StreamReader, reader))
            reader.mid_event = False
            self._active = asyncio.get_running_loop().time()
        except (asyncio.IncompleteReadError, ConnectionError):
            return None  # gone in the middle of an event
        except Refused as e:
            await self.fail(e)
            return None
        except Exception as e:  # JSON that is not an event: framing can't be trusted
            await self.fail(ProtocolError("malformed-event", f"not a Wyoming event ({e!r}): "
                                          "expected one JSON object per line with a 'type'"))
            return None
        if event is None and not reader.at_eof():
            await self.fail(ProtocolError(
                "malformed-event", "could not parse an event: expected one JSON object per "
                "line (with a 'type'), then its data and payload bytes"))
        return event

    def _bound_buffers(self) -> None:
        self.writer.transport.set_write_buffer_limits(high=_TRANSPORT_HIGH_WATER)
        sock = self.writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.settings.send_buffer)

    async def send(self, event: Event) -> None:
        """Write one event, or raise ClientGone / ClientStalled: never wait forever."""
        try:
            async with asyncio.timeout(self.settings.write_timeout):
                await self.write_event(event)
            self._active = asyncio.get_running_loop().time()
        except TimeoutError:
            raise ClientStalled() from None
        except (ConnectionError, OSError) as e:
            raise ClientGone(str(e)) from None

    async def fail(self, exc: BaseException) -> None:
        """Tell the client what went wrong if it can still hear it, then end the connection."""
        if self._closing:
            return
        self._closing = True
        if isinstance(exc, ProtocolError):
            self.ctx.metrics.request(FRONT, "error")
        if isinstance(exc, ClientStalled):
            log.warning("%s stopped reading audio (nothing written for %.0f s); dropped it and "
                        "cancelled its synthesis", self.peer, self.settings.write_timeout)
            self.writer.transport.abort()
            return
        if isinstance(exc, ClientGone):
            log.info("%s went away mid-stream (%s)", self.peer, exc)
            self.writer.transport.abort()
            return
        if isinstance(exc, TimedOut):
            self.front.limits.closed_for(exc.reason, self.peer, exc.text)
            error = Error(text=exc.text, code=exc.code)
        elif isinstance(exc, Refused):
            log.warning("%s: %s [%s]", self.peer, exc.text, exc.code)
            error = Error(text=exc.text, code=exc.code)
        else:
            log.error("synthesis for %s failed", self.peer, exc_info=exc)
            error = Error(text=f"synthesis failed: {exc!r}; the herald log has details",
                          code="synthesis-failed")
        try:
            await self.send(error.event())
        except (ClientGone, ClientStalled):
            self.writer.transport.abort()
            return
        self.writer.close()
        self.reader.feed_eof()

    # protocol --------------------------------------------------------------------------------

    async def handle_event(self, event: Event) -> bool:
        try:
            await self._dispatch(event)
        except Exception as e:
            await self.fail(e)
            return False
        return not self._closing

    async def _dispatch(self, event: Event) -> None:
        kind = event.type
        if Describe.is_type(kind):
            if self.front.ctx.voices is not None:  # a voice added since is listed
                await self.front.ctx.voices.refresh()
            await self.send(self.front.info().event())
        elif Synthesize.is_type(kind):
            if self.stream is not None:
                # Home Assistant sends the whole text as a plain synthesize inside a stream,
                # for servers that cannot stream: the protocol says to ignore it here.
                log.debug("%s: synthesize inside a text stream ignored", self.peer)
            else:
                await self._synthesize(event)
        elif SynthesizeStart.is_type(kind):
            await self._stream_start(event)
        elif SynthesizeChunk.is_type(kind):
            stream = self._open_stream(kind)
            with stream.out.accounting():
                stream.add(parse_event(SynthesizeChunk, event).text)
        elif SynthesizeStop.is_type(kind):
            stream = self._open_stream(kind)
            self.stream = None
            self._job = asyncio.create_task(self._answer(stream.out, stream.finish()),
                                            name=f"wyoming stop {stream.out.id}")
        elif Ping.is_type(kind):
            await self.send(Pong(text=parse_event(Ping, event).text).event())
        elif SelectProgram.is_type(kind):
            name = parse_event(SelectProgram, event).name
            if name != PROGRAM:
                raise ProtocolError("unknown-program", f"no program {name!r} here; this "
                                     f"server has one TTS program, {PROGRAM!r}")
        elif kind in _NOT_FOR_TTS:
            raise ProtocolError("unexpected-event", f"{kind!r} is not for a text-to-speech "
                                 "server; herald answers describe, synthesize and "
                                 "synthesize-start/-chunk/-stop")
        else:
            # The protocol asks servers to drop events they do not know (newer clients).
            log.info("%s sent an event herald does not know, ignored: %r", self.peer, kind)

    def _open_stream(self, kind: str) -> StreamedText:
        if self.stream is None:
            raise ProtocolError("unexpected-event", f"{kind} without synthesize-start: open a "
                                 "text stream with synthesize-start first")
        return self.stream

    async def _synthesize(self, event: Event) -> None:
        out = AudioOut(self)
        with out.accounting():
            request = parse_event(Synthesize, event)
            out.text_format = self._text_format(request.text_format)
            text = request.text.strip()
            try:
                check_text(text, self.settings.max_text, "wyoming.max_text",
                           hint="split it, or stream it with synthesize-start/-chunk/-stop")
            except RequestError as e:
                raise refusal(e) from None
            if out.text_format == "ssml":
                try:
                    check_ssml(text)
                except RequestError as e:
                    raise refusal(e) from None
            out.set_voice(*self._voice(request.voice))
            out.submit(text)
        self._job = asyncio.create_task(self._answer(out, self._whole(out)),
                                        name=f"wyoming synthesize {out.id}")

    @staticmethod
    async def _whole(out: AudioOut) -> bool:
        await out.send()
        await out.finish()
        out.close("ok")
        return True

    async def _answer(self, out: AudioOut, answer: Awaitable[bool]) -> None:
        """Send a request's answer while the connection reads on; a failure is told to the
        client (if it is still there) and ends the connection."""
        try:
            with out.accounting():
                if not await answer:
                    self._closing = True
        except asyncio.CancelledError:
            raise
        except Exception as e:
            await self.fail(e)

    async def _stream_start(self, event: Event) -> None:
        if self.stream is not None:
            raise ProtocolError("unexpected-event", "synthesize-start while a text stream is "
                                 "open: end it with synthesize-stop first")
        out = AudioOut(self)
        with out.accounting():
            start = parse_event(SynthesizeStart, event)
            out.text_format = self._text_format(start.text_format)
            out.set_voice(*self._voice(start.voice))
            self.stream = StreamedText(self, out)

    def _voice(self, wanted: SynthesizeVoice | None) -> tuple[str, SynthesisOptions]:
        options = self.front.options
        if wanted is None:
            wanted = SynthesizeVoice()
        try:
            voice = self.ctx.engine.resolve_voice(wanted.name, wanted.language,
                                                  default=self.ctx.state.voice)
        except UnknownVoice as e:
            raise Refused("unknown-voice", str(e)) from None
        if wanted.speaker not in (None, ""):
            options = replace(options, speaker=wanted.speaker)
        try:  # before any audio-start, as the other fronts check it before queueing
            self.ctx.engine.check_speaker(voice, options.speaker)
        except VoiceError as e:
            raise Refused("bad-voice", str(e)) from None
        return voice, options

    @staticmethod
    def _text_format(text_format: object) -> TextFormat:
        if text_format in (None, "text"):
            return "text"
        if text_format == "ssml":  # the library's SynthesizeTextFormat.SSML is a str
            return "ssml"
        raise Refused("text-format-not-supported", f"text_format {text_format!r} is not "
                       "supported: send plain text (bracket tags work in it) or \"ssml\"")


# --- the front --------------------------------------------------------------------------------


def peer_address(writer: asyncio.StreamWriter
                  ) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    peer = writer.get_extra_info("peername")
    if not isinstance(peer, tuple) or not peer:
        return None
    address = ipaddress.ip_address(str(peer[0]).split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack socket reports IPv4 clients like this
    return address


def peer_text(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"Wyoming client {peer[0]}:{peer[1]}"
    return "Wyoming client (unix socket)"


"""Wyoming server: Home Assistant's text-to-speech protocol, over TCP or a Unix socket.

The transport is the ``wyoming`` library's own (``AsyncServer.from_uri``, its event framing and
event classes); this module is only the behaviour: what a connection may send, what it gets
back, and how one misbehaving client is kept from hurting the others.

Rules a reader should know before changing anything here:

* Each connection runs in its own task (the library's server makes one per client). Every
  write has a deadline (``write_timeout``), and the bytes that may wait for a slow client are
  bounded (asyncio's write buffer plus a fixed kernel send buffer), so a client that stops
  reading is dropped and its synthesis cancelled instead of growing memory or pinning a worker.
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
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncGenerator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlparse

from pydantic import BaseModel, Field, field_validator
from wyoming.audio import AudioChunk as WyomingAudioChunk
from wyoming.audio import AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, Eventable, async_read_event
from wyoming.info import (
    Attribution,
    Describe,
    Info,
    SelectProgram,
    TtsProgram,
    TtsVoice,
    TtsVoiceSpeaker,
)
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler, AsyncServer
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from tts import (
    AudioChunk,
    AudioFormat,
    SynthesisOptions,
    UnknownVoice,
    VoiceError,
    VoiceInfo,
    to_pcm16,
)
from tts.compose import Planner, Step
from tts.text import MarkupError, TextFormat, parse_ssml

from ..context import Context
from ..logcontext import current_request
from ..metrics import LatencyRecord, Timeline
from ..request import (
    EmptyText,
    Request,
    RequestError,
    TextStream,
    TextTooLong,
    check_text,
    check_unicode,
    refuse_control,
)
from . import is_loopback_host

if TYPE_CHECKING:
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

log = logging.getLogger("herald.wyoming")

PROGRAM = "herald"
FRONT = "wyoming"
_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
# asyncio's write buffer for one client; together with the kernel send buffer this is all the
# audio that can pile up behind a client that stops reading.
_TRANSPORT_HIGH_WATER = 64 * 1024
# Events a TTS server never receives: a client sending them is talking to the wrong service.
_NOT_FOR_TTS = frozenset({
    "audio-start", "audio-chunk", "audio-stop", "transcribe", "transcript", "detect",
    "detection", "recognize", "intent", "not-recognized", "handled", "not-handled",
    "run-pipeline", "run-satellite", "pause-satellite",
})


class WyomingSettings(BaseModel):
    enabled: bool = True
    uri: str = "tcp://127.0.0.1:10200"  # tcp://HOST:PORT, or unix:///PATH
    # Client networks allowed to connect (CIDR or single address). Empty: loopback only, so
    # binding to 0.0.0.0 never exposes the server before someone says who may use it.
    allow: list[str] = Field(default_factory=list)
    zeroconf: bool = False  # announce _wyoming._tcp for Home Assistant (needs `zeroconf`)
    zeroconf_name: str | None = None  # default: herald-<hostname>
    # A client that cannot take one event for this long is dropped (its synthesis cancelled).
    write_timeout: float = Field(30.0, gt=0)
    # Kernel send buffer per client (bytes); bounds the audio queued for a slow client.
    send_buffer: int = Field(128 * 1024, ge=4096)
    max_text: int = Field(20_000, gt=0)  # characters per request or per text stream
    max_event_bytes: int = Field(1_000_000, gt=0)  # declared data + payload of one event
    also_play: bool = False  # also speak every request on the local speaker (its queue)

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, uri: str) -> str:
        parsed = urlparse(uri)
        if parsed.scheme == "tcp":
            try:
                port = parsed.port
            except ValueError:
                port = None
            if not parsed.hostname or port is None:
                raise ValueError("expected tcp://HOST:PORT, e.g. tcp://0.0.0.0:10200")
        elif parsed.scheme == "unix":
            if not parsed.path:
                raise ValueError("expected unix:///PATH/TO/SOCKET")
        else:
            raise ValueError("expected tcp://HOST:PORT or unix:///PATH")
        return uri

    @field_validator("allow")
    @classmethod
    def _check_allow(cls, allow: list[str]) -> list[str]:
        for entry in allow:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not a network; expected CIDR like "
                                 "192.168.1.0/24 or a single address") from None
        return allow


class WyomingError(Exception):
    """The Wyoming front could not start (address in use, bad socket path, ...)."""


# --- failures ---------------------------------------------------------------------------------


class _Refused(Exception):
    """A request or event the client gets an ``error`` event for."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class _ProtocolError(_Refused):
    """Refused outside any request (malformed or out-of-place events): counted on its own."""


class _ClientGone(Exception):
    """The client closed or reset the connection while we were writing to it."""


class _ClientStalled(Exception):
    """The client stopped reading: one event could not be written within write_timeout."""


E = TypeVar("E", bound=Eventable)


def _parse(kind: type[E], event: Event) -> E:
    """The library's event class from an event, or a clear refusal if its data is wrong."""
    try:
        parsed = cast(E, kind.from_event(event))
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise _Refused("bad-request", f"{event.type} event has bad data ({e!r}); "
                       "see the Wyoming protocol for its fields") from None
    for attr in ("text",):
        if hasattr(parsed, attr) and not isinstance(getattr(parsed, attr), str):
            raise _Refused("bad-request", f"{event.type}.data.{attr} must be a string")
        if hasattr(parsed, attr):
            try:
                check_unicode(getattr(parsed, attr), f"{event.type}.data.{attr}")
            except RequestError as e:
                raise _Refused("bad-request", str(e)) from None
    wanted = event.data.get("voice") or {}
    # The library reads a voice that is not an object as no voice, and drops a speaker that
    # comes without a voice name: the default would speak instead, without a word.
    if not isinstance(wanted, dict):
        raise _Refused("bad-request", f"{event.type}.data.voice must be an object like "
                       '{"name": "en_US-joe-medium"} or {"language": "en"}')
    if wanted.get("speaker") not in (None, "") and not wanted.get("name"):
        raise _Refused("bad-request", f"{event.type}.data.voice.speaker needs voice.name: "
                       "name the voice the speaker belongs to")
    voice = getattr(parsed, "voice", None)
    if voice is not None:
        for attr, types, what in (("name", str, "a string"), ("language", str, "a string"),
                                  ("speaker", (str, int), "a speaker name or number")):
            value = getattr(voice, attr)
            if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
                raise _Refused("bad-request", f"{event.type}.data.voice.{attr} must be {what}")
    return parsed


# --- one audio stream to one client -----------------------------------------------------------


class _AudioOut:
    """One ``audio-start`` ... ``audio-stop`` to the client, and the latency record it makes.

    It is created the moment a request arrives, so every request is counted exactly once —
    finished, stopped (client gone) or refused — whatever point it fails at.
    """

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.id = uuid.uuid4().hex[:8]
        self.timeline = Timeline()
        self.voice = "?"
        self.options = conn.front.options
        self.text_format: TextFormat = "text"
        self.fmt: AudioFormat | None = None
        self.samples = 0
        self._started = False
        self._closed = False
        conn.ctx.status.begin(self.id, FRONT)  # speaking, until close()
        # The connection's log lines are about this request from now on (its refusal, which
        # fail() logs after the request's code has returned, included), and so are those of
        # the tasks it starts (a text stream's speaker).
        current_request.set(self.id)

    def set_voice(self, voice: str, options: SynthesisOptions) -> None:
        self.voice = voice
        self.options = options
        self.fmt = self.conn.ctx.engine.audio_format(voice)

    async def speak(self, chunks: AsyncGenerator[AudioChunk, None]) -> None:
        """Send each of the engine's chunks the moment it exists."""
        if self.timeline.started is None:
            self.timeline.started = time.monotonic()
        try:
            async for chunk in chunks:
                await self._send_chunk(chunk)
        except MarkupError as e:  # a streamed SSML text, checked only once it is complete
            raise _Refused("bad-markup", str(e)) from None
        except UnknownVoice as e:  # removed since it was resolved: a race with a reload
            raise _Refused("unknown-voice", str(e)) from None
        except VoiceError as e:  # e.g. a speaker the voice does not have
            raise _Refused("bad-voice", str(e)) from None
        finally:
            await chunks.aclose()  # stops the worker now, not when the generator is collected
        self.timeline.synth_done = time.monotonic()

    async def _send_chunk(self, chunk: AudioChunk) -> None:
        assert self.fmt is not None
        if not self._started:
            await self._start()
        if self.timeline.first_audio is None:
            self.timeline.first_audio = time.monotonic()
        await self.conn.send(WyomingAudioChunk(
            rate=self.fmt.rate, width=self.fmt.width, channels=self.fmt.channels,
            audio=to_pcm16(chunk.samples), timestamp=self._ms()).event())
        self.samples += len(chunk.samples)

    async def _start(self) -> None:
        assert self.fmt is not None
        self._started = True
        await self.conn.send(AudioStart(rate=self.fmt.rate, width=self.fmt.width,
                                        channels=self.fmt.channels, timestamp=0).event())

    async def finish(self) -> None:
        """``audio-stop`` (after an ``audio-start`` even when the text made no sound, so the
        client always gets a well-formed, possibly empty, audio stream)."""
        if not self._started:
            await self._start()
        await self.conn.send(AudioStop(timestamp=self._ms()).event())

    def _ms(self) -> int:
        return round(self.samples * 1000 / self.fmt.rate) if self.fmt else 0

    def close(self, outcome: str) -> None:
        """Count this request once: a latency record if it made audio, else a bare outcome."""
        if self._closed:
            return
        self._closed = True
        metrics = self.conn.ctx.metrics
        if self.samples or (outcome == "ok" and self.fmt is not None):
            seconds = self.samples / self.fmt.rate if self.fmt else 0.0
            metrics.record(LatencyRecord.from_timeline(self.id, FRONT, FRONT, self.voice,
                                                       self.timeline, seconds, outcome=outcome))
        else:
            metrics.request(FRONT, outcome)
        self.conn.ctx.status.end(self.id)

    @contextlib.contextmanager
    def accounting(self) -> Iterator[None]:
        """Close with the right outcome if whatever runs inside fails."""
        try:
            yield
        except (_ClientGone, _ClientStalled, asyncio.CancelledError):
            self.close("stopped")
            raise
        except BaseException:
            self.close("error")
            raise


class _TextStream:
    """A ``synthesize-start`` ... ``synthesize-stop`` session: text in pieces, one audio stream.

    Events are read while a separate task speaks, so a sentence is synthesized while the
    client is still sending the next ones.
    """

    def __init__(self, conn: _Connection, out: _AudioOut,
                 local: TextStream | None = None) -> None:
        self.conn = conn
        self.out = out
        self.local = local  # the speaker's copy of the text
        self.text = TextStream()
        self.has_text = False  # anything but white space arrived
        self.begun = False  # the first sentence is planned: latency counts from here
        self.failed = False
        self._task = asyncio.create_task(self._speak(), name=f"wyoming speak {out.id}")

    def add(self, piece: str) -> None:
        limit = self.conn.settings.max_text
        if self.text.total_chars + len(piece) > limit:
            raise _Refused("text-too-long", f"streamed text passed {limit} characters "
                           "(wyoming.max_text); send long texts as several streams")
        try:
            refuse_control(piece)
        except RequestError as e:
            raise _Refused("bad-text", str(e)) from None
        self.has_text = self.has_text or bool(piece.strip())
        self.text.feed(piece)
        self._feed_local(piece)

    def _feed_local(self, piece: str, final: bool = False) -> None:
        if self.local is None:
            return
        try:
            self.local.feed(piece, final=final)
        except ValueError:  # RequestError: the scheduler ended it (stopped, cut): let it go
            self.local = None

    async def finish(self) -> bool:
        """Speak what is left, end the audio, ``synthesize-stopped``. False if it failed (the
        failure has been reported and the connection is closing)."""
        self.text.feed("", final=True)
        self._feed_local("", final=True)
        await self._task
        if self.failed:
            return False
        if not self.has_text:
            raise _Refused("empty-text", "the streamed text was empty: send the words to speak "
                           "in synthesize-chunk events before synthesize-stop")
        await self.out.finish()
        self.out.close("ok")
        await self.conn.send(SynthesizeStopped().event())
        return True

    def _end_local(self, why: str) -> None:
        if self.local is not None:
            self.local.fail(RequestError(why))
            self.local = None

    async def cancel(self) -> None:
        self._end_local("the Wyoming client went away")
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.out.close("stopped")

    async def _speak(self) -> None:
        try:
            with self.out.accounting():
                out, engine = self.out, self.conn.ctx.engine
                planner = engine.planner(out.voice, out.options, out.text_format)
                await out.speak(engine.stream_steps(self._sentences(planner), out.voice,
                                                    out.options))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.failed = True
            self._end_local(f"the Wyoming request failed: {e}")
            await self.conn.fail(e)

    async def _sentences(self, planner: Planner) -> AsyncGenerator[list[Step], None]:
        async with contextlib.aclosing(self.text.steps(planner)) as batches:
            async for steps in batches:
                if not self.begun:
                    # Latency is measured from the moment herald had something to say, not
                    # from synthesize-start: the time a language model takes to write is
                    # not ours.
                    self.begun = True
                    now = time.monotonic()
                    self.out.timeline = Timeline(received=now, started=now)
                yield steps


# --- one connection ---------------------------------------------------------------------------


class _BoundedReader:
    """The connection's StreamReader, refusing an event that declares more data or payload
    than ``limit``: the library would wait for and buffer whatever length a client declares."""

    def __init__(self, reader: asyncio.StreamReader, limit: int) -> None:
        self._reader = reader
        self._limit = limit

    async def readline(self) -> bytes:
        return await self._reader.readline()

    async def readexactly(self, n: int) -> bytes:
        if n > self._limit:
            raise _ProtocolError("event-too-large", f"an event declared {n} bytes; the limit is "
                                 f"{self._limit} (wyoming.max_event_bytes)")
        return await self._reader.readexactly(n)

    def at_eof(self) -> bool:
        return self._reader.at_eof()


class _Connection(AsyncEventHandler):
    """One client. ``handle_event`` is the protocol; ``run`` adds what the library's loop
    lacks: the allow-list, telling a client its event was malformed, and a bounded read."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 front: WyomingFront) -> None:
        super().__init__(reader, writer)
        self.front = front
        self.ctx = front.ctx
        self.settings = front.settings
        self.peer = _peer_text(writer)
        self.stream: _TextStream | None = None
        self._closing = False

    # transport -------------------------------------------------------------------------------

    async def run(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.front.connections[task] = self
        self._is_running = True
        try:
            if not self.front.allows(_peer_address(self.writer)):
                log.warning("refused Wyoming connection from %s: not in wyoming.allow (%s)",
                            self.peer, self.front.allow_text)
                return
            self._bound_buffers()
            log.debug("%s connected", self.peer)
            reader = _BoundedReader(self.reader, self.settings.max_event_bytes)
            while self._is_running and not self._closing:
                try:
                    event = await async_read_event(cast(asyncio.StreamReader, reader))
                except (asyncio.IncompleteReadError, ConnectionError):
                    break  # gone in the middle of an event
                except _Refused as e:
                    await self.fail(e)
                    break
                except Exception as e:  # JSON that is not an event: framing can't be trusted
                    await self.fail(_ProtocolError("malformed-event", f"not a Wyoming event "
                                                   f"({e!r}): expected one JSON object per line "
                                                   "with a 'type'"))
                    break
                if event is None:
                    if not reader.at_eof():
                        await self.fail(_ProtocolError(
                            "malformed-event", "could not parse an event: expected one JSON "
                            "object per line (with a 'type'), then its data and payload bytes"))
                    break
                if self._closing or not await self.handle_event(event):
                    break
        finally:
            if self.stream is not None:
                await self.stream.cancel()
                self.stream = None
            self.front.connections.pop(task, None)
            self.writer.close()
            log.debug("%s disconnected", self.peer)

    def _bound_buffers(self) -> None:
        self.writer.transport.set_write_buffer_limits(high=_TRANSPORT_HIGH_WATER)
        sock = self.writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.settings.send_buffer)

    async def send(self, event: Event) -> None:
        """Write one event, or raise _ClientGone / _ClientStalled: never wait forever."""
        try:
            await asyncio.wait_for(self.write_event(event), self.settings.write_timeout)
        except TimeoutError:
            raise _ClientStalled() from None
        except (ConnectionError, OSError) as e:
            raise _ClientGone(str(e)) from None

    async def fail(self, exc: BaseException) -> None:
        """Tell the client what went wrong if it can still hear it, then end the connection."""
        if self._closing:
            return
        self._closing = True
        if isinstance(exc, _ProtocolError):
            self.ctx.metrics.request(FRONT, "error")
        if isinstance(exc, _ClientStalled):
            log.warning("%s stopped reading audio (nothing written for %.0f s); dropped it and "
                        "cancelled its synthesis", self.peer, self.settings.write_timeout)
            self.writer.transport.abort()
            return
        if isinstance(exc, _ClientGone):
            log.info("%s went away mid-stream (%s)", self.peer, exc)
            self.writer.transport.abort()
            return
        if isinstance(exc, _Refused):
            log.warning("%s: %s [%s]", self.peer, exc.text, exc.code)
            error = Error(text=exc.text, code=exc.code)
        else:
            log.error("synthesis for %s failed", self.peer, exc_info=exc)
            error = Error(text=f"synthesis failed: {exc!r}; the herald log has details",
                          code="synthesis-failed")
        try:
            await self.send(error.event())
        except (_ClientGone, _ClientStalled):
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
                stream.add(_parse(SynthesizeChunk, event).text)
        elif SynthesizeStop.is_type(kind):
            stream = self._open_stream(kind)
            with stream.out.accounting():
                finished = await stream.finish()
            self.stream = None
            if not finished:
                self._closing = True
        elif Ping.is_type(kind):
            await self.send(Pong(text=_parse(Ping, event).text).event())
        elif SelectProgram.is_type(kind):
            name = _parse(SelectProgram, event).name
            if name != PROGRAM:
                raise _ProtocolError("unknown-program", f"no program {name!r} here; this "
                                     f"server has one TTS program, {PROGRAM!r}")
        elif kind in _NOT_FOR_TTS:
            raise _ProtocolError("unexpected-event", f"{kind!r} is not for a text-to-speech "
                                 "server; herald answers describe, synthesize and "
                                 "synthesize-start/-chunk/-stop")
        else:
            # The protocol asks servers to drop events they do not know (newer clients).
            log.info("%s sent an event herald does not know, ignored: %r", self.peer, kind)

    def _open_stream(self, kind: str) -> _TextStream:
        if self.stream is None:
            raise _ProtocolError("unexpected-event", f"{kind} without synthesize-start: open a "
                                 "text stream with synthesize-start first")
        return self.stream

    async def _synthesize(self, event: Event) -> None:
        out = _AudioOut(self)
        with out.accounting():
            request = _parse(Synthesize, event)
            out.text_format = self._text_format(request.text_format)
            text = request.text.strip()
            try:
                check_text(text, self.settings.max_text, "wyoming.max_text",
                           hint="split it, or stream it with synthesize-start/-chunk/-stop")
            except TextTooLong as e:
                raise _Refused("text-too-long", str(e)) from None
            except EmptyText as e:
                raise _Refused("empty-text", str(e)) from None
            except RequestError as e:
                raise _Refused("bad-text", str(e)) from None
            if out.text_format == "ssml":
                try:
                    parse_ssml(text)
                except MarkupError as e:
                    raise _Refused("bad-markup", str(e)) from None
            out.set_voice(*self._voice(request.voice))
            self._play_locally(out, text)
            await out.speak(self.ctx.engine.stream(text, out.voice, out.options,
                                                   out.text_format))
            await out.finish()
        out.close("ok")

    async def _stream_start(self, event: Event) -> None:
        if self.stream is not None:
            raise _ProtocolError("unexpected-event", "synthesize-start while a text stream is "
                                 "open: end it with synthesize-stop first")
        out = _AudioOut(self)
        with out.accounting():
            start = _parse(SynthesizeStart, event)
            out.text_format = self._text_format(start.text_format)
            out.set_voice(*self._voice(start.voice))
            self.stream = _TextStream(self, out, self._play_locally(out, "", streamed=True))

    def _voice(self, wanted: SynthesizeVoice | None) -> tuple[str, SynthesisOptions]:
        options = self.front.options
        if wanted is None:
            wanted = SynthesizeVoice()
        try:
            voice = self.ctx.engine.resolve_voice(wanted.name, wanted.language,
                                                  default=self.ctx.state.voice)
        except UnknownVoice as e:
            raise _Refused("unknown-voice", str(e)) from None
        if wanted.speaker not in (None, ""):
            options = replace(options, speaker=wanted.speaker)
        try:  # before any audio-start, as the other fronts check it before queueing
            self.ctx.engine.check_speaker(voice, options.speaker)
        except VoiceError as e:
            raise _Refused("bad-voice", str(e)) from None
        return voice, options

    def _play_locally(self, out: _AudioOut, text: str,
                      streamed: bool = False) -> TextStream | None:
        """wyoming.also_play: queue the same text for the local speaker. It is synthesized
        again by the scheduler, in the speaker's queue, so neither side waits for the other;
        a refusal there (speaker off, queue full) is logged and the Wyoming client still gets
        its audio. Returns the speaker's TextStream for a streamed text."""
        scheduler = self.ctx.scheduler
        if not self.settings.also_play or scheduler is None:
            return None
        local = TextStream() if streamed else None
        request = Request(text=text, id=out.id, voice=out.voice, speaker=out.options.speaker,
                          sinks=("speaker",), front=FRONT, stream=local,
                          text_format=out.text_format)
        try:
            scheduler.submit(request)
        except RequestError as e:
            log.warning("%s: request %s not played on the speaker: %s", self.peer, out.id, e)
            return None
        return local

    @staticmethod
    def _text_format(text_format: object) -> TextFormat:
        if text_format in (None, "text"):
            return "text"
        if text_format == "ssml":  # the library's SynthesizeTextFormat.SSML is a str
            return "ssml"
        raise _Refused("text-format-not-supported", f"text_format {text_format!r} is not "
                       "supported: send plain text (bracket tags work in it) or \"ssml\"")


# --- the front --------------------------------------------------------------------------------


class WyomingFront:
    """The Wyoming server as one of herald's fronts: ``start()`` listens, ``stop()`` closes
    every connection (cancelling their syntheses) and withdraws the zeroconf announcement."""

    name = FRONT

    def __init__(self, settings: WyomingSettings, ctx: Context,
                 options: SynthesisOptions | None = None) -> None:
        self.settings = settings
        self.ctx = ctx
        # Synthesis defaults: given, else the configured [synthesis] section.
        self.options = options if options is not None else ctx.synthesis
        self.connections: dict[asyncio.Task[Any], _Connection] = {}
        self._server: AsyncServer | None = None
        self._networks = [ipaddress.ip_network(a.strip(), strict=False)
                          for a in settings.allow] or list(_LOOPBACK)
        self.allow_text = ", ".join(settings.allow) or "loopback only"
        self._info: Info | None = None
        self._zeroconf: _Announcement | None = None

    def allows(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        if address is None:  # a Unix socket: the file's permissions decide
            return True
        return any(address.version == n.version and address in n for n in self._networks)

    def info(self) -> Info:
        if self._info is None:
            self._info = _describe(self.ctx, {})
        return self._info

    async def refresh_info(self) -> None:
        """Describe the installed voices again (one was added or removed)."""
        versions = await asyncio.to_thread(_voice_versions, self.ctx.engine.catalog.infos())
        self._info = _describe(self.ctx, versions)

    async def start(self) -> None:
        await self.refresh_info()
        server = AsyncServer.from_uri(self.settings.uri)
        try:
            await server.start(lambda r, w: _Connection(r, w, self))
        except OSError as e:
            raise WyomingError(f"cannot listen on {self.settings.uri}: {e.strerror or e}; is "
                               "another Wyoming server using it? Set wyoming.uri to a free "
                               "address") from None
        self._server = server
        host = urlparse(self.settings.uri).hostname or ""
        log.info("Wyoming server listening on %s (%d voices), clients: %s", self.settings.uri,
                 len(self.info().tts[0].voices), self.allow_text)
        if host and not self.settings.allow and not is_loopback_host(host):
            log.warning("Wyoming is bound to %s but wyoming.allow is empty, so only loopback "
                        "clients are accepted: set wyoming.allow to Home Assistant's network, "
                        "e.g. [\"192.168.1.0/24\"]", host)
        if self.settings.also_play and self.ctx.scheduler is None:
            log.warning("wyoming.also_play is set but herald has no speaker queue (is the "
                        "speaker enabled?); audio goes to the Wyoming client only")
        if self.settings.zeroconf:
            self._zeroconf = await _Announcement.start(self.settings)

    async def stop(self) -> None:
        if self._zeroconf is not None:
            await self._zeroconf.stop()
            self._zeroconf = None
        if self._server is not None:
            await self._server.stop()  # closes every connection; their tasks end on EOF
            self._server = None
        tasks = list(self.connections)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=2.0)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2.0)
        log.info("Wyoming server stopped")


def _describe(ctx: Context, versions: dict[str, str]) -> Info:
    piper = Attribution(name="rhasspy (Piper voices)", url="https://github.com/rhasspy/piper")
    voices = []
    for v in ctx.engine.catalog.infos():
        c = v.config
        speakers = v.speakers or ([str(i) for i in range(c.num_speakers)]
                                  if c.num_speakers > 1 else [])
        voices.append(TtsVoice(
            name=v.name, description=f"{v.name} ({c.language}, {c.quality}, {c.sample_rate} Hz)",
            attribution=piper, installed=True, version=versions.get(v.name),
            languages=[c.language],
            speakers=[TtsVoiceSpeaker(name=s) for s in speakers] or None))
    program = TtsProgram(
        name=PROGRAM, description="herald: streaming text-to-speech, Piper voices on PyTorch",
        attribution=Attribution(name="herald", url=""),
        installed=True, version=ctx.version, voices=voices, supports_synthesize_streaming=True)
    return Info(tts=[program])


def _voice_versions(infos: list[VoiceInfo]) -> dict[str, str]:
    """The Piper version each voice was exported with (its config says; the catalog doesn't)."""
    versions = {}
    for info in infos:
        try:
            version = json.loads(info.config_path.read_text(encoding="utf-8")).get(
                "piper_version")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(version, str):
            versions[info.name] = version
    return versions


def _peer_address(writer: asyncio.StreamWriter
                  ) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    peer = writer.get_extra_info("peername")
    if not isinstance(peer, tuple) or not peer:
        return None
    address = ipaddress.ip_address(str(peer[0]).split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack socket reports IPv4 clients like this
    return address


def _peer_text(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"Wyoming client {peer[0]}:{peer[1]}"
    return "Wyoming client (unix socket)"


class _Announcement:
    """``_wyoming._tcp`` over mDNS, so Home Assistant discovers the server by itself."""

    def __init__(self, zc: AsyncZeroconf, info: AsyncServiceInfo) -> None:
        self._zc = zc
        self._info = info

    @classmethod
    async def start(cls, settings: WyomingSettings) -> _Announcement | None:
        try:
            from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf
        except ImportError:
            log.warning("wyoming.zeroconf is on but the `zeroconf` package is not installed "
                        "(pip install zeroconf); Home Assistant must be pointed at herald by "
                        "hand")
            return None
        uri = urlparse(settings.uri)
        if uri.scheme != "tcp" or uri.port is None or is_loopback_host(uri.hostname or ""):
            log.warning("zeroconf announcement skipped: %s is not reachable from other "
                        "machines; bind wyoming.uri to 0.0.0.0 or a LAN address", settings.uri)
            return None
        address = uri.hostname or ""
        if address in ("0.0.0.0", "::"):
            address = _primary_address()
        hostname = socket.gethostname().split(".")[0] or "herald"
        name = settings.zeroconf_name or f"herald-{hostname}"
        info = AsyncServiceInfo(
            "_wyoming._tcp.local.", f"{name}._wyoming._tcp.local.",
            addresses=[ipaddress.ip_address(address).packed], port=uri.port,
            server=f"{hostname}.local.")
        zc = AsyncZeroconf()
        try:
            await zc.async_register_service(info, allow_name_change=True)
        except Exception as e:
            log.warning("zeroconf announcement failed (%s); Home Assistant must be pointed at "
                        "herald by hand", e)
            await zc.async_close()
            return None
        log.info("announced %s on %s:%d over zeroconf", info.name, address, uri.port)
        return cls(zc, info)

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self._zc.async_unregister_service(self._info)
        await self._zc.async_close()


def _primary_address() -> str:
    """The address other machines reach us at (the one a multicast route leaves from);
    connecting a UDP socket sends nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("224.0.0.251", 5353))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"

"""Connections under abuse, over real sockets: a request sent a byte at a time, an event whose
payload never comes, more connections than the cap, and the idle ones, on HTTP and Wyoming;
and the legitimate clients the same limits must leave alone (an idle connection before its
timeout, a long synthesis read slowly, a text stream waiting for a language model).

The fronts run in the test's event loop (``test_lifecycle.start_fronts``) with timeouts of a
second or two, so each case stays quick. The clients are raw sockets (asyncio streams), the
only way to be as slow as an attacker is.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import test_lifecycle
from audio_checks import assert_speech, pcm16
from test_lifecycle import LONG, SHORT, Fronts, start_fronts
from wyoming.audio import AudioChunk
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from daemon.jobs.metrics import LatencyRecord
from daemon.synthesis.engine import Engine

GUARD = 60.0  # a hang guard, never a performance threshold
SLACK = 3.0  # seconds a timeout may be late by on a loaded machine

fronts = test_lifecycle.fronts  # the fixture: the fronts a test starts are stopped after it

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def start(fronts: list[Fronts], engine: Engine, http: dict[str, object] | None = None,
                **wyoming: object) -> Fronts:
    f = await start_fronts(engine, http, **wyoming)
    fronts.append(f)
    return f


def closed(f: Fronts, front: str, reason: str) -> float:
    value = f.ctx.metrics.registry.get_sample_value(
        "herald_connections_closed_total", {"front": front, "reason": reason})
    return value or 0.0


def open_now(f: Fronts, front: str) -> float:
    return f.ctx.metrics.registry.get_sample_value("herald_connections", {"front": front}) or 0


async def trickle(writer: asyncio.StreamWriter, data: bytes, every: float = 1.0) -> None:
    """Send ``data`` a byte at a time, one every ``every`` seconds, until the server hangs up."""
    for byte in data:
        writer.write(bytes([byte]))
        try:
            await writer.drain()
        except ConnectionError:
            return
        await asyncio.sleep(every)


async def answer_while_trickling(f: Fronts, head: bytes, data: bytes) -> tuple[bytes, float]:
    """Send ``head`` at once and ``data`` at 1 byte/s; what the server sends back before it
    closes the connection, and how long after ``head`` the close came."""
    reader, writer = await asyncio.open_connection("127.0.0.1", f.http.port)
    writer.write(head)
    sent = time.monotonic()
    slow = asyncio.create_task(trickle(writer, data))
    try:
        async with asyncio.timeout(GUARD):
            answer = await reader.read()  # to EOF: the server closed the connection
        return answer, time.monotonic() - sent
    finally:
        slow.cancel()
        writer.close()


def http_request(path: str = "/healthz", method: str = "GET", body: bytes = b"") -> bytes:
    extra = (b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
             if body else b"")
    return (f"{method} {path} HTTP/1.1\r\nHost: herald\r\n".encode() + extra + b"\r\n" + body)


async def http_exchange(streams: Streams, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on a kept-alive connection: status, headers, body."""
    reader, writer = streams
    writer.write(request)
    async with asyncio.timeout(GUARD):
        status_line = await reader.readuntil(b"\r\n")
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (line.partition(":") for line in head.split("\r\n") if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


# --------------------------------------------------------------------------- HTTP


@pytest.mark.timed  # the rule is a timeout: closed by it, SLACK late at most
async def test_http_headers_sent_a_byte_a_second_get_408_within_the_timeout(
        engine: Engine, fronts: list[Fronts]) -> None:
    f = await start(fronts, engine, {"header_timeout": 2.0})
    answer, took = await answer_while_trickling(
        f, b"G", b"ET /healthz HTTP/1.1\r\nHost: herald\r\nX-Slow: " + b"z" * 100)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"http.header_timeout" in answer
    assert took < 2.0 + SLACK, f"closed after {took:.1f} s"
    assert closed(f, "http", "header") == 1
    async with asyncio.timeout(GUARD):  # everyone else is still served
        streams = await asyncio.open_connection("127.0.0.1", f.http.port)
    assert (await http_exchange(streams, http_request()))[0] == 200
    streams[1].close()


@pytest.mark.timed  # the rule is a timeout: closed by it, SLACK late at most
async def test_http_body_sent_a_byte_a_second_gets_408_within_the_timeout(
        engine: Engine, fronts: list[Fronts]) -> None:
    f = await start(fronts, engine, {"body_timeout": 2.0})
    body = b'{"text": "' + b"a" * 200 + b'"}'
    head = (b"POST /tts HTTP/1.1\r\nHost: herald\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    answer, took = await answer_while_trickling(f, head, body)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"http.body_timeout" in answer
    assert took < 2.0 + SLACK, f"closed after {took:.1f} s"
    assert closed(f, "http", "body") == 1
    assert not f.ctx.scheduler.count("http")  # nothing was queued for it


async def test_http_connection_over_the_cap_gets_503_while_the_first_are_served(
        engine: Engine, fronts: list[Fronts]) -> None:
    f = await start(fronts, engine, {"max_connections": 3})
    first = [await asyncio.open_connection("127.0.0.1", f.http.port) for _ in range(3)]
    try:
        async with asyncio.timeout(GUARD):
            while open_now(f, "http") < 3:
                await asyncio.sleep(0.02)
        extra = await asyncio.open_connection("127.0.0.1", f.http.port)
        status, headers, body = await http_exchange(extra, http_request())
        assert status == 503, body
        assert headers["retry-after"] == "2"
        assert b"http.max_connections" in body
        async with asyncio.timeout(GUARD):
            assert await extra[0].read() == b""  # and closed
        extra[1].close()
        assert closed(f, "http", "busy") == 1
        # The first three are served, speech included.
        status, _, wav = await http_exchange(
            first[0], http_request("/tts", "POST", b'{"text": "%s"}' % SHORT.encode()))
        assert status == 200
        assert_speech(pcm16(wav[44:]), 22050, min_seconds=0.5)
        for streams in first[1:]:
            assert (await http_exchange(streams, http_request()))[0] == 200
    finally:
        for _, writer in first:
            writer.close()


@pytest.mark.timed  # the rule is a timeout: closed by it, SLACK late at most
async def test_http_idle_connection_is_kept_until_the_idle_timeout(
        engine: Engine, fronts: list[Fronts]) -> None:
    f = await start(fronts, engine, {"idle_timeout": 2.0})
    streams = await asyncio.open_connection("127.0.0.1", f.http.port)
    try:
        await asyncio.sleep(1.0)  # idle, under the timeout
        assert (await http_exchange(streams, http_request()))[0] == 200
        await asyncio.sleep(1.0)
        assert (await http_exchange(streams, http_request()))[0] == 200
        quiet = time.monotonic()
        async with asyncio.timeout(GUARD):
            assert await streams[0].read() == b""  # then closed, having been idle too long
        took = time.monotonic() - quiet
        assert 2.0 - 0.2 < took < 2.0 + SLACK, f"closed after {took:.1f} s idle"
    finally:
        streams[1].close()


# --------------------------------------------------------------------------- Wyoming


async def wyoming_connect(f: Fronts) -> Streams:
    async with asyncio.timeout(GUARD):
        return await asyncio.open_connection("127.0.0.1", f.wyoming_port)


async def next_event(reader: asyncio.StreamReader) -> Event | None:
    async with asyncio.timeout(GUARD):
        return await async_read_event(reader)


async def error_then_close(reader: asyncio.StreamReader) -> Error:
    event = await next_event(reader)
    assert event is not None and Error.is_type(event.type), event
    assert await next_event(reader) is None  # then the connection ends
    return Error.from_event(event)


async def timed_out_after(reader: asyncio.StreamReader, timeout: float, setting: str) -> None:
    """The connection, quiet from now on, gets an ``error`` naming ``setting`` once
    ``timeout`` has passed (not before), then ends."""
    quiet = time.monotonic()
    error = await error_then_close(reader)
    took = time.monotonic() - quiet
    assert error.code == "timeout" and setting in error.text, error
    assert timeout - 0.2 < took < timeout + SLACK, f"closed after {took:.1f} s quiet"


async def speak(streams: Streams, text: str, pause: float = 0.0) -> bytes:
    """Synthesize ``text``: its audio, read with ``pause`` seconds per second of audio."""
    reader, writer = streams
    await async_write_event(Synthesize(text).event(), writer)
    audio = b""
    while (event := await next_event(reader)) is not None and event.type != "audio-stop":
        assert event.type != "error", event.data
        if AudioChunk.is_type(event.type):
            chunk = AudioChunk.from_event(event)
            audio += chunk.audio
            await asyncio.sleep(pause * len(chunk.audio) / 2 / chunk.rate)
    assert event is not None, "connection closed before audio-stop"
    return audio


@pytest.mark.timed  # the rule is a timeout: closed by it, SLACK late at most
async def test_wyoming_event_whose_payload_never_arrives_gets_an_error_within_the_timeout(
        engine: Engine, fronts: list[Fronts]) -> None:
    f = await start(fronts, engine, read_timeout=1.0)
    reader, writer = await wyoming_connect(f)
    try:
        writer.write(b'{"type": "synthesize", "data_length": 60}\n{"text": "Hel')
        sent = time.monotonic()
        error = await error_then_close(reader)
        took = time.monotonic() - sent
    finally:
        writer.close()
    assert error.code == "timeout" and "wyoming.read_timeout" in error.text
    assert took < 1.0 + SLACK, f"closed after {took:.1f} s"
    assert closed(f, "wyoming", "read") == 1


async def test_wyoming_connection_over_the_cap_is_refused_while_the_first_are_served(
        engine: Engine, fronts: list[Fronts]) -> None:
    f = await start(fronts, engine, max_connections=2)
    first = [await wyoming_connect(f) for _ in range(2)]
    try:
        for reader, writer in first:  # both accepted and answering
            await async_write_event(Describe().event(), writer)
            info = await next_event(reader)
            assert info is not None and Info.is_type(info.type)
        reader, writer = await wyoming_connect(f)
        await async_write_event(Synthesize(SHORT).event(), writer)  # as Home Assistant does
        error = await error_then_close(reader)
        writer.close()
        assert error.code == "busy" and "wyoming.max_connections" in error.text
        assert closed(f, "wyoming", "busy") == 1
        async with asyncio.timeout(GUARD):  # the refused one is gone, the first two stay
            while open_now(f, "wyoming") != 2:
                await asyncio.sleep(0.02)
        for streams in first:
            assert_speech(pcm16(await speak(streams, SHORT)), 22050, min_seconds=0.5)
    finally:
        for _, writer in first:
            writer.close()


@pytest.mark.timed  # the rule is a timeout: closed by it, SLACK late at most
async def test_wyoming_idle_connection_is_kept_until_the_idle_timeout(
        engine: Engine, fronts: list[Fronts]) -> None:
    f = await start(fronts, engine, idle_timeout=2.0)
    reader, writer = await wyoming_connect(f)
    try:
        for _ in range(2):
            await asyncio.sleep(1.0)  # idle, under the timeout
            await async_write_event(Describe().event(), writer)
            info = await next_event(reader)
            assert info is not None and Info.is_type(info.type)
        await timed_out_after(reader, 2.0, "wyoming.idle_timeout")
    finally:
        writer.close()
    assert closed(f, "wyoming", "idle") == 1


async def test_wyoming_long_synthesis_read_slowly_is_not_cut_by_the_idle_timeout(
        engine: Engine, fronts: list[Fronts]) -> None:
    f = await start(fronts, engine, idle_timeout=1.0, read_timeout=1.0)
    records: list[LatencyRecord] = []
    f.ctx.metrics.add_listener(records.append)
    streams = await wyoming_connect(f)
    try:
        begun = time.monotonic()
        # Read at half real time: the answer takes several idle timeouts to deliver.
        audio = await speak(streams, LONG, pause=0.5)
        assert time.monotonic() - begun > 3.0
        assert_speech(pcm16(audio), 22050, min_seconds=6.0)
        error = await error_then_close(streams[0])  # then idle: closed
        assert error.code == "timeout"
    finally:
        streams[1].close()
    assert [r.outcome for r in records] == ["ok"]
    assert closed(f, "wyoming", "idle") == 1


@pytest.mark.timed  # the rule is a timeout: closed by it, SLACK late at most
async def test_wyoming_text_stream_may_wait_for_its_model_longer_than_the_idle_timeout(
        engine: Engine, fronts: list[Fronts]) -> None:
    f = await start(fronts, engine, idle_timeout=1.0, stream_timeout=4.0)
    reader, writer = await wyoming_connect(f)
    try:
        await async_write_event(SynthesizeStart().event(), writer)
        await async_write_event(SynthesizeChunk(SHORT).event(), writer)
        await asyncio.sleep(2.0)  # the model thinks, for longer than idle_timeout
        await async_write_event(SynthesizeChunk(" It is done.").event(), writer)
        await async_write_event(SynthesizeStop().event(), writer)
        kinds = []
        while (event := await next_event(reader)) is not None:
            kinds.append(event.type)
            assert event.type != "error", event.data
            if event.type == "synthesize-stopped":
                break
        assert kinds[-1] == "synthesize-stopped" and "audio-chunk" in kinds
        # A stream left open waits stream_timeout, not longer.
        await async_write_event(SynthesizeStart().event(), writer)
        await timed_out_after(reader, 4.0, "wyoming.stream_timeout")
    finally:
        writer.close()

"""The Wyoming front against the `wyoming` library's own client, over real TCP.

Each test starts a WyomingFront on a free port in its own event loop, with a real Engine on
the default voice. Synthesis uses noise 0, so herald's Wyoming audio can be compared sample
for sample with the engine's one-shot synthesis of the same text.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from audio_checks import assert_pcm_close, assert_speech, pcm16, reference_pcm
from conftest import ROOT, free_port
from pydantic import ValidationError
from waiting import until
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event, write_event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from daemon.context import Context
from daemon.fronts.wyoming import WyomingFront, WyomingSettings
from daemon.jobs.metrics import LatencyRecord, Metrics
from daemon.jobs.request import TextStream
from daemon.synthesis.engine import Engine, EngineSettings
from tts import SynthesisOptions
from tts.compose import Composer, Say

QUIET = SynthesisOptions(noise_scale=0.0, noise_w=0.0)  # deterministic: comparable audio
SHORT = "Turn on the kitchen lights."
LONG = "The quick brown fox jumps over the lazy dog while the farmer watches from the barn."
GUARD = 60.0  # seconds: only a hang guard, never a performance threshold


@dataclass
class Server:
    front: WyomingFront
    port: int
    records: list[LatencyRecord]

    @property
    def metrics(self) -> Metrics:
        return self.front.ctx.metrics

    def client(self) -> AsyncTcpClient:
        return AsyncTcpClient("127.0.0.1", self.port, connect_timeout=10, read_timeout=GUARD)

    def count(self, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "herald_requests_total", {"front": "wyoming", "outcome": outcome})
        return value or 0.0


StartServer = Callable[..., Awaitable[Server]]


def engine_settings(workers: int) -> EngineSettings:
    """``workers`` synthesis threads in all: with one, a stream left running (not cancelled)
    would leave no thread for anyone else."""
    limits: dict[str, int] = {"workers": workers}
    if "max_streams" in {f.name for f in dataclasses.fields(EngineSettings)}:
        limits["max_streams"] = workers
    return EngineSettings(threads=1, **limits)


@pytest.fixture
async def start_server(catalog) -> AsyncIterator[StartServer]:  # type: ignore[no-untyped-def]
    started: list[Server] = []

    async def start(workers: int = 2, **settings: object) -> Server:
        engine = Engine(catalog, engine_settings(workers))
        metrics = Metrics()
        records: list[LatencyRecord] = []
        metrics.add_listener(records.append)
        port = free_port()
        settings.setdefault("uri", f"tcp://127.0.0.1:{port}")
        front = WyomingFront(WyomingSettings(**settings), Context(engine, metrics, "9.8.7"),
                             options=QUIET)
        await front.start()
        server = Server(front, port, records)
        started.append(server)
        return server

    yield start
    for server in started:
        await server.front.stop()
        server.front.ctx.engine.close()


@dataclass
class Reply:
    events: list[Event] = field(default_factory=list)

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.type == kind]

    @property
    def audio(self) -> bytes:
        return b"".join(AudioChunk.from_event(e).audio for e in self.of("audio-chunk"))

    @property
    def samples(self) -> np.ndarray:
        return pcm16(self.audio)


async def read_until(client: AsyncTcpClient, last: str) -> Reply:
    reply = Reply()
    while True:
        event = await client.read_event()
        assert event is not None, f"connection closed before {last}; got {_types(reply)}"
        reply.events.append(event)
        if event.type == last:
            return reply
        assert event.type != "error", f"server error: {event.data}"


def _types(reply: Reply) -> list[str]:
    return [e.type for e in reply.events]


ONE_SHOT = "the engine's one-shot synthesis"


def reference(synth, text: str) -> bytes:  # type: ignore[no-untyped-def]
    """The engine's one-shot synthesis of the same text, as the s16le a client gets."""
    return reference_pcm(synth, text, QUIET, one_shot=True)


# --- describe ---------------------------------------------------------------------------------


async def test_describe_lists_one_program_with_the_installed_voices(start_server, catalog):
    server = await start_server()
    async with server.client() as client:
        await client.write_event(Describe().event())
        info = Info.from_event(await client.read_event())
    assert len(info.tts) == 1 and not info.asr and not info.wake
    program = info.tts[0]
    assert program.name == "herald" and program.installed and program.version == "9.8.7"
    assert program.supports_synthesize_streaming
    assert program.description and program.attribution.name
    assert [v.name for v in program.voices] == [v.name for v in catalog.infos()]
    voice = program.voices[0]
    assert voice.installed and voice.languages == ["en_US"] and voice.version == "1.0.0"
    assert voice.attribution.url and voice.description and voice.speakers is None


# --- synthesize -------------------------------------------------------------------------------


async def test_synthesize_streams_engine_chunks_of_speech(start_server, synth):
    server = await start_server()
    async with server.client() as client:
        await client.write_event(Synthesize(LONG).event())
        reply = await read_until(client, "audio-stop")
    types = _types(reply)
    assert types[0] == "audio-start" and types[-1] == "audio-stop"
    assert set(types[1:-1]) == {"audio-chunk"}
    start = AudioStart.from_event(reply.events[0])
    assert (start.rate, start.width, start.channels) == (synth.sample_rate, 2, 1)
    chunks = [AudioChunk.from_event(e) for e in reply.of("audio-chunk")]
    # One sentence arrives as several chunks: audio is sent as the engine makes it.
    assert len(chunks) >= 4
    assert all((c.rate, c.width, c.channels) == (start.rate, 2, 1) for c in chunks)
    assert [c.timestamp for c in chunks] == sorted(c.timestamp for c in chunks)
    assert_speech(reply.samples, synth.sample_rate, min_seconds=3.0, max_seconds=8.0)
    assert_pcm_close(reply.audio, reference(synth, LONG), ONE_SHOT)
    [record] = server.records
    assert (record.front, record.sink, record.voice, record.outcome) == (
        "wyoming", "wyoming", synth.voice.name, "ok")
    assert record.audio_ms == pytest.approx(len(reply.samples) / synth.sample_rate * 1000, 0.01)
    assert 0 < record.first_audio_ms <= record.synth_ms + record.queue_ms


async def test_voice_by_name_or_language_and_several_requests_per_connection(start_server,
                                                                            synth):
    server = await start_server()
    async with server.client() as client:
        for voice in (SynthesizeVoice(name=synth.voice.name), SynthesizeVoice(language="en_US"),
                      SynthesizeVoice(language="en")):
            await client.write_event(Synthesize(SHORT, voice=voice).event())
            reply = await read_until(client, "audio-stop")
            assert_pcm_close(reply.audio, reference(synth, SHORT), ONE_SHOT)
        await client.write_event(Ping(text="still there?").event())
        assert Pong.from_event(await client.read_event()).text == "still there?"
    assert [r.outcome for r in server.records] == ["ok"] * 3


# --- streaming text input ---------------------------------------------------------------------


async def test_streamed_text_is_spoken_as_sentences_complete(start_server, synth):
    server = await start_server()
    text = "Hello there. How are you today? The garden looks lovely in the morning sun."
    first, rest = ["Hel", "lo th", "ere. H", "ow a"], ["re you to", "day? The gar",
                                                      "den looks lovely in the mor", "ning sun."]
    assert "".join(first + rest) == text
    reply = Reply()
    first_chunk = asyncio.Event()

    async with server.client() as client:
        async def read() -> None:
            while True:
                event = await client.read_event()
                assert event is not None, f"closed early after {_types(reply)}"
                reply.events.append(event)
                if event.type == "audio-chunk":
                    first_chunk.set()
                if event.type in ("synthesize-stopped", "error"):
                    return

        reader = asyncio.create_task(read())
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(
            name=synth.voice.name)).event())
        for piece in first:
            await client.write_event(SynthesizeChunk(text=piece).event())
        # The first sentence is complete: its audio must come while the text is still open.
        async with asyncio.timeout(GUARD):
            await first_chunk.wait()
        chunks_before_stop = len(reply.of("audio-chunk"))
        for piece in rest:
            await client.write_event(SynthesizeChunk(text=piece).event())
        # Home Assistant also sends the whole text as a plain synthesize: must be ignored.
        await client.write_event(Synthesize(text=text).event())
        await client.write_event(SynthesizeStop().event())
        async with asyncio.timeout(GUARD):
            await reader

    assert chunks_before_stop >= 1
    types = _types(reply)
    assert types.count("audio-start") == 1 and types.count("audio-stop") == 1
    assert types[0] == "audio-start" and types[-2:] == ["audio-stop", "synthesize-stopped"]
    assert_speech(reply.samples, synth.sample_rate, min_seconds=3.0)
    # All of the text was spoken, once: as long as the engine's one-shot of the whole text.
    whole = len(reference(synth, text)) // 2
    assert len(reply.samples) == pytest.approx(whole, rel=0.05)
    [record] = server.records
    assert record.outcome == "ok" and record.audio_ms == pytest.approx(
        len(reply.samples) / synth.sample_rate * 1000, 0.01)


async def test_streamed_text_waits_for_what_follows_a_sentence_end(catalog):
    """The planner a Wyoming stream goes through (the engine's own): a sentence is released
    only once what follows proves it complete."""
    stream = TextStream()
    got: list[str] = []

    async def consume() -> None:
        async for steps in stream.steps(Composer(catalog).planner()):
            got.extend(step.text for step in steps if isinstance(step, Say))

    consumer = asyncio.create_task(consume())

    async def released() -> list[str]:
        for _ in range(5):  # let the consumer take whatever is ready
            await asyncio.sleep(0)
        out = got[:]
        got.clear()
        return out

    stream.feed("It costs 3.")
    assert await released() == []  # "3." may be "3.5"
    stream.feed("5 euros! Re")
    assert await released() == ["It costs 3.5 euros!"]
    stream.feed("ally?\"")
    assert await released() == []
    stream.feed(" he said. Dr.")  # a lower-case word after ?" continues the sentence
    assert await released() == ["Really?\" he said."]
    stream.feed(" Smith came. 好的。谢谢！")  # "Dr." never ends a sentence
    assert await released() == ["Dr. Smith came.", "好的。"]
    stream.feed("no end")
    assert await released() == ["谢谢！"]
    stream.feed("", final=True)
    assert await released() == ["no end"]
    await asyncio.wait_for(consumer, GUARD)  # the stream ended
    long = TextStream()
    long.feed("one two three four five six")
    [say] = await anext(long.steps(Composer(catalog, max_chars=20).planner()))
    assert isinstance(say, Say) and say.text == "one two three four"


async def test_ssml_break_in_synthesize_and_in_a_stream(start_server, synth):
    server = await start_server()
    ssml = '<speak>Wait <break time="500ms"/> here.</speak>'
    async with server.client() as client:
        await client.write_event(Synthesize("Wait here.").event())
        plain = await read_until(client, "audio-stop")
        await client.write_event(Synthesize(ssml, text_format="ssml").event())
        marked = await read_until(client, "audio-stop")
        await client.write_event(SynthesizeStart(text_format="ssml").event())
        for piece in (ssml[:12], ssml[12:30], ssml[30:]):
            await client.write_event(SynthesizeChunk(piece).event())
        await client.write_event(SynthesizeStop().event())
        streamed = await read_until(client, "synthesize-stopped")
    assert_speech(marked.samples, synth.sample_rate, min_seconds=1.0)
    assert len(marked.samples) - len(plain.samples) >= 0.45 * synth.sample_rate  # the break
    # spoken whole once it was complete
    assert_pcm_close(streamed.audio, marked.audio, "the text sent whole")
    assert [r.outcome for r in server.records] == ["ok"] * 3


async def test_tags_carry_over_between_streamed_sentences(start_server, synth):
    server = await start_server()
    text = "[rate 0.6] One two three. [pause 400ms] Four five six."
    async with server.client() as client:
        await client.write_event(Synthesize(text).event())
        whole = await read_until(client, "audio-stop")
        cut = text.index("[pause")
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk(text[:cut + 1]).event())  # "... three. ["
        first = await read_until(client, "audio-chunk")  # the first sentence, on its own
        await client.write_event(SynthesizeChunk(text[cut + 1:]).event())
        await client.write_event(SynthesizeStop().event())
        rest = await read_until(client, "synthesize-stopped")
    assert_speech(whole.samples, synth.sample_rate, min_seconds=2.0)
    assert_pcm_close(first.audio + rest.audio, whole.audio, "the text sent whole")


# --- many clients -----------------------------------------------------------------------------


def stalled_client(port: int, event: Event) -> socket.socket:
    """A client that sends one request and never reads (tiny receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    with sock.makefile("wb") as f:
        write_event(event, f)
    return sock


async def test_a_client_that_stops_reading_does_not_hold_up_the_others(start_server, synth):
    # Long write timeout: the stalled client stays stalled while the others are served.
    server = await start_server(workers=2, write_timeout=600, send_buffer=4096)
    stalled = stalled_client(server.port, Synthesize(f"{LONG} {LONG}").event())
    try:
        async def normal() -> Reply:
            async with server.client() as client:
                await client.write_event(Synthesize(SHORT).event())
                return await read_until(client, "audio-stop")

        replies = await asyncio.gather(normal(), normal())
        for reply in replies:
            assert_pcm_close(reply.audio, reference(synth, SHORT), ONE_SHOT)
        # Both were answered while the stalled one is still unfinished (nothing recorded).
        assert [r.outcome for r in server.records] == ["ok", "ok"]
    finally:
        stalled.close()  # unread data: the kernel resets the connection
    # The stalled client vanishing mid-stream ends its request, and only that one.
    await until(lambda: len(server.records) == 3, "three latency records")
    assert server.records[2].outcome == "stopped"
    whole_ms = 2 * len(reference(synth, LONG)) / 2 / synth.sample_rate * 1000
    assert server.records[2].audio_ms < whole_ms  # cut off, not spoken to the end
    async with server.client() as client:
        await client.write_event(Synthesize(SHORT).event())
        await read_until(client, "audio-stop")


async def test_a_stalled_client_is_dropped_and_its_synthesis_cancelled(start_server, synth,
                                                                      caplog):
    caplog.set_level(logging.INFO, "herald.wyoming")
    # One worker: if the stalled synthesis were not cancelled, nothing else could run.
    server = await start_server(workers=1, write_timeout=1.0, send_buffer=4096)
    stalled = stalled_client(server.port, Synthesize(f"{LONG} {LONG}").event())
    try:
        await until(lambda: len(server.records) == 1, "the latency record")
        assert server.records[0].outcome == "stopped"
        assert "stopped reading" in caplog.text
        # The client finds an audio stream that ends without audio-stop: it was dropped.
        # Read in a thread: the server closes the socket in a callback on this event loop,
        # which a blocking read here would hold up until the guard ran out.
        stalled.settimeout(GUARD)

        def drain() -> bytes:
            received = b""
            with contextlib.suppress(ConnectionResetError):
                while data := stalled.recv(65536):
                    received += data
            return received

        received = await asyncio.to_thread(drain)
        assert b'"audio-start"' in received and b'"audio-stop"' not in received
    finally:
        stalled.close()
    async with server.client() as client:
        await client.write_event(Synthesize(SHORT).event())
        reply = await read_until(client, "audio-stop")
    assert_pcm_close(reply.audio, reference(synth, SHORT), ONE_SHOT)


async def test_client_vanishing_mid_stream(start_server, synth):
    server = await start_server()
    async with server.client() as client:
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk(text=f"{LONG} And").event())
        event = await client.read_event()
        assert event is not None and event.type == "audio-start"
    await until(lambda: len(server.records) == 1, "the latency record")
    assert server.records[0].outcome == "stopped"
    async with server.client() as client:
        await client.write_event(Synthesize(SHORT).event())
        await read_until(client, "audio-stop")
    assert [r.outcome for r in server.records] == ["stopped", "ok"]


# --- errors -----------------------------------------------------------------------------------


def raw(line: str | bytes) -> bytes:
    return line if isinstance(line, bytes) else line.encode() + b"\n"


def header(kind: str, data: dict[str, object] | None = None, **extra: object) -> bytes:
    return raw(json.dumps({"type": kind, "data": data or {}, **extra}))


ERROR_CASES: dict[str, tuple[list[Event | bytes], str]] = {
    "unknown voice": ([Synthesize(SHORT, voice=SynthesizeVoice(name="xx_XX-nobody")).event()],
                      "unknown-voice"),
    "unknown language": ([Synthesize(SHORT, voice=SynthesizeVoice(language="tlh")).event()],
                         "unknown-voice"),
    "unknown voice in a stream": ([SynthesizeStart(voice=SynthesizeVoice(name="nobody")).event()],
                                  "unknown-voice"),
    "speaker of a one-speaker voice": (
        [Synthesize(SHORT, voice=SynthesizeVoice(name="en_US-joe-medium", speaker="7")).event()],
        "bad-voice"),
    "empty text": ([Synthesize("  \n ").event()], "empty-text"),
    "empty stream": ([SynthesizeStart().event(), SynthesizeChunk(" ").event(),
                      SynthesizeStop().event()], "empty-text"),
    "text too long": ([Synthesize("word " * 50).event()], "text-too-long"),
    "unknown text format": ([Synthesize("# hi", text_format="markdown").event()],
                            "text-format-not-supported"),
    "malformed ssml": ([Synthesize("<speak>hi <break></speak>", text_format="ssml").event()],
                       "bad-markup"),
    "malformed ssml in a stream": ([SynthesizeStart(text_format="ssml").event(),
                                    SynthesizeChunk("<speak>Hello").event(),
                                    SynthesizeChunk(" there.").event(),
                                    SynthesizeStop().event()], "bad-markup"),
    "synthesize without text": ([header("synthesize", {"voice": {"name": "x"}})], "bad-request"),
    "text that is not a string": ([header("synthesize", {"text": 42})], "bad-request"),
    # "\ud800" is valid JSON but no character; espeak-ng would fail on it mid-synthesis
    "unpaired surrogate": ([raw('{"type": "synthesize", "data": {"text": "hi \\ud800"}}')],
                           "bad-request"),
    "unpaired surrogate in a stream": ([SynthesizeStart().event(), raw(
        '{"type": "synthesize-chunk", "data": {"text": "hi \\udc00"}}')], "bad-request"),
    # unrefused, the library would drop a voice that is not an object (the default speaks)
    # and a speaker without a voice name, and read true as speaker 1
    "voice that is not an object": ([header("synthesize", {"text": "hi",
                                                           "voice": "en_US-joe-medium"})],
                                    "bad-request"),
    "speaker that is true/false": ([header("synthesize", {"text": "hi", "voice": {
        "name": "en_US-joe-medium", "speaker": True}})], "bad-request"),
    "speaker without a voice name": ([header("synthesize", {"text": "hi", "voice": {
        "language": "en", "speaker": "7"}})], "bad-request"),
    "not JSON": ([raw("this is not a Wyoming event")], "malformed-event"),
    "binary junk": ([raw(b"\x00\xff\xfe garbage \x81\n")], "malformed-event"),
    "JSON without a type": ([raw('{"data": {"text": "hi"}}')], "malformed-event"),
    "JSON that is not an object": ([raw("[1, 2, 3]")], "malformed-event"),
    "huge declared payload": ([header("synthesize", payload_length=10**10)], "event-too-large"),
    "chunk without start": ([SynthesizeChunk("hello").event()], "unexpected-event"),
    "stop without start": ([SynthesizeStop().event()], "unexpected-event"),
    "start twice": ([SynthesizeStart().event(), SynthesizeStart().event()], "unexpected-event"),
    "audio sent to a TTS server": ([AudioChunk(22050, 2, 1, b"\0\0" * 100).event()],
                                   "unexpected-event"),
}


@pytest.mark.parametrize("case", ERROR_CASES, ids=list(ERROR_CASES))
async def test_bad_input_gets_an_error_and_the_server_keeps_serving(start_server, synth, case):
    server = await start_server(max_text=100)
    sends, code = ERROR_CASES[case]
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        for item in sends:
            if isinstance(item, bytes):
                writer.write(item)
                await writer.drain()
            else:
                await async_write_event(item, writer)
        async with asyncio.timeout(GUARD):
            event = await async_read_event(reader)
            assert event is not None and Error.is_type(event.type), event
            error = Error.from_event(event)
            assert error.code == code, error
            assert len(error.text) > 20  # says what went wrong and what to do
            # An error ends the connection (Home Assistant would wait forever otherwise).
            assert await async_read_event(reader) is None
    finally:
        writer.close()
    assert server.count("error") == 1
    assert not server.records
    async with server.client() as client:  # everyone else is still served
        await client.write_event(Synthesize(SHORT).event())
        reply = await read_until(client, "audio-stop")
    assert_pcm_close(reply.audio, reference(synth, SHORT), ONE_SHOT)


async def test_unknown_event_types_are_ignored_as_the_protocol_asks(start_server):
    server = await start_server()
    async with server.client() as client:
        await client.write_event(Event(type="some-future-event", data={"x": 1}))
        await client.write_event(Describe().event())
        event = await client.read_event()
        assert event is not None and Info.is_type(event.type)
    assert server.count("error") == 0


# --- network access ---------------------------------------------------------------------------


def lan_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


async def describe_from(address: str, port: int) -> Event | None:
    """The server's answer to describe from a client at ``address``; None if it hung up."""
    reader, writer = await asyncio.open_connection(address, port)
    try:
        writer.write(header("describe"))
        await writer.drain()
        async with asyncio.timeout(GUARD):
            return await async_read_event(reader)
    except ConnectionResetError:  # hung up with our request unread
        return None
    finally:
        writer.close()


async def test_allow_list_decides_who_may_connect(start_server, caplog):
    address = lan_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    caplog.set_level(logging.WARNING, "herald.wyoming")
    port = free_port()
    server = await start_server(uri=f"tcp://0.0.0.0:{port}")
    assert "only loopback clients" in caplog.text  # bound wide, nobody allowed yet: says so
    assert (await describe_from("127.0.0.1", port)).type == "info"
    assert await describe_from(address, port) is None  # closed without an answer
    assert f"refused Wyoming connection from Wyoming client {address}" in caplog.text
    await server.front.stop()

    port = free_port()
    await start_server(uri=f"tcp://0.0.0.0:{port}", allow=[f"{address}/32"])
    assert (await describe_from(address, port)).type == "info"
    assert await describe_from("127.0.0.1", port) is None  # an explicit list is the whole list


def test_settings_say_what_is_wrong():
    with pytest.raises(ValidationError, match="not a network; expected CIDR"):
        WyomingSettings(allow=["192.168.1.0/24", "kitchen"])
    with pytest.raises(ValidationError, match=r"expected tcp://HOST:PORT"):
        WyomingSettings(uri="http://0.0.0.0:10200")
    with pytest.raises(ValidationError, match=r"expected tcp://HOST:PORT"):
        WyomingSettings(uri="tcp://0.0.0.0")


async def test_stop_closes_connections_and_the_port(start_server):
    server = await start_server()
    async with server.client() as client:
        await client.write_event(Describe().event())
        assert (await client.read_event()).type == "info"
        await server.front.stop()
        assert await client.read_event() is None
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", server.port)


async def test_zeroconf_announces_the_server(start_server):
    try:
        import zeroconf.asyncio as zeroconf
    except ImportError:
        pytest.fail("zeroconf is not installed: run scripts/setup --test")
    address = lan_address()
    if address is None:
        pytest.skip("no non-loopback address to announce")
    port = free_port()
    await start_server(uri=f"tcp://0.0.0.0:{port}", zeroconf=True,
                       zeroconf_name="herald-test-announce", allow=["127.0.0.1/32"])
    browser = zeroconf.AsyncZeroconf()
    try:
        info = zeroconf.AsyncServiceInfo("_wyoming._tcp.local.",
                                         "herald-test-announce._wyoming._tcp.local.")
        assert await info.async_request(browser.zeroconf, 5000)
        assert info.port == port and info.parsed_addresses() == [address]
    finally:
        await browser.async_close()


# --- also on the local speaker ----------------------------------------------------------------

ALSO_PLAY = """
import asyncio, json, logging, sys
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop
from daemon.context import Context
from daemon.synthesis.engine import Engine, EngineSettings
from daemon.fronts.wyoming import WyomingFront, WyomingSettings
from daemon.jobs.metrics import Metrics
from daemon.jobs.scheduler import Scheduler
from daemon.settings import SchedulerSettings
from daemon.settings import SpeakerSettings
from daemon.sinks.speaker import SpeakerSink
from tts import SynthesisOptions, VoiceCatalog

async def main(port, short, streamed, sent_file):
    logging.basicConfig(level=logging.INFO)
    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    engine = Engine(VoiceCatalog(), EngineSettings(threads=1))
    metrics = Metrics()
    records = []
    metrics.add_listener(records.append)
    speaker = SpeakerSink(SpeakerSettings(), metrics)
    await speaker.start()
    scheduler = Scheduler(engine, metrics, SchedulerSettings(), quiet, speaker)
    front = WyomingFront(WyomingSettings(uri=f"tcp://127.0.0.1:{port}", also_play=True),
                         Context(engine, metrics, "t", scheduler, quiet))
    await front.start()
    sent = b""
    async with AsyncTcpClient("127.0.0.1", port, read_timeout=120) as client:
        for events, last in (([Synthesize(short).event()], "audio-stop"),
                             ([SynthesizeStart().event()]
                              + [SynthesizeChunk(p).event() for p in streamed]
                              + [SynthesizeStop().event()], "synthesize-stopped")):
            for event in events:
                await client.write_event(event)
            while (event := await client.read_event()).type != last:
                if AudioChunk.is_type(event.type):
                    sent += AudioChunk.from_event(event).audio
    while sum(r.sink == "speaker" for r in records) < 2:
        await asyncio.sleep(0.05)
    await front.stop()
    await scheduler.close()
    await speaker.stop()
    with open(sent_file, "wb") as f:
        f.write(sent)
    print(engine.renders)
    print(json.dumps([[r.id, r.front, r.sink, r.outcome] for r in records]))

asyncio.run(main(int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]))
"""


def test_also_play_speaks_the_same_text_on_the_local_speaker(alsa_file, synth, tmp_path):
    """The real speaker path (scheduler, sounddevice, ALSA's file plugin) in a subprocess:
    PortAudio reads the ALSA configuration when sounddevice is imported."""
    streamed = ["Good mor", "ning. The lights ", "are on."]
    sent_file = tmp_path / "sent.raw"
    log_file = tmp_path / "driver.log"
    try:
        with log_file.open("w") as log:
            done = subprocess.run(
                [sys.executable, "-c", ALSO_PLAY, str(free_port()), SHORT,
                 json.dumps(streamed), str(sent_file)], env=alsa_file.env, cwd=ROOT,
                stdout=subprocess.PIPE, stderr=log, text=True, timeout=GUARD)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the driver hung; its log:\n{log_file.read_text()[-3000:]}")
    assert done.returncode == 0, log_file.read_text()[-3000:]
    *_, renders, last = done.stdout.strip().splitlines()
    records = json.loads(last)
    # One synthesis feeds both: the whole text once, the streamed one once per sentence at
    # most (a sentence that arrives while the one before renders joins it), not once a sink.
    assert 1 + 1 <= int(renders) <= 1 + 2
    wyoming = [r for r in records if r[2] == "wyoming"]
    spoken = [r for r in records if r[2] == "speaker"]
    assert [r[3] for r in wyoming] == ["ok", "ok"] and [r[3] for r in spoken] == ["ok", "ok"]
    assert {r[0] for r in spoken} == {r[0] for r in wyoming}  # one id ties the two together
    assert all(r[1] == "wyoming" for r in records)
    # The speaker played the speech the Wyoming client got (noise 0: the same synthesis).
    # ALSA's file plugin takes audio faster than real time, so the sink pads underruns with
    # silence: compare the voiced samples, not the lengths.
    played, sent = pcm16(alsa_file.pcm()), pcm16(sent_file.read_bytes())
    assert_speech(sent, synth.sample_rate, min_seconds=2.0)
    voiced = np.count_nonzero(np.abs(played) > 0.02)
    assert voiced == pytest.approx(np.count_nonzero(np.abs(sent) > 0.02), rel=0.03)

"""Encoded audio over real HTTP: ``response_format`` on every speech route, server-sent
events, OpenAI's own client library, and /tts/batch using every worker.

Every answer is decoded by ffmpeg and compared with herald's WAV of the same text and seed
(the server's ``[synthesis]`` defaults set ``noise_scale`` and ``noise_w`` to 0, the same
audio every time, so the OpenAI route, which has no seed field, speaks it too).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import time
import zipfile
from dataclasses import replace
from typing import Any

import numpy as np
import openai
import pytest
import test_http
from audio_checks import (
    MP3_STREAM_DELAY,
    assert_codec_audio,
    assert_pcm_close,
    assert_speech,
    decode,
)
from test_http import SEED, Server, error_of, openai_error_of, wav_samples

from daemon.jobs.metrics import LatencyRecord
from tts.codec import CONTENT_TYPES, EXTENSIONS, FORMATS

TEXT = "The washing machine has finished, and the laundry is ready to be hung up outside."
# One sentence of about ten seconds: its synthesis takes long enough to see audio arrive
# before it ends.
LONG_SENTENCE = ("When the weather service announced that a band of heavy rain would reach the "
                 "coast by the evening, bringing strong winds, falling temperatures and a real "
                 "chance of thunder, everyone in the village hurried to bring in the washing.")
RATE = 22050
ROUTES = ("/tts", "/tts/stream", "/tts/batch", "/v1/audio/speech")


http_start = test_http.start  # test_http's fixture, known here by this name


@pytest.fixture
def start(http_start):  # type: ignore[no-untyped-def]
    """test_http's servers: an HttpFront on a free port over the module's engine."""
    return http_start


STEADY = {"noise_scale": 0.0, "noise_w": 0.0}  # [synthesis]: the same audio every time


async def steady(start, **settings: Any) -> Server:  # type: ignore[no-untyped-def]
    srv: Server = await start(**settings)
    srv.ctx.synthesis = replace(srv.ctx.synthesis, **STEADY)
    return srv


async def reference(srv: Server, text: str = TEXT) -> np.ndarray:
    async with srv.session.post(f"{srv.url}/tts", json={"text": text}) as r:
        assert r.status == 200, await r.text()
        samples, rate = wav_samples(await r.read())
    assert rate == RATE
    return samples


async def fetch(srv: Server, route: str, name: str) -> tuple[bytes, bool]:
    """``TEXT`` from ``route`` as ``name``: the bytes, and whether they came as a stream."""
    if route == "/tts/batch":
        items = [{"text": TEXT, "response_format": name, "filename": "item"}]
        async with srv.session.post(f"{srv.url}{route}", json=items) as r:
            assert r.status == 200, await r.text()
            with zipfile.ZipFile(io.BytesIO(await r.read())) as z:
                assert z.namelist() == [f"item{EXTENSIONS[name]}"]
                return z.read(z.namelist()[0]), False
    if route == "/v1/audio/speech":
        body: dict[str, Any] = {"model": "tts-1", "voice": "alloy", "input": TEXT,
                                "response_format": name}
    else:
        body = {"text": TEXT, "response_format": name}
    async with srv.session.post(f"{srv.url}{route}", json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"] == CONTENT_TYPES[name]
        # the rate a decoder of the format gets back: Opus always decodes at 48 kHz
        assert r.headers["X-Sample-Rate"] == str(48000 if name == "opus" else RATE), name
        streamed = "Content-Length" not in r.headers
        return await r.read(), streamed


@pytest.mark.parametrize("route", ROUTES)
async def test_every_format_decodes_to_the_wav(start, route: str) -> None:  # type: ignore[no-untyped-def]
    """Each format, decoded by ffmpeg: as long as the WAV to within a codec frame (after a
    streamed MP3's codec delay), the same samples if lossless, close if lossy. /tts and
    /tts/batch send whole files, /tts/stream streams, /v1/audio/speech streams all but WAV."""
    srv = await steady(start)
    want = await reference(srv)
    for name in FORMATS:
        data, streamed = await fetch(srv, route, name)
        assert streamed == (route == "/tts/stream" or (route == "/v1/audio/speech"
                                                      and name != "wav")), name
        delay = MP3_STREAM_DELAY if name == "mp3" and streamed else 0
        assert_codec_audio(name, decode(name, data, RATE), want, RATE, delay)


async def test_mp3_stream_starts_before_synthesis_ends(start) -> None:  # type: ignore[no-untyped-def]
    """A ten-second sentence as a streamed MP3: the first bytes, already audio, reach the
    client while the server is still synthesizing."""
    srv = await steady(start)
    body, first = bytearray(), b""
    first_at = 0.0
    sent = time.monotonic()
    async with srv.session.post(f"{srv.url}/tts/stream",
                                json={"text": LONG_SENTENCE, "response_format": "mp3"}) as r:
        assert r.status == 200, await r.text()
        assert r.content_type == "audio/mpeg" and "Content-Length" not in r.headers
        async for data in r.content.iter_any():
            if not body:
                first_at, first = time.monotonic(), data
            body += data
    (rec,) = await srv.wait_record()
    synth_done = (rec.queue_ms + rec.synth_ms) / 1000  # after the server received it
    assert first_at - sent < synth_done, "the first MP3 bytes came after synthesis ended"
    assert len(decode("mp3", first, RATE)) > RATE // 50  # the first bytes already hold audio
    got = decode("mp3", bytes(body), RATE)
    assert_speech(got, RATE, min_seconds=8)
    assert_codec_audio("mp3", got, await reference(srv, LONG_SENTENCE), RATE, MP3_STREAM_DELAY)


def parse_events(body: bytes) -> list[dict[str, Any]]:
    """Server-sent events as a browser reads them: ``data:`` lines, a blank line after each."""
    text = body.decode()
    assert text.endswith("\n\n")
    events = []
    for block in text[:-2].split("\n\n"):
        lines = block.split("\n")
        assert all(line.startswith("data: ") for line in lines), block[:80]
        events.append(json.loads("".join(line[6:] for line in lines)))
    return events


def event_audio(events: list[dict[str, Any]]) -> tuple[bytes, dict[str, Any]]:
    *deltas, done = events
    assert deltas and all(e["type"] == "speech.audio.delta" for e in deltas)
    assert done["type"] == "speech.audio.done"
    assert done["usage"] == {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    return b"".join(base64.b64decode(e["audio"], validate=True) for e in deltas), done


@pytest.mark.parametrize("name", ["mp3", "wav"])
async def test_tts_stream_as_server_sent_events(start, name: str) -> None:  # type: ignore[no-untyped-def]
    """``Accept: text/event-stream``: base64 audio in the chosen format, event by event as
    it is made, then the latency record."""
    srv = await steady(start)
    want = await reference(srv)
    async with srv.session.post(f"{srv.url}/tts/stream", json={"text": TEXT,
                                "response_format": name},
                                headers={"Accept": "text/event-stream"}) as r:
        assert r.status == 200, await r.text()
        assert r.content_type == "text/event-stream"
        body = await r.read()
    events = parse_events(body)
    assert len(events) >= 3, "the audio should come in several events"
    audio, done = event_audio(events)
    got = decode(name, audio, RATE)
    assert_codec_audio(name, got, want, RATE, MP3_STREAM_DELAY if name == "mp3" else 0)
    record = LatencyRecord(**done["latency"])
    assert record.id == r.headers["X-Herald-Id"] and record.outcome == "ok"
    assert record.audio_ms == pytest.approx(len(want) / RATE * 1000, abs=0.1)
    assert 0 < record.first_audio_ms < record.queue_ms + record.synth_ms


async def test_openai_stream_format_sse(start) -> None:  # type: ignore[no-untyped-def]
    """OpenAI's ``stream_format: "sse"``: speech.audio.delta events with ``audio``, then
    speech.audio.done with ``usage`` and nothing of herald's own; MP3 by default."""
    srv = await steady(start)
    want = await reference(srv)
    async with srv.session.post(f"{srv.url}/v1/audio/speech", json={
            "model": "gpt-4o-mini-tts", "voice": "alloy", "input": TEXT,
            "stream_format": "sse"}) as r:
        assert r.status == 200, await r.text()
        assert r.content_type == "text/event-stream"
        events = parse_events(await r.read())
    audio, done = event_audio(events)
    assert set(done) == {"type", "usage"}
    assert_codec_audio("mp3", decode("mp3", audio, RATE), want, RATE, MP3_STREAM_DELAY)
    async with srv.session.post(f"{srv.url}/v1/audio/speech", json={
            "input": TEXT, "stream_format": "websocket"}) as r:
        assert r.status == 400
        assert "sse" in await openai_error_of(r, "stream_format")


async def test_the_openai_client_library(start) -> None:  # type: ignore[no-untyped-def]
    """OpenAI's own Python client, pointed at herald with herald's token as its API key:
    its defaults give playable MP3, ``response_format="wav"`` a WAV, ``aac`` its
    BadRequestError naming the formats herald has."""
    srv = await steady(start, token="s3cret-token")
    async with srv.session.post(f"{srv.url}/tts", json={"text": TEXT},
                                headers={"Authorization": "Bearer s3cret-token"}) as r:
        want, _ = wav_samples(await r.read())
    client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="s3cret-token",
                                max_retries=0)
    try:
        mp3 = (await client.audio.speech.create(model="tts-1", voice="alloy",
                                                input=TEXT)).content
        assert mp3[:3] == b"ID3" or (mp3[0] == 0xFF and mp3[1] & 0xE0 == 0xE0)  # MPEG audio
        assert_codec_audio("mp3", decode("mp3", mp3, RATE), want, RATE, MP3_STREAM_DELAY)

        wav = (await client.audio.speech.create(model="tts-1", voice="nova", input=TEXT,
                                                response_format="wav")).content
        samples, rate = wav_samples(wav)
        assert rate == RATE
        assert_pcm_close(samples, want)

        with pytest.raises(openai.BadRequestError) as refused:
            await client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                                             response_format="aac")
        assert refused.value.status_code == 400 and refused.value.param == "response_format"
        assert "'aac' is not supported; supported: mp3, opus, flac, wav, pcm" in \
            refused.value.message

        wrong = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await wrong.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
        await wrong.close()
    finally:
        await client.close()


async def test_bad_response_format_is_refused(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start()
    async with srv.session.post(f"{srv.url}/tts", data={"text": TEXT,
                                                       "response_format": "aac"}) as r:
        assert r.status == 400
        assert "supported: mp3, opus, flac, wav, pcm" in await error_of(r)
    async with srv.session.post(f"{srv.url}/tts/batch", json=[
            {"text": TEXT}, {"text": TEXT, "response_format": "ogg"}]) as r:
        assert r.status == 400
        assert (await error_of(r)).startswith("item 1: response_format 'ogg' is not supported")
    async with srv.session.post(f"{srv.url}/v1/audio/speech",
                                json={"input": TEXT, "response_format": "aac"}) as r:
        assert r.status == 400
        assert "mp3, opus, flac, wav, pcm" in await openai_error_of(r, "response_format")


async def test_format_as_query_and_batch_default(start) -> None:  # type: ignore[no-untyped-def]
    """The field works like the others: a query parameter below a text/plain body; a batch
    takes a default for its items, which an item may override."""
    srv = await steady(start)
    async with srv.session.post(f"{srv.url}/tts?response_format=flac", data=TEXT.encode(),
                                headers={"Content-Type": "text/plain"}) as r:
        assert r.status == 200, await r.text()
        assert r.content_type == "audio/flac"
        assert_codec_audio("flac", decode("flac", await r.read(), RATE), await reference(srv),
                           RATE)
    async with srv.session.post(f"{srv.url}/tts/batch?response_format=opus", json=[
            {"text": "One."}, {"text": "Two.", "response_format": "mp3"}]) as r:
        assert r.status == 200, await r.text()
        with zipfile.ZipFile(io.BytesIO(await r.read())) as z:
            assert z.namelist() == ["001.opus", "002.mp3"]
            for name in z.namelist():
                assert_speech(decode(name.split(".")[1], z.read(name), RATE), RATE,
                              min_seconds=0.2)


async def test_batch_runs_items_side_by_side(start) -> None:  # type: ignore[no-untyped-def]
    """The items' syntheses overlap (every item shares the batch's arrival time, so each
    record's queue and synthesis times place it on one clock), as many at a time as the
    engine has workers (two here), and the ZIP keeps the order asked for."""
    srv = await start()
    texts = ["Turn on the kitchen lights.", "The front door is open.",
             "Dinner is ready.", "It will rain this afternoon.", "The laundry is done.",
             "Good night."]
    async with srv.session.post(f"{srv.url}/tts/batch", json=[
            {"text": t, "filename": f"n{i}", "seed": SEED} for i, t in enumerate(texts)]) as r:
        assert r.status == 200, await r.text()
        with zipfile.ZipFile(io.BytesIO(await r.read())) as z:
            assert z.namelist() == [f"n{i}.wav" for i in range(len(texts))]
            entries = [wav_samples(z.read(n))[0] for n in z.namelist()]
    records = await srv.wait_record(len(texts))
    spans = [(rec.queue_ms, rec.queue_ms + rec.synth_ms) for rec in records]
    most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert most == srv.ctx.engine.workers == 2, f"{most} items at once: {spans}"
    for text, got in zip(texts, entries):  # each entry is its own text, not a neighbour's
        async with srv.session.post(f"{srv.url}/tts", json={"text": text, "seed": SEED}) as r:
            assert_pcm_close(got, wav_samples(await r.read())[0])


def _pipes() -> int:
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if _link(fd).startswith("pipe:"))


def _link(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


async def test_client_hanging_up_frees_the_encoder(start) -> None:  # type: ignore[no-untyped-def]
    """Opus and MP3 streams dropped mid-way, their encoding jobs perhaps still running:
    the record says stopped, no encoder's pipe stays open, herald keeps serving."""
    srv = await start()
    before = _pipes()
    for n, name in enumerate(("opus", "mp3"), start=1):
        async with srv.session.post(f"{srv.url}/tts/stream", json={
                "text": " ".join([LONG_SENTENCE] * 3), "response_format": name}) as r:
            assert r.status == 200
            await r.content.readany()
            r.close()
        records = await srv.wait_record(n)
        assert records[-1].outcome == "stopped"
    deadline = time.monotonic() + 5
    while _pipes() > before and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _pipes() == before
    async with srv.session.post(f"{srv.url}/tts", json={"text": TEXT,
                                                       "response_format": "opus"}) as r:
        assert r.status == 200
        assert_speech(decode("opus", await r.read(), RATE), RATE, min_seconds=1)


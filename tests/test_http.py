"""The HTTP API over real HTTP: an in-process server on a free port, aiohttp as the client.

Each test starts its own ``HttpFront`` (cheap) on the test's event loop, over one engine for
the module (the voice loads once). Latency records are caught with a metrics listener.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import time
import wave
import zipfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from audio_checks import assert_pcm_close, assert_speech, pcm16, reference_pcm
from prometheus_client.parser import text_string_to_metric_families

from daemon.context import Context
from daemon.fronts.http import HttpFront, HttpSettings
from daemon.fronts.http.batch import unique_filename
from daemon.jobs.metrics import LatencyRecord, Metrics
from tts import SynthesisOptions

SHORT = "Hello there."
# One long sentence and two more: several seconds of audio, a second or more of synthesis.
LONG = ("The quick brown fox jumps over the lazy dog, while the old clock in the hall strikes "
        "the hour and the rain keeps falling on the quiet street outside. It was a bright cold "
        "day in April. The kettle began to sing in the kitchen.")
SEED = 7


@dataclass
class Server:
    front: HttpFront
    ctx: Context
    session: aiohttp.ClientSession
    records: list[LatencyRecord] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.front.port}"

    async def wait_record(self, n: int = 1, timeout: float = 20.0) -> list[LatencyRecord]:
        deadline = time.monotonic() + timeout
        while len(self.records) < n:
            assert time.monotonic() < deadline, f"{len(self.records)} latency records, want {n}"
            await asyncio.sleep(0.02)
        return self.records


@pytest.fixture(scope="module")
def long_reference(catalog) -> bytes:  # type: ignore[no-untyped-def]
    """PCM of LONG with the test seed, synthesized straight through tts (no HTTP)."""
    return reference_pcm(catalog.synthesizer(), LONG, SynthesisOptions(seed=SEED))


@pytest.fixture
async def start(engine) -> AsyncIterator[Callable[..., Awaitable[Server]]]:  # type: ignore[no-untyped-def]
    servers: list[Server] = []
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))

    async def start(**settings: Any) -> Server:
        ctx = Context(engine, Metrics(), "test-version")
        front = HttpFront(HttpSettings(port=0, **settings), ctx)
        await front.start()
        await engine.preload()  # as the service does before READY
        server = Server(front, ctx, session)
        ctx.metrics.add_listener(server.records.append)
        servers.append(server)
        return server

    yield start
    await session.close()
    for s in servers:
        await s.front.stop()


def wav_samples(body: bytes) -> tuple[np.ndarray, int]:
    with wave.open(io.BytesIO(body)) as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
        return pcm16(w.readframes(w.getnframes())), w.getframerate()


async def error_of(resp: aiohttp.ClientResponse) -> str:
    assert resp.content_type == "application/json"
    body = await resp.json()
    assert isinstance(body["error"], str) and body["error"]
    return str(body["error"])


async def openai_error_of(resp: aiohttp.ClientResponse, param: str | None) -> str:
    """The message of an error in OpenAI's shape, which its client libraries read."""
    assert resp.content_type == "application/json"
    error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert isinstance(error["message"], str) and error["message"]
    return str(error["message"])


# --------------------------------------------------------------------------- audio endpoints

async def test_tts_returns_a_wav_of_speech(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start()
    async with srv.session.post(f"{srv.url}/tts", json={"text": SHORT}) as r:
        assert r.status == 200
        assert r.content_type == "audio/wav"
        body = await r.read()
    samples, rate = wav_samples(body)
    assert rate == 22050
    assert_speech(samples, rate, min_seconds=0.4, max_seconds=3)
    (rec,) = await srv.wait_record()
    assert (rec.front, rec.sink, rec.voice, rec.outcome) == ("http", "http", "en_US-joe-medium",
                                                              "ok")
    assert rec.id == r.headers["X-Herald-Id"]
    assert rec.audio_ms == pytest.approx(len(samples) / rate * 1000, abs=0.1)


async def test_form_fields_and_rate(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start()
    lengths = {}
    for rate in ("0.5", "1.5"):  # urlencoded form; rate is the length scale
        # one seed for both, so the duration noise can't narrow the gap between them
        async with srv.session.post(f"{srv.url}/tts",
                                    data={"text": SHORT, "rate": rate, "seed": "7"}) as r:
            assert r.status == 200, await r.text()
            samples, sr = wav_samples(await r.read())
        assert_speech(samples, sr, min_seconds=0.2)
        lengths[rate] = len(samples)
    assert lengths["1.5"] > 2 * lengths["0.5"]

    form = aiohttp.FormData()  # multipart, the text as an uploaded file
    form.add_field("text", SHORT.encode(), filename="say.txt", content_type="text/plain")
    form.add_field("voice", "en_US-joe-medium")
    async with srv.session.post(f"{srv.url}/tts", data=form) as r:
        assert r.status == 200, await r.text()
        assert_speech(*wav_samples(await r.read()), min_seconds=0.4)

    # text/plain body, other fields from the query string
    async with srv.session.post(f"{srv.url}/tts?voice=en_US-joe-medium", data=SHORT.encode(),
                                headers={"Content-Type": "text/plain"}) as r:
        assert r.status == 200, await r.text()
        assert_speech(*wav_samples(await r.read()), min_seconds=0.4)


async def test_stream_sends_audio_before_synthesis_is_done(start, long_reference) -> None:  # type: ignore[no-untyped-def]
    srv = await start()
    body = bytearray()
    first_audio = last = 0.0
    sent = time.monotonic()
    async with srv.session.post(f"{srv.url}/tts/stream",
                                json={"text": LONG, "seed": SEED}) as r:
        assert r.status == 200
        assert r.content_type == "audio/wav"
        assert "Content-Length" not in r.headers  # chunked: the length is not known up front
        async for data in r.content.iter_any():
            body += data
            if not first_audio and len(body) > 44:
                first_audio = time.monotonic()
            last = time.monotonic()
    (rec,) = await srv.wait_record()

    assert body[:4] == b"RIFF" and body[8:16] == b"WAVEfmt "
    with wave.open(io.BytesIO(bytes(body))) as w:  # the streaming header parses as a WAV
        assert w.getframerate() == 22050
    pcm = bytes(body[44:])
    assert_pcm_close(pcm, long_reference)  # nothing lost, duplicated or reordered on the way
    assert_speech(pcm16(pcm), 22050, min_seconds=5)

    synth_done = (rec.queue_ms + rec.synth_ms) / 1000  # after the server received the request
    assert rec.first_audio_ms / 1000 < synth_done
    # The client sent before the server received, so this is the client's own clock showing
    # the first audio arriving while the server was still synthesizing.
    assert first_audio - sent < synth_done
    assert first_audio < last


async def test_tts_stream_flag_streams(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start()
    async with srv.session.post(f"{srv.url}/tts", json={"text": SHORT, "stream": True}) as r:
        assert r.status == 200
        assert "Content-Length" not in r.headers
        body = await r.read()
    assert body[4:8] == b"\xff\xff\xff\xff"  # the streaming header: size unknown
    assert_speech(pcm16(body[44:]), 22050, min_seconds=0.4)


async def test_client_hanging_up_stops_the_synthesis(start, long_reference) -> None:  # type: ignore[no-untyped-def]
    srv = await start()
    text = " ".join([LONG] * 4)  # ~4x the reference's audio if it ran to the end
    async with srv.session.post(f"{srv.url}/tts/stream", json={"text": text}) as r:
        assert r.status == 200
        await r.content.readexactly(44 + 2048)
        r.close()  # drop the connection mid-stream
    (rec,) = await srv.wait_record()
    assert rec.outcome == "stopped"
    assert rec.audio_ms < len(long_reference) / 2 / 22050 * 1000  # less than a quarter
    async with srv.session.get(f"{srv.url}/healthz") as r:
        assert (await r.json())["active"] == 0
    async with srv.session.post(f"{srv.url}/tts", json={"text": SHORT}) as r:  # still serving
        assert r.status == 200
        assert_speech(*wav_samples(await r.read()), min_seconds=0.4)


async def test_batch_returns_a_zip_of_named_wavs(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start()
    items = [{"text": "One.", "filename": "greeting"},
             {"text": "Two.", "filename": "greeting.wav"},
             {"text": "Three.", "filename": "../../etc/passwd", "voice": "en_US-joe-medium"},
             {"text": "Four."}]
    async with srv.session.post(f"{srv.url}/tts/batch", json=items) as r:
        assert r.status == 200, await r.text()
        assert r.content_type == "application/zip"
        body = await r.read()
    with zipfile.ZipFile(io.BytesIO(body)) as z:
        assert z.testzip() is None
        assert z.namelist() == ["greeting.wav", "greeting-2.wav", "passwd.wav", "004.wav"]
        for name in z.namelist():
            assert_speech(*wav_samples(z.read(name)), min_seconds=0.2, max_seconds=3)
    records = await srv.wait_record(4)
    assert [rec.outcome for rec in records] == ["ok"] * 4


async def test_ssml_breaks_on_every_endpoint(start) -> None:  # type: ignore[no-untyped-def]
    """format=ssml in JSON, in a form and in a batch item: the break is heard (in samples)."""
    srv = await start()
    plain, ssml = "Wait here.", '<speak>Wait <break time="500ms"/> here.</speak>'
    async with srv.session.post(f"{srv.url}/tts", json={"text": plain, "seed": SEED}) as r:
        assert r.status == 200, await r.text()
        base, rate = wav_samples(await r.read())
    async with srv.session.post(f"{srv.url}/tts", json={"text": ssml, "format": "ssml",
                                                        "seed": SEED}) as r:
        assert r.status == 200, await r.text()
        whole, _ = wav_samples(await r.read())
    async with srv.session.post(f"{srv.url}/tts/stream", data={"text": ssml, "format": "ssml",
                                                               "seed": str(SEED)}) as r:
        assert r.status == 200, await r.text()
        body = await r.read()
    streamed = pcm16(body[44:])  # after the streaming WAV header
    async with srv.session.post(f"{srv.url}/tts/batch", json=[
            {"text": ssml, "format": "ssml", "seed": SEED, "filename": "b"}]) as r:
        assert r.status == 200, await r.text()
        with zipfile.ZipFile(io.BytesIO(await r.read())) as z:
            batched, _ = wav_samples(z.read("b.wav"))
    assert_speech(whole, rate, min_seconds=1.0)
    assert len(whole) - len(base) >= 0.4 * rate  # the 500 ms break
    assert_pcm_close(streamed, whole)  # same seed, same audio
    assert_pcm_close(batched, whole)


def test_batch_filenames_are_safe_and_unique() -> None:
    taken: set[str] = set()
    names = [unique_filename(raw, i, taken) for i, raw in enumerate(
        ["a", "A.WAV", "..\\..\\evil", "/abs/path/x.wav", "", "ünï cödé?", "...", None])]
    assert names == ["a.wav", "A-2.wav", "evil.wav", "x.wav", "005.wav", "ünï_cödé.wav",
                     "007.wav", "008.wav"]


async def test_openai_speech_wav_and_pcm(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start()
    url = f"{srv.url}/v1/audio/speech"
    async with srv.session.post(url, json={"model": "tts-1", "input": SHORT,
                                           "voice": "alloy", "response_format": "wav"}) as r:
        assert r.status == 200, await r.text()
        assert r.content_type == "audio/wav"
        assert r.headers["X-Herald-Voice"] == "en_US-joe-medium"  # OpenAI name -> default
        normal, rate = wav_samples(await r.read())
    assert_speech(normal, rate, min_seconds=0.4)

    async with srv.session.post(url, json={"model": "gpt-4o-mini-tts", "input": SHORT,
                                           "voice": "en_US-joe-medium", "speed": 2.0,
                                           "response_format": "pcm"}) as r:
        assert r.status == 200, await r.text()
        assert r.content_type == "audio/pcm"
        assert (r.headers["X-Sample-Rate"], r.headers["X-Sample-Width"]) == ("22050", "2")
        fast = pcm16(await r.read())
    assert_speech(fast, 22050, min_seconds=0.2)
    assert len(fast) < 0.75 * len(normal)

    async with srv.session.post(url, json={"input": SHORT, "speed": 9}) as r:
        assert r.status == 400
        assert "0.25 to 4.0" in await openai_error_of(r, None)
    async with srv.session.post(url, json={"input": SHORT, "voice": "galadriel"}) as r:
        assert r.status == 404
        assert "en_US-joe-medium" in await openai_error_of(r, None)


# --------------------------------------------------------------------------- the other endpoints

async def test_voices_healthz_and_page(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start()
    async with srv.session.get(f"{srv.url}/voices") as r:
        assert r.status == 200
        voices = await r.json()
    assert voices == [{"name": "en_US-joe-medium", "language": "en_US", "quality": "medium",
                       "sample_rate": 22050, "speakers": 1, "speaker_names": [],
                       "default": True}]
    async with srv.session.get(f"{srv.url}/healthz") as r:
        health = await r.json()
    assert health["status"] == "ok" and health["version"] == "test-version"
    assert health["voices"] == ["en_US-joe-medium"]
    async with srv.session.get(f"{srv.url}/") as r:
        assert r.status == 200 and r.content_type == "text/html"
        page = await r.text()
    assert 'src="static/app.js"' in page
    for asset, kind in (("app.js", "javascript"), ("style.css", "text/css")):
        async with srv.session.get(f"{srv.url}/static/{asset}") as r:
            assert r.status == 200 and kind in r.content_type
            assert "http://" not in await r.text() and "https://" not in await r.text()


def samples_of(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_metrics_count_requests(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start()

    async def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        async with srv.session.get(f"{srv.url}/metrics") as r:
            assert r.status == 200 and r.content_type == "text/plain"
            return samples_of(await r.text())

    ok = ("herald_requests_total", (("front", "http"), ("outcome", "ok")))
    bad = ("herald_requests_total", (("front", "http"), ("outcome", "bad_request")))
    first = ("herald_first_audio_seconds_count", (("front", "http"), ("sink", "http")))
    audio = ("herald_audio_seconds_total", (("front", "http"),))
    before = await scrape()
    async with srv.session.post(f"{srv.url}/tts", json={"text": SHORT}) as r:
        assert r.status == 200
        samples, rate = wav_samples(await r.read())
    async with srv.session.post(f"{srv.url}/tts", json={"text": ""}) as r:
        assert r.status == 400
    after = await scrape()
    assert after[ok] == before.get(ok, 0) + 1
    assert after[bad] == before.get(bad, 0) + 1
    assert after[first] == before.get(first, 0) + 1
    assert after[audio] - before.get(audio, 0) == pytest.approx(len(samples) / rate, abs=1e-3)


async def test_metrics_report_the_process(start) -> None:  # type: ignore[no-untyped-def]
    """The standard process metrics, of the process serving (here, the test's own)."""
    srv = await start()
    async with srv.session.get(f"{srv.url}/metrics") as r:
        got = {name: v for (name, labels), v in samples_of(await r.text()).items()}
    rss_kb = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text()
                  .splitlines() if line.startswith("VmRSS:"))
    # torch and a voice are loaded: hundreds of MB, as /proc says within the scrape's moment
    assert got["process_resident_memory_bytes"] == pytest.approx(rss_kb * 1024, rel=0.1)
    assert got["process_resident_memory_bytes"] > 100e6
    assert 0 < got["process_open_fds"] <= len(os.listdir("/proc/self/fd")) + 5
    assert got["process_start_time_seconds"] <= time.time()
    assert "python_gc_objects_collected_total" in got and "python_info" in got


# --------------------------------------------------------------------------- refusals

BAD_REQUESTS = [
    # (id, path, request kwargs, status, words the error must contain)
    ("invalid json", "/tts", {"data": b'{"text": "hi"', "headers": {
        "Content-Type": "application/json"}}, 400, "malformed JSON"),
    ("invalid utf-8 json", "/tts", {"data": b'{"text": "caf\xe9"}', "headers": {
        "Content-Type": "application/json"}}, 400, "not valid UTF-8"),
    ("invalid utf-8 form", "/tts", {"data": b"text=caf%E9", "headers": {
        "Content-Type": "application/x-www-form-urlencoded"}}, 400, "not valid UTF-8"),
    ("binary junk", "/tts", {"data": bytes(range(256)), "headers": {
        "Content-Type": "text/plain"}}, 400, "not valid UTF-8"),
    ("missing text", "/tts", {"json": {"voice": "en_US-joe-medium"}}, 400, "missing 'text'"),
    ("empty text", "/tts", {"json": {"text": "  \n "}}, 400, "empty"),
    ("control characters only", "/tts", {"json": {"text": "\x00\x01\x02"}}, 400,
     "control character"),
    ("nothing to pronounce", "/tts/stream", {"json": {"text": "..."}}, 400, "pronounce"),
    ("text not a string", "/tts", {"json": {"text": ["hi"]}}, 400, "must be a string"),
    ("body not an object", "/tts", {"json": ["hi"]}, 400, "must be an object"),
    ("misspelt field", "/tts", {"json": {"text": "hi", "voise": "x"}}, 400,
     "unknown field 'voise'"),
    ("rate not a number", "/tts", {"json": {"text": "hi", "rate": "fast"}}, 400, "number"),
    ("rate out of range", "/tts", {"json": {"text": "hi", "rate": 0}}, 400, "0.25 to 4.0"),
    ("stream not a bool", "/tts", {"json": {"text": "hi", "stream": "maybe"}}, 400,
     "true or false"),
    ("speaker of a single-speaker voice", "/tts", {"json": {"text": "hi", "speaker": 3}}, 400,
     "single speaker"),
    ("unknown voice", "/tts/stream", {"json": {"text": "hi", "voice": "xx_XX-nobody-low"}},
     404, "installed: en_US-joe-medium"),
    ("text too long", "/tts", {"json": {"text": "word " * 20}}, 413, "limit is 50"),
    ("batch too big", "/tts/batch", {"json": [{"text": "hi"}] * 51}, 413, "limit is 50"),
    ("batch item bad", "/tts/batch", {"json": [{"text": "hi"}, {"text": ""}]}, 400,
     "item 1: empty 'text'"),
    ("batch empty", "/tts/batch", {"json": []}, 400, "empty"),
    ("malformed ssml", "/tts", {"json": {"text": "<speak>hi <break></speak>",
                                         "format": "ssml"}}, 400, "malformed SSML at line 1"),
    ("malformed ssml in a form", "/tts/stream", {"data": {"text": "<speak>hi",
                                                          "format": "ssml"}}, 400,
     "malformed SSML"),
    ("malformed ssml in a batch", "/tts/batch", {"json": [
        {"text": "hi"}, {"text": "<s>hi</p>", "format": "ssml"}]}, 400,
     "item 1: malformed SSML"),
    ("unknown format", "/tts", {"json": {"text": "hi", "format": "markdown"}}, 400,
     "'format' must be one of text, ssml"),
    ("body too large", "/tts", {"json": {"text": "x" * 5000}}, 413, "http.max_body_bytes"),
    ("unsupported type", "/tts", {"data": b"<x/>", "headers": {
        "Content-Type": "application/xml"}}, 415, "application/json"),
    ("unknown endpoint", "/speak", {"json": {"text": "hi"}}, 404, "no such endpoint"),
    ("unpaired surrogate", "/tts", {"data": b'{"text": "hi \\ud800"}', "headers": {
        "Content-Type": "application/json"}}, 400, "unpaired UTF-16 surrogate (U+D800)"),
    ("JSON nested too deeply", "/tts", {"data": b'{"text": "hi", "x": ' + b"[" * 2000
                                        + b"]" * 2000 + b"}", "headers": {
        "Content-Type": "application/json"}}, 400, "nested too deeply"),
    ("batch nested too deeply", "/tts/batch", {"data": b"[" * 2000 + b"]" * 2000, "headers": {
        "Content-Type": "application/json"}}, 400, "nested too deeply"),
    ("rate beyond any float", "/tts", {"data": b'{"text": "hi", "rate": 1' + b"0" * 400 + b"}",
                                       "headers": {"Content-Type": "application/json"}}, 400,
     "'rate' must be a number from 0.25 to 4.0, not 1000"),
    ("seed with a fraction", "/tts", {"json": {"text": "hi", "seed": 1.5}}, 400,
     "'seed' must be a whole number"),
    ("speaker with a fraction", "/tts", {"json": {"text": "hi", "speaker": 1.5}}, 400,
     "a whole number (its index), not 1.5"),
]
REASONS = {400: "bad_request", 404: "not_found", 413: "too_large", 415: "unsupported_media_type"}


@pytest.mark.parametrize("path,kwargs,status,words", [b[1:] for b in BAD_REQUESTS],
                         ids=[b[0] for b in BAD_REQUESTS])
async def test_bad_requests_get_a_clear_error(start, path, kwargs, status, words) -> None:  # type: ignore[no-untyped-def]
    srv = await start(max_text_chars=50, max_body_bytes=4096)
    async with srv.session.post(srv.url + path, **kwargs) as r:
        assert r.status == status
        assert words in await error_of(r)
    assert srv.records == []  # refused before any audio
    reason = "unknown_voice" if "installed:" in words else REASONS[status]
    assert srv.ctx.metrics.registry.get_sample_value(
        "herald_requests_total", {"front": "http", "outcome": reason}) == 1
    async with srv.session.post(f"{srv.url}/tts", json={"text": SHORT}) as r:
        assert r.status == 200  # and the next client is served


async def test_a_huge_bad_value_is_not_echoed_whole(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start()
    async with srv.session.post(f"{srv.url}/tts", json={"text": "hi", "seed": "nine" * 750}) as r:
        assert r.status == 400
        message = await error_of(r)
    assert message.startswith("'seed' must be a whole number") and len(message) < 200


async def test_wrong_method_is_refused(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start()
    async with srv.session.get(f"{srv.url}/tts") as r:
        assert r.status == 405
        assert "POST" in r.headers["Allow"]
        await error_of(r)


async def test_bound_beyond_loopback_without_a_token_warns(start, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING, logger="daemon.fronts.http")
    await start(host="127.0.0.1")
    await start(host="0.0.0.0", token="s3cret")
    assert "without http.token" not in caplog.text
    await start(host="0.0.0.0")
    assert "HTTP is bound to 0.0.0.0 without http.token" in caplog.text
    with pytest.raises(ValueError, match="at least 1 character"):
        HttpSettings(host="")  # asyncio would read it as every interface


async def test_bearer_token(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start(token="s3cret")
    for path in ("/voices", "/metrics"):
        async with srv.session.get(srv.url + path) as r:
            assert r.status == 401
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            assert "Bearer" in await error_of(r)
    async with srv.session.post(f"{srv.url}/tts", json={"text": SHORT},
                                headers={"Authorization": "Bearer wrong"}) as r:
        assert r.status == 401
    async with srv.session.post(f"{srv.url}/tts", json={"text": SHORT},
                                headers={"Authorization": "Bearer s3cret"}) as r:
        assert r.status == 200
        assert_speech(*wav_samples(await r.read()), min_seconds=0.4)
    for path in ("/healthz", "/", "/static/app.js"):  # no data there; the page asks for it
        async with srv.session.get(srv.url + path) as r:
            assert r.status == 200, path


async def test_too_many_at_once_get_429(start) -> None:  # type: ignore[no-untyped-def]
    srv = await start(max_concurrent=1, retry_after_seconds=3)
    async with srv.session.post(f"{srv.url}/tts/stream", json={"text": LONG}) as busy:
        assert busy.status == 200
        await busy.content.readexactly(44 + 1024)  # the slot is taken for sure now
        async with srv.session.post(f"{srv.url}/tts", json={"text": SHORT}) as r:
            assert r.status == 429
            assert r.headers["Retry-After"] == "3"
            assert "http.max_concurrent" in await error_of(r)
        async with srv.session.get(f"{srv.url}/healthz") as r:  # not a synthesis: served
            assert (await r.json())["active"] == 1
        rest = await busy.read()
    assert_speech(pcm16(rest), 22050, min_seconds=3)
    async with srv.session.post(f"{srv.url}/tts", json={"text": SHORT}) as r:
        assert r.status == 200
    assert srv.ctx.metrics.registry.get_sample_value(
        "herald_requests_total", {"front": "http", "outcome": "busy"}) == 1


def test_only_a_client_that_takes_the_audio_whole_gets_it_made_whole() -> None:
    """``Request.whole`` (largest windows from the start) only where nobody listens before
    the end: not beside a speaker or an MQTT stream, not for a streaming client."""
    from daemon.jobs.request import Request
    from daemon.sinks.client import ClientSink

    assert Request(text="x", sinks=(), client=ClientSink("http", whole=True)).whole
    assert not Request(text="x", sinks=("speaker",), client=ClientSink("http", whole=True)).whole
    assert not Request(text="x", sinks=("mqtt",), client=ClientSink("http", whole=True)).whole
    assert not Request(text="x", sinks=(), client=ClientSink("http")).whole
    assert not Request(text="x", sinks=("speaker",)).whole

"""The kiosk page in a real headless Chromium (Playwright), against an in-process server.

The page keeps its own timestamps on ``window.heraldStats``; the test reads them to show
that playback was scheduled, and the audio clock had passed its start, before the response
finished: the page speaks while the server is still synthesizing.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from daemon.context import Context
from daemon.fronts.http import HttpFront, HttpSettings
from daemon.jobs.metrics import Metrics
from daemon.synthesis.engine import Engine

try:
    import playwright.async_api as playwright
except ImportError:  # a real browser is the point of this file: a missing one is a failure
    pytest.fail("playwright is not installed: run scripts/setup --test", pytrace=False)

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync",
        "--autoplay-policy=no-user-gesture-required"]  # Playwright adds --headless
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
LONG = ("The quick brown fox jumps over the lazy dog, while the old clock in the hall strikes "
        "the hour and the rain keeps falling on the quiet street outside. It was a bright cold "
        "day in April. The kettle began to sing in the kitchen.")


async def serve(engine: Engine, **settings: Any) -> HttpFront:
    front = HttpFront(HttpSettings(port=0, **settings), Context(engine, Metrics(), "test"))
    await front.start()
    await engine.preload()  # as the service does before READY: first audio, not load time
    return front


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Any]:
    """A fresh Chromium profile per test."""
    async with playwright.async_playwright() as p:
        context = await p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
            args=ARGS, viewport={"width": 1000, "height": 1000})
        yield context
        await context.close()


@pytest.mark.alone  # Stop must be clicked while the audio still plays (tests/parallel.py)
async def test_page_plays_while_the_audio_streams(engine, browser) -> None:  # type: ignore[no-untyped-def]
    front = await serve(engine)
    try:
        page = await browser.new_page()
        page_errors: list[str] = []
        page.on("pageerror", lambda e: page_errors.append(str(e)))
        await page.goto(f"http://127.0.0.1:{front.port}/")
        await page.wait_for_function("window.heraldStats.voices.length > 0")
        assert await page.locator("#voice option").all_inner_texts() == ["en_US-joe-medium"]
        assert await page.locator("#speaker-field").is_hidden()  # a single-speaker voice
        assert await page.locator("#status").inner_text() == "1 voice ready"

        await page.fill("#text", LONG)
        await page.fill("#speed", "1")
        await page.click("#speak")
        await page.wait_for_function(
            "window.heraldStats.last && window.heraldStats.last.responseDoneAt !== null",
            timeout=60_000)
        req = await page.evaluate("""(() => {
            const r = window.heraldStats.last;
            return {status: r.status, error: r.error, id: r.id, sentAt: r.sentAt,
                    firstAudioAt: r.firstAudioAt, responseDoneAt: r.responseDoneAt,
                    startCtxTime: r.startCtxTime, audioClockAtDone: r.audioClockAtDone,
                    audioSeconds: r.audioSeconds, rate: r.format.rate};
        })()""")
        assert req["status"] == 200 and req["error"] is None, req
        assert req["rate"] == 22050
        assert req["audioSeconds"] > 5
        # The first AudioBufferSourceNode was started before the fetch finished ...
        assert req["sentAt"] < req["firstAudioAt"] < req["responseDoneAt"]
        # ... and the audio clock had passed its start time: sound was already playing.
        assert req["audioClockAtDone"] > req["startCtxTime"]

        # The latency and the real-time factor are shown.
        first_audio = await page.locator("#first-audio").inner_text()
        assert re.fullmatch(r"\d+ ms", first_audio), first_audio
        assert abs(int(first_audio.split()[0]) - (req["firstAudioAt"] - req["sentAt"])) <= 0.5
        rtf = await page.locator("#rtf").inner_text()
        assert re.fullmatch(r"\d+\.\d\d", rtf), rtf
        assert await page.locator("#history tr").count() == 1

        # The waveform was drawn: ink across most of the canvas width.
        ink = await page.evaluate("""(() => {
            const c = document.getElementById("wave");
            const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            const columns = new Set();
            for (let i = 3; i < d.length; i += 4) {
                if (d[i] > 0) columns.add(((i - 3) / 4) % c.width);
            }
            return {columns: columns.size, width: c.width};
        })()""")
        assert ink["columns"] > ink["width"] / 2, ink

        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "web.png"), full_page=True)
        await page.click("#stop")
        assert page_errors == []
    finally:
        await front.stop()


async def test_page_asks_for_the_token_and_shows_errors(engine, browser) -> None:  # type: ignore[no-untyped-def]
    front = await serve(engine, token="kiosk-token", max_text_chars=20)
    try:
        page = await browser.new_page()
        await page.goto(f"http://127.0.0.1:{front.port}/")  # the page itself needs no token
        await page.wait_for_function(
            "document.getElementById('status').textContent === 'access token needed'")
        assert await page.locator("#token-box").get_attribute("open") is not None
        assert "access token" in await page.locator("#error").inner_text()

        await page.fill("#token", "kiosk-token")
        await page.dispatch_event("#token", "change")
        await page.wait_for_function("window.heraldStats.voices.length > 0")
        assert await page.locator("#error").is_hidden()

        await page.fill("#text", "This sentence is longer than twenty characters.")
        await page.click("#speak")
        await page.wait_for_function("window.heraldStats.last && window.heraldStats.last.error")
        error = await page.locator("#error").inner_text()
        assert "limit is 20" in error and "http.max_text_chars" in error
        assert await page.evaluate("window.heraldStats.last.status") == 413
        assert await page.locator("#speak").is_enabled()  # ready for the next try
        assert "⚠" in await page.locator("#history tr td.text").inner_text()
    finally:
        await front.stop()


async def test_page_keeps_only_the_last_requests(engine, browser) -> None:  # type: ignore[no-untyped-def]
    """A kiosk page stays open for months: window.heraldStats must not keep every request
    (with its waveform peaks) forever. Refused requests are cheap to make many of."""
    front = await serve(engine, max_text_chars=5)
    try:
        page = await browser.new_page()
        await page.goto(f"http://127.0.0.1:{front.port}/")
        await page.wait_for_function("window.heraldStats.voices.length > 0")
        kept = await page.evaluate("window.heraldStats.kept")
        assert kept == 50
        for i in range(kept + 5):
            await page.fill("#text", f"request number {i}")
            await page.click("#speak")
            await page.wait_for_function(
                f"window.heraldStats.last && window.heraldStats.last.text === 'request number {i}'"
                " && window.heraldStats.last.status === 413")
        texts = await page.evaluate("window.heraldStats.requests.map(r => r.text)")
        assert texts == [f"request number {i}" for i in range(5, kept + 5)]
    finally:
        await front.stop()

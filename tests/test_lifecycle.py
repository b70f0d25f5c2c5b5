"""One job lifecycle for every front: HTTP and Wyoming work is the scheduler's, so what
watches the scheduler (``/metrics``' gauges, the watchdog) sees it, and a client that goes
away stops its job at once.

An HTTP front and a Wyoming front share one Context (one scheduler, one engine) in the
test's event loop, over real TCP: aiohttp and the ``wyoming`` library as the clients.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from audio_checks import assert_speech, pcm16
from conftest import free_port
from prometheus_client.parser import text_string_to_metric_families
from waiting import until
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.event import write_event
from wyoming.tts import Synthesize

from daemon.context import Context
from daemon.fronts.http import HttpFront, HttpSettings
from daemon.fronts.wyoming import WyomingFront, WyomingSettings
from daemon.jobs.metrics import LatencyRecord, Metrics
from daemon.synthesis.engine import Engine
from daemon.systemd import Watchdog

GUARD = 60.0  # a hang guard, never a performance threshold
# One sentence of about ten seconds of audio.
LONG = ("The weather service says that a band of heavy rain will reach the coast this evening, "
        "bringing strong winds, falling temperatures and the chance of thunder before it "
        "clears out early tomorrow morning.")
SHORT = "Turn on the kitchen lights."


@dataclass
class Fronts:
    ctx: Context
    http: HttpFront
    wyoming: WyomingFront
    wyoming_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.port}"

    def wyoming_client(self) -> AsyncTcpClient:
        return AsyncTcpClient("127.0.0.1", self.wyoming_port, connect_timeout=10,
                              read_timeout=GUARD)

    async def gauges(self) -> tuple[float, float]:
        """``herald_active_syntheses`` and ``herald_queue_depth`` as /metrics reports them."""
        async with aiohttp.ClientSession() as session, \
                session.get(f"{self.url}/metrics") as r:
            text = await r.text()
        values = {s.name: s.value for family in text_string_to_metric_families(text)
                  for s in family.samples}
        return values["herald_active_syntheses"], values["herald_queue_depth"]


async def start_fronts(engine: Engine, http_settings: dict[str, object] | None = None,
                       **wyoming: object) -> Fronts:
    ctx = Context(engine, Metrics(), "test-version")
    port = free_port()
    http = HttpFront(HttpSettings(port=0, **(http_settings or {})), ctx)  # type: ignore[arg-type]
    front = WyomingFront(WyomingSettings(uri=f"tcp://127.0.0.1:{port}", **wyoming), ctx)
    await http.start()
    await front.start()
    await engine.preload()
    return Fronts(ctx, http, front, port)


@pytest.fixture
async def fronts(engine: Engine) -> AsyncIterator[list[Fronts]]:
    started: list[Fronts] = []
    yield started
    for f in started:
        await f.wyoming.stop()
        await f.http.stop()


def stalled_wyoming_client(port: int, text: str) -> socket.socket:
    """Sends one ``synthesize`` and never reads (a tiny receive buffer fills at once)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    with sock.makefile("wb") as f:
        write_event(Synthesize(text).event(), f)
    return sock


async def test_metrics_count_http_and_wyoming_work_while_it_runs(
        engine: Engine, fronts: list[Fronts]) -> None:
    f = await start_fronts(engine)
    fronts.append(f)
    assert await f.gauges() == (0, 0)
    async with aiohttp.ClientSession() as session, \
            session.post(f"{f.url}/tts/stream", json={"text": LONG}) as r:
        assert r.status == 200
        await r.content.readexactly(44 + 2048)  # synthesizing now
        assert await f.gauges() == (1, 0)
        async with f.wyoming_client() as client:
            await client.write_event(Synthesize(LONG).event())
            while (event := await client.read_event()) is not None:
                if AudioChunk.is_type(event.type):
                    break  # both are synthesizing now
            assert await f.gauges() == (2, 0)
        rest = await r.read()  # the Wyoming client has gone: its job ends, HTTP's goes on
    assert_speech(pcm16(rest), 22050, min_seconds=3)
    await until(lambda: f.ctx.scheduler.count() == 0, "both jobs ended")
    assert await f.gauges() == (0, 0)


async def test_the_watchdog_starves_while_a_wyoming_job_makes_no_progress(
        engine: Engine, fronts: list[Fronts]) -> None:
    """A Wyoming job held by its client (which stopped reading) makes no progress: the
    watchdog sees the job (busy) and stops petting. In the daemon, wyoming.write_timeout
    (30 s) drops such a client long before the watchdog's limit (60 s), so only a job that
    hangs inside herald starves it; here the write timeout is longer than the test's
    stall limit to show the watchdog looks at Wyoming work at all."""
    f = await start_fronts(engine, write_timeout=600, send_buffer=4096)
    fronts.append(f)
    dog = Watchdog(busy=f.ctx.scheduler.busy, interval=0.2, stall_after=1.0)
    f.ctx.scheduler.on_progress = dog.progress
    assert dog.healthy()  # idle
    stalled = stalled_wyoming_client(f.wyoming_port, f"{LONG} {LONG}")
    try:
        await until(lambda: f.ctx.scheduler.busy(), "the Wyoming job running")
        await until(lambda: not dog.healthy(), "the watchdog giving up")
        assert f.ctx.scheduler.busy()
    finally:
        stalled.close()
    await until(lambda: not f.ctx.scheduler.busy(), "the job stopped")
    assert dog.healthy()


@pytest.mark.alone  # the disconnects read while no neighbour holds the event loop back
async def test_abandoned_wyoming_requests_stop_at_once(engine: Engine,
                                                       fronts: list[Fronts]) -> None:
    """20 clients ask for ten seconds of speech each and hang up at once: their jobs stop
    as soon as the disconnects are read, so a request sent right after is not held up.

    Measured in audio, not in time: together the twenty make less than one of them would
    (a slow host makes less before the disconnects are read, not more), where jobs left to
    run would make 200 seconds ahead of the next request."""
    f = await start_fronts(engine)
    fronts.append(f)
    records: list[LatencyRecord] = []
    f.ctx.metrics.add_listener(records.append)
    clients = []
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", f.wyoming_port))
        with sock.makefile("wb") as w:
            write_event(Synthesize(LONG).event(), w)
        clients.append(sock)
    await until(lambda: f.ctx.scheduler.count() == 20, "20 jobs running")
    for sock in clients:
        sock.close()
    async with f.wyoming_client() as client:
        await client.write_event(Synthesize(SHORT).event())
        heard = 0
        while (event := await client.read_event()) is not None:
            if AudioChunk.is_type(event.type):
                heard += len(AudioChunk.from_event(event).audio)
            if event.type == "audio-stop":
                break
    assert heard > 0
    await until(lambda: any(r.outcome == "ok" for r in records), "the good request's record")
    assert f.ctx.scheduler.count() == 0  # the twenty ended before it did
    # Only the good request finished; an abandoned one that made audio says it stopped.
    assert [r.outcome for r in records].count("ok") == 1, records
    assert all(r.outcome in ("ok", "stopped") for r in records), records
    made = sum(r.audio_ms for r in records if r.outcome == "stopped") / 1000
    assert made < 9.0, f"the abandoned requests made {made:.1f} s of audio"

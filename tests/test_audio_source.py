"""The scheduler playing audio made elsewhere (``Request.source``, what a satellite's requests
carry: audio from a fleet worker), with no engine at all: the same lanes, events, stop, cue
and latency record as a synthesized request.

``Feed`` is a source as the contract (``daemon.synthesis.contracts.AudioSource``) describes it: it
yields its PCM piece by piece at a pace, and records when it was opened and whether it was closed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncGenerator

import pytest
from test_scheduler import PacedSpeaker, rig
from waiting import until

from daemon.errors import RequestError
from daemon.jobs.request import Request
from tts import AudioFormat

RATE = 16000
PIECE = 1600  # samples: 0.1 s


def tone(seconds: float, freq: float = 440.0) -> bytes:
    """A recognisable signal (not speech: only its bytes are compared here)."""
    n = int(seconds * RATE)
    return b"".join(int(8000 * math.sin(2 * math.pi * freq * i / RATE)).to_bytes(
        2, "little", signed=True) for i in range(n))


class Feed:
    def __init__(self, pcm: bytes, pace: float = 0.0, fail_after: int | None = None,
                 preroll: float = 0.0) -> None:
        self.data = pcm
        self.pace = pace  # seconds between pieces
        self.fail_after = fail_after  # pieces, then a RequestError
        self.opened: float | None = None
        self.closed = False
        self.sent = 0
        self.waiting = False  # the text it says is still being written
        self.preroll = preroll  # what it asks the speaker to buffer before it plays

    @property
    def format(self) -> AudioFormat:
        return AudioFormat(RATE)

    async def pcm(self) -> AsyncGenerator[bytes, None]:
        self.opened = time.monotonic()
        try:
            for start in range(0, len(self.data), PIECE * 2):
                if self.fail_after is not None and self.sent == self.fail_after:
                    raise RequestError("no herald worker answered", code="unavailable")
                await asyncio.sleep(self.pace)
                self.sent += 1
                yield self.data[start:start + PIECE * 2]
        finally:
            self.closed = True


def played(rid: str, source: Feed, **kw: object) -> Request:
    kw.setdefault("sinks", ("mqtt",))
    return Request(text="what the worker says", id=rid, voice="somewhere-voice",
                   source=source, **kw)  # type: ignore[arg-type]


async def test_audio_from_a_source_plays_without_an_engine() -> None:
    r = rig(None)  # type: ignore[arg-type]
    pcm = tone(1.0)
    feed = Feed(pcm, pace=0.01)
    outcome = await asyncio.wait_for(r.scheduler.submit(played("s1", feed)), 10)
    assert outcome == "finished"
    assert [kind for _, kind in r.events] == ["queued", "started", "finished"]
    assert bytes(r.recorder.streams["s1"].pcm) == pcm
    [rec] = r.records
    assert (rec.outcome, rec.voice, rec.audio_ms) == ("ok", "somewhere-voice", 1000.0)
    assert rec.synth_ms >= 90  # the source's time counts as the synthesis'
    assert feed.closed
    with pytest.raises(RequestError, match="no model") as e:
        r.scheduler.submit(Request(text="Say this here.", id="t", sinks=("mqtt",)))
    assert e.value.code == "unavailable"


async def test_stopping_a_request_closes_its_source() -> None:
    r = rig(None)  # type: ignore[arg-type]
    feed = Feed(tone(5.0), pace=0.05)
    done = r.scheduler.submit(played("long", feed))
    await until(lambda: feed.sent >= 3, "three pieces sent", 5)
    r.scheduler.stop("long")
    assert await asyncio.wait_for(done, 5) == "stopped"
    await until(lambda: feed.closed, "the feed closed", 5)
    assert feed.sent < 20
    assert r.events[-1] == ("long", "stopped")
    assert r.records[-1].outcome == "stopped"


async def test_a_source_waiting_for_text_is_not_stuck() -> None:
    """While a source waits for its text to be written (an LLM streaming to a satellite),
    the watchdog must not take the request for stuck synthesis."""
    r = rig(None)  # type: ignore[arg-type]
    feed = Feed(tone(5.0), pace=0.05)
    done = r.scheduler.submit(played("w", feed))
    await until(lambda: feed.sent >= 1, "a piece sent", 5)
    assert r.scheduler.busy()
    feed.waiting = True
    assert not r.scheduler.busy()
    r.scheduler.stop("w")
    await asyncio.wait_for(done, 5)


async def test_a_failing_source_is_an_error_event_after_its_audio() -> None:
    r = rig(None)  # type: ignore[arg-type]
    pcm = tone(1.0)
    errors: list[dict[str, object]] = []
    r.scheduler.add_listener(lambda ev: errors.append(ev) if ev["event"] == "error" else None)
    outcome = await asyncio.wait_for(r.scheduler.submit(played("f", Feed(pcm, fail_after=4))),
                                     10)
    assert outcome == "error"
    assert bytes(r.recorder.streams["f"].pcm) == pcm[:4 * PIECE * 2]
    [ev] = errors
    assert ev["code"] == "unavailable" and "no herald worker" in str(ev["error"])


async def test_the_next_source_opens_while_one_plays_and_is_cued_whole() -> None:
    """The speaker lane's prefetch: the next request's source is opened (a fleet job sent)
    while the current one plays, and once it has ended it is the speaker's cue."""
    spk = PacedSpeaker(speed=2.0)
    r = rig(None, speaker=spk)  # type: ignore[arg-type]
    first, second = Feed(tone(2.0), pace=0.01), Feed(tone(0.5, 660.0), pace=0.01)
    done = [r.scheduler.submit(played("p1", first, sinks=("speaker",))),
            r.scheduler.submit(played("p2", second, sinks=("speaker",)))]
    assert await asyncio.wait_for(asyncio.gather(*done), 10) == ["finished", "finished"]
    (_, p1_end, _), (_, _, p2_samples) = spk.played
    assert second.opened is not None and second.opened < p1_end
    [(cued, samples, _, _)] = spk.cues
    assert (cued, samples, p2_samples) == ("p2", RATE // 2, RATE // 2)


async def test_the_speaker_buffers_what_the_source_asks_before_it_plays() -> None:
    """Audio from the network (a satellite's own say: ``fleet.preroll``) asks the speaker
    for a pre-roll; a source that asks for none gets none."""
    spk = PacedSpeaker(speed=8.0)
    r = rig(None, speaker=spk)  # type: ignore[arg-type]
    done = [r.scheduler.submit(played("net", Feed(tone(0.3), preroll=0.15),
                                      sinks=("speaker",))),
            r.scheduler.submit(played("here", Feed(tone(0.3)), sinks=("speaker",)))]
    assert await asyncio.wait_for(asyncio.gather(*done), 10) == ["finished", "finished"]
    assert dict(spk.prerolls) == {"net": 0.15, "here": 0.0}

"""The scheduler in-process, with the real engine: lanes, ordering, prefetch, cut, records.

Two sinks stand in here. ``Recorder`` is a network sink that keeps what it is given (the real
MQTT audio sink is tested end to end in test_mqtt.py). ``PacedSpeaker`` honours the
SpeakerSink contract and takes audio at real-time pace, like a sound card; it exists only so
that *scheduling* facts that need a device clock (prefetch, one-at-a-time, cut) are visible.
The real speaker path through PortAudio and ALSA is exercised by test_mqtt.py, and the same
interrupt and prefetch, heard on a device with a clock, at the end of test_speaker.py.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from audio_checks import assert_pcm_close, assert_speech, pcm16
from waiting import until

from daemon.errors import NOTHING_TO_SAY, RequestError
from daemon.jobs.buffer import AudioBuffer
from daemon.jobs.metrics import LatencyRecord, Metrics
from daemon.jobs.request import Request, TextStream
from daemon.jobs.scheduler import Scheduler
from daemon.settings import SchedulerSettings
from daemon.sinks.client import ClientSink
from daemon.sinks.speaker import PlaybackStats
from daemon.synthesis.engine import Engine
from tts import AudioFormat, SynthesisOptions, UnknownVoice
from tts.compose import Say, Silence, Step


@dataclass
class Stream:
    pcm: bytearray = field(default_factory=bytearray)
    outcome: str | None = None

    def write(self, pcm: bytes) -> None:
        self.pcm += pcm

    def close(self, outcome: str = "finished") -> None:
        self.outcome = outcome


class Recorder:
    name = "mqtt"

    def __init__(self) -> None:
        self.streams: dict[str, Stream] = {}

    def open(self, request_id: str, fmt: AudioFormat) -> Stream:
        self.streams[request_id] = Stream()
        return self.streams[request_id]


class PacedSpeaker:
    """Plays at ``speed`` x real time; records what it played and when, and the cues and cuts
    it was given. (It never starts a cue itself: play() always plays its chunks.) Given a
    start time, it starts then (wall clock), and reports how late its first chunk was."""

    name = "speaker"

    def __init__(self, speed: float = 4.0) -> None:
        self.speed = speed
        self.volume = 1.0
        self.played: list[tuple[float, float, int]] = []  # start, end, samples
        self.cues: list[tuple[str, int, float, float]] = []  # id, samples, pause, when
        self.keys: list[tuple[str, float]] = []  # id and pause of each play
        self.starts: list[tuple[str, float | None, float]] = []  # id, start_at, first chunk
        self.cuts: list[str | None] = []  # the id each cut(key) named (None: the current)
        self.prerolls: list[tuple[str, float]] = []  # id and pre-roll of each play
        self._cut = asyncio.Event()
        self._playing: Any = None  # the key of the play in progress

    def cue(self, key: Any, fmt: AudioFormat, pcm: bytes, pause: float = 0.0,
            on_first_audio: Callable[[], None] | None = None) -> None:
        self.cues.append((key.req.id, len(pcm) // 2, pause, time.monotonic()))

    async def play(self, fmt: AudioFormat, chunks: AsyncIterator[bytes],
                   on_first_audio: Callable[[], None] | None = None, key: Any = None,
                   pause: float = 0.0, start_at: float | None = None,
                   preroll: float = 0.0) -> PlaybackStats:
        self._cut.clear()
        self._playing = key
        self.keys.append((key.req.id, pause))
        self.prerolls.append((key.req.id, preroll))
        start, samples, first, skew = time.monotonic(), 0, True, None
        async for data in chunks:
            if first:
                if start_at is not None:
                    await asyncio.sleep(start_at - time.time())
                began = time.time()  # one reading: the skew and the start record agree
                if start_at is not None:
                    skew = began - start_at
                self.starts.append((key.req.id, start_at, began))
                if on_first_audio:
                    on_first_audio()
            first = False
            samples += len(data) // 2
            try:
                await asyncio.wait_for(self._cut.wait(), len(data) / 2 / fmt.rate / self.speed)
                break
            except TimeoutError:
                pass
        self.played.append((start, time.monotonic(), samples))
        return PlaybackStats(samples=samples, cut=self._cut.is_set(), skew=skew)

    def stalled(self) -> str | None:
        return None  # its clock never stops

    def cut(self, key: Any = None) -> None:
        self.cuts.append(None if key is None else key.req.id)
        if key is None or key is self._playing:  # (a cue never starts here: nothing to stop)
            self._cut.set()


@dataclass
class Rig:
    scheduler: Scheduler
    events: list[tuple[str, str]]
    records: list[LatencyRecord]
    recorder: Recorder
    speaker: PacedSpeaker | None


def rig(engine: Engine, parallel: int = 2, speaker: PacedSpeaker | None = None,
        max_queue: int = 100, synthesis: SynthesisOptions = SynthesisOptions()) -> Rig:
    metrics = Metrics()
    s = Scheduler(engine, metrics, SchedulerSettings(parallel=parallel, max_queue=max_queue),
                  synthesis, speaker=speaker)  # type: ignore[arg-type]
    recorder = Recorder()
    s.register_sink(recorder)
    events: list[tuple[str, str]] = []
    records: list[LatencyRecord] = []
    s.add_listener(lambda ev: events.append((ev["id"], ev["event"])))
    metrics.add_listener(records.append)
    return Rig(s, events, records, recorder, speaker)


def req(rid: str, text: str = "Hello there.", **kw: Any) -> Request:
    kw.setdefault("sinks", ("mqtt",))
    return Request(text=text, id=rid, voice="en_US-joe-medium", **kw)


async def test_network_only_requests_run_concurrently(engine: Engine) -> None:
    r = rig(engine, parallel=2)
    a = r.scheduler.submit(req("a", "The first of two parallel requests."))
    b = r.scheduler.submit(req("b", "The second one."))
    assert await asyncio.wait_for(asyncio.gather(a, b), 60) == ["finished", "finished"]
    ev = r.events
    assert ev.index(("b", "started")) < ev.index(("a", "finished"))
    for rid in "ab":
        assert_speech(pcm16(bytes(r.recorder.streams[rid].pcm)), 22050, min_seconds=0.5)
        assert r.recorder.streams[rid].outcome == "finished"
    assert {rec.id for rec in r.records} == {"a", "b"}
    assert all(rec.sink == "mqtt" and rec.outcome == "ok" and rec.audio_ms > 0
               and rec.first_audio_ms >= rec.queue_ms for rec in r.records)
    assert r.scheduler.snapshot() == {"state": "idle", "queue": 0, "current_id": None}


async def test_one_lane_slot_queues_in_priority_then_fifo_order(engine: Engine) -> None:
    r = rig(engine, parallel=1)
    futures = [r.scheduler.submit(req("first")), r.scheduler.submit(req("low", priority=-1)),
               r.scheduler.submit(req("fifo1")), r.scheduler.submit(req("fifo2")),
               r.scheduler.submit(req("high", priority=3))]
    assert r.scheduler.snapshot()["queue"] == 4
    await asyncio.wait_for(asyncio.gather(*futures), 90)
    started = [rid for rid, kind in r.events if kind == "started"]
    assert started == ["first", "high", "fifo1", "fifo2", "low"]
    for rid in started:  # each finished before the next started
        assert r.events.index((rid, "finished")) < (
            r.events.index((started[started.index(rid) + 1], "started"))
            if rid != started[-1] else len(r.events))


async def test_speaker_plays_one_at_a_time_and_prefetches_the_next(engine: Engine) -> None:
    spk = PacedSpeaker(speed=2.0)
    r = rig(engine, speaker=spk)
    first = req("s1", "A sentence that takes a couple of seconds to say.", sinks=("speaker",))
    second = req("s2", "And the next one, ready before the first ends.", sinks=("speaker",))
    done = [r.scheduler.submit(first), r.scheduler.submit(second)]
    assert r.scheduler.snapshot() == {"state": "speaking", "queue": 1, "current_id": "s1"}
    assert await asyncio.wait_for(asyncio.gather(*done), 60) == ["finished", "finished"]
    (s1_start, s1_end, _), (s2_start, _, s2_samples) = spk.played
    assert s2_start >= s1_end, "the speaker plays one utterance at a time"
    assert second.timeline.started is not None and second.timeline.started < s1_end, \
        "the next utterance is synthesized while the current one plays"
    assert second.timeline.first_audio is not None
    assert s2_samples > 22050


async def test_interrupt_cuts_the_speaker_and_goes_next(engine: Engine) -> None:
    spk = PacedSpeaker(speed=1.0)
    r = rig(engine, speaker=spk)
    long = r.scheduler.submit(req("long", "This goes on and on. " * 6, sinks=("speaker",)))
    queued = r.scheduler.submit(req("queued", "Waiting patiently.", sinks=("speaker",)))
    while ("long", "started") not in r.events:
        await asyncio.sleep(0.01)
    urgent = r.scheduler.submit(req("urgent", "Fire alarm!", sinks=("speaker", "mqtt"),
                                    mode="interrupt"))
    assert await asyncio.wait_for(long, 30) == "stopped"
    assert await asyncio.wait_for(asyncio.gather(urgent, queued), 60) == ["finished"] * 2
    started = [rid for rid, kind in r.events if kind == "started"]
    assert started == ["long", "urgent", "queued"]
    cut = next(rec for rec in r.records if rec.id == "long")
    assert cut.outcome == "stopped"
    assert r.recorder.streams["urgent"].outcome == "finished"  # tee'd to the network sink


async def test_the_next_speaker_utterance_is_cued_once_synthesized(engine: Engine) -> None:
    """While one utterance plays, the next one goes to the speaker as its cue the moment it
    is synthesized whole, with the paragraph pause, so the speaker can go on with it in the
    same device stream; it is then played with the same key and pause, which claims it."""
    spk = PacedSpeaker(speed=1.0)
    r = rig(engine, speaker=spk, synthesis=SynthesisOptions(paragraph_silence=0.3))
    first = r.scheduler.submit(req("c1", "A sentence that takes a couple of seconds to say.",
                                   sinks=("speaker",)))
    second = r.scheduler.submit(req("c2", "And then another one.", sinks=("speaker",)))
    assert await asyncio.wait_for(asyncio.gather(first, second), 60) == ["finished"] * 2
    (c1_start, c1_end, _), (_, _, c2_samples) = spk.played
    [(cued, samples, pause, at)] = spk.cues
    assert (cued, samples, pause) == ("c2", c2_samples, 0.3), spk.cues  # all of it
    assert c1_start < at < c1_end, "not cued while the first one played"
    assert spk.keys == [("c1", 0.3), ("c2", 0.3)]
    assert spk.cuts == []


async def test_a_cue_overtaken_by_an_interrupt_is_withdrawn_and_played_in_turn(
        engine: Engine) -> None:
    """An interrupt goes before the cued utterance: the cue is withdrawn (cut by its key, so
    the speaker doesn't go on with it), and the utterance is played whole in its turn."""
    spk = PacedSpeaker(speed=1.0)
    r = rig(engine, speaker=spk)
    long = r.scheduler.submit(req("long", "This goes on and on. " * 6, sinks=("speaker",)))
    queued = r.scheduler.submit(req("queued", "Waiting patiently.", sinks=("speaker",)))
    await until(lambda: spk.cues, "the cue", 30)
    urgent = r.scheduler.submit(req("urgent", "Fire alarm!", sinks=("speaker",),
                                    mode="interrupt"))
    assert await asyncio.wait_for(asyncio.gather(long, urgent, queued), 60) == [
        "stopped", "finished", "finished"]
    assert [rid for rid, kind in r.events if kind == "started"] == ["long", "urgent", "queued"]
    # The interrupt cut the current one and withdrew the cue; the queued one was cued again
    # behind the urgent one, and played whole.
    assert spk.cuts == ["long", "queued"]
    assert [c[0] for c in spk.cues] == ["queued", "queued"]
    assert spk.played[2][2] == spk.cues[0][1]


async def test_stopping_a_cued_utterance_withdraws_the_cue(engine: Engine) -> None:
    """A cued utterance stopped before its turn: the cue is withdrawn, it is never played."""
    spk = PacedSpeaker(speed=2.0)
    r = rig(engine, speaker=spk)
    first = r.scheduler.submit(req("p1", "A sentence that takes a couple of seconds to say.",
                                   sinks=("speaker",)))
    cued = r.scheduler.submit(req("p2", "Never heard.", sinks=("speaker",)))
    await until(lambda: spk.cues, "the cue", 30)
    assert r.scheduler.stop("p2") == ["p2"]
    assert await asyncio.wait_for(asyncio.gather(first, cued), 60) == ["finished", "stopped"]
    assert spk.cuts == ["p2"]
    assert [key for key, _ in spk.keys] == ["p1"]


async def test_a_timed_utterance_starts_at_its_time_not_as_a_cue(engine: Engine) -> None:
    """An utterance with a start time (``play_at``, several speakers playing it together)
    is handed to the speaker with it, is never cued behind the one before (that would start
    it at the paragraph pause), and its latency record carries the speaker's start skew;
    the one without a start time has none."""
    spk = PacedSpeaker(speed=1.0)
    r = rig(engine, speaker=spk, synthesis=SynthesisOptions(paragraph_silence=0.3))
    first = r.scheduler.submit(req("now", "Hello there.", sinks=("speaker",)))
    play_at = time.time() + 5.0  # the first one (a second long) is over by then
    timed = r.scheduler.submit(req("timed", "Dinner is ready.", sinks=("speaker",),
                                   play_at=play_at))
    assert await asyncio.wait_for(asyncio.gather(first, timed), 60) == ["finished"] * 2
    assert spk.cues == [], "the timed utterance was cued"
    assert [(rid, at) for rid, at, _ in spk.starts] == [("now", None), ("timed", play_at)]
    records = {rec.id: rec for rec in r.records}
    assert records["now"].start_skew_ms is None
    skew = records["timed"].start_skew_ms
    # The skew the record carries is the speaker's own: how late this stand-in's sleep woke
    # (the host's, not herald's; the real speaker's are test_speaker_sync's). Never early.
    assert skew is not None and skew >= 0, skew
    assert skew == round((spk.starts[1][2] - play_at) * 1000, 1)
    assert records["timed"].as_dict()["start_skew_ms"] == skew


async def test_stop_removes_waiting_and_cuts_running(engine: Engine) -> None:
    r = rig(engine, parallel=1)
    a = r.scheduler.submit(req("a", "Something fairly long to be cut off halfway. " * 3))
    b = r.scheduler.submit(req("b"))
    c = r.scheduler.submit(req("c"))
    assert r.scheduler.stop("b") == ["b"]
    with pytest.raises(RequestError, match="nothing queued or playing"):
        r.scheduler.stop("nope")
    while ("a", "started") not in r.events:
        await asyncio.sleep(0.01)
    assert sorted(r.scheduler.stop()) == ["a", "c"]
    assert await asyncio.wait_for(asyncio.gather(a, b, c), 30) == ["stopped"] * 3
    assert [rid for rid, kind in r.events if kind == "started"] == ["a"]
    assert r.recorder.streams["a"].outcome == "stopped"
    assert r.scheduler.snapshot()["queue"] == 0


async def test_a_client_lets_go_of_its_job_once_it_ends(engine: Engine) -> None:
    """A client's job, ended or dropped, is not held by its client: together they would be
    a cycle that only the garbage collector's rare full pass frees."""
    r = rig(engine, parallel=1)
    done, dropped = ClientSink("http"), ClientSink("http")
    a = r.scheduler.submit(req("a", sinks=(), client=done))
    b = r.scheduler.submit(req("b", sinks=(), client=dropped))
    assert done.on_leave is not None and dropped.on_leave is not None
    dropped.leave()  # gone while its job runs (the client lane never queues): cut
    while await done.read() is not None:
        pass
    assert await asyncio.wait_for(a, 30) == "finished"
    # the cut job ends on its own time, which may come after the other's end
    assert await asyncio.wait_for(b, 30) == "stopped"
    assert done.on_leave is None and dropped.on_leave is None
    assert dropped.outcome == "stopped"


async def test_refusals_leave_nothing_behind(engine: Engine) -> None:
    r = rig(engine, parallel=1, max_queue=1)
    with pytest.raises(RequestError, match="speaker is disabled"):
        r.scheduler.submit(req("x", sinks=("speaker",)))
    first = r.scheduler.submit(req("dup"))
    with pytest.raises(RequestError, match="already queued or playing"):
        r.scheduler.submit(req("dup"))
    r.scheduler.submit(req("w1"))
    with pytest.raises(RequestError, match="queue full"):
        r.scheduler.submit(req("w2"))
    r.scheduler.stop()
    await asyncio.wait_for(first, 30)
    assert {rid for rid, _ in r.events} == {"dup", "w1"}


async def test_synthesis_error_is_an_error_event(engine: Engine) -> None:
    r = rig(engine)
    outcome = await asyncio.wait_for(r.scheduler.submit(req("bad", speaker="nobody")), 30)
    assert outcome == "error"
    assert r.events[-1] == ("bad", "error")
    assert r.records[-1].outcome == "error"


async def test_text_with_nothing_to_pronounce_is_an_error_not_silence(engine: Engine) -> None:
    """"..." passes the text checks, but espeak-ng finds no word in it: reported "finished",
    the sender would believe it was spoken (HTTP answers 400 with the same message). A pause
    alone is audio that was asked for."""
    r = rig(engine, speaker=PacedSpeaker(speed=8.0))
    errors: dict[str, str] = {}
    r.scheduler.add_listener(lambda ev: errors.update({ev["id"]: ev["error"]})
                             if ev["event"] == "error" else None)
    streamed = req("streamed", "")
    streamed.stream = TextStream()
    done = [r.scheduler.submit(req("dots", "...")),
            r.scheduler.submit(req("tag", "[rate 0.8]", sinks=("speaker",))),
            r.scheduler.submit(streamed),
            r.scheduler.submit(req("pause", "[pause 300ms]"))]
    streamed.stream.feed("?!", final=True)
    assert await asyncio.wait_for(asyncio.gather(*done), 60) == ["error"] * 3 + ["finished"]
    assert errors == dict.fromkeys(("dots", "tag", "streamed"), NOTHING_TO_SAY)
    assert {rec.id: rec.outcome for rec in r.records} == {
        "dots": "error", "tag": "error", "streamed": "error", "pause": "ok"}
    assert r.recorder.streams["dots"].outcome == "error"  # the audio topics say so too


async def test_streamed_text_is_one_utterance(engine: Engine) -> None:
    r = rig(engine)
    request = req("st", "")
    request.stream = TextStream()
    done = r.scheduler.submit(request)
    request.stream.feed("First sen")
    request.stream.feed("tence here. Sec")
    while not r.recorder.streams.get("st") or not r.recorder.streams["st"].pcm:
        await asyncio.sleep(0.01)  # the first sentence is spoken before the rest exists
    request.stream.feed("ond one", final=True)
    assert await asyncio.wait_for(done, 30) == "finished"
    assert [k for rid, k in r.events if rid == "st"] == ["queued", "started", "finished"]
    assert_speech(pcm16(bytes(r.recorder.streams["st"].pcm)), 22050, min_seconds=1.0)


async def test_ssml_reaches_the_engine(engine: Engine) -> None:
    r = rig(engine)
    quiet = {"noise_scale": 0.0, "noise_w": 0.0}
    plain = r.scheduler.submit(req("plain", "Wait here.", **quiet))
    ssml = r.scheduler.submit(req("ssml", '<speak>Wait <break time="500ms"/> here.</speak>',
                                  text_format="ssml", **quiet))
    assert await asyncio.wait_for(asyncio.gather(plain, ssml), 60) == ["finished", "finished"]
    a, b = (pcm16(bytes(r.recorder.streams[rid].pcm)) for rid in ("plain", "ssml"))
    assert_speech(b, 22050, min_seconds=1.0)
    assert len(b) - len(a) >= 0.45 * 22050  # the break, in samples


async def test_streamed_text_sounds_like_the_whole_text(engine: Engine) -> None:
    """Sentence by sentence, with the pauses between sentences and paragraphs and a [rate]
    that carries over, the streamed audio equals the audio of the text sent whole."""
    r = rig(engine, synthesis=SynthesisOptions(sentence_silence=0.2))
    text = "[rate 0.6] One two three. Four five six.\n\nSeven [pause 300ms] eight."
    quiet = {"noise_scale": 0.0, "noise_w": 0.0}
    whole = r.scheduler.submit(req("whole", text, **quiet))
    streamed = req("streamed", "", **quiet)
    streamed.stream = TextStream()
    done = r.scheduler.submit(streamed)
    for piece in (text[:20], text[20:45], text[45:]):
        streamed.stream.feed(piece)
    streamed.stream.feed("", final=True)
    assert await asyncio.wait_for(asyncio.gather(whole, done), 60) == ["finished", "finished"]
    whole_pcm, streamed_pcm = (bytes(r.recorder.streams[rid].pcm) for rid in ("whole", "streamed"))
    assert_speech(pcm16(whole_pcm), 22050, min_seconds=2.0)
    assert_pcm_close(streamed_pcm, whole_pcm, "the text sent whole")


# --------------------------------------------------------------------------- pieces


def said(batch: list[Step]) -> list[str]:
    return [step.text for step in batch if isinstance(step, Say)]


def test_text_stream_splits_sentences_across_pieces(engine: Engine) -> None:
    async def run() -> list[list[str]]:
        s = TextStream()
        for piece in ["Hello wor", "ld. How are", " you? Pi is 3.", "14 today!", "\n", "End"]:
            s.feed(piece)
        s.feed("", final=True)
        return [said(b) async for b in s.steps(engine.planner(None, SynthesisOptions()))]

    assert asyncio.run(run()) == [["Hello world."], ["How are you?"], ["Pi is 3.14 today!"],
                                  ["End"]]


def test_text_stream_splits_like_the_whole_text_and_carries_tags(engine: Engine) -> None:
    """The planner a whole text goes through: "Dr." waits for what follows, [rate]/[voice]
    carry over, the pauses between sentences are owed to the next one; one batch per
    sentence, and all of them together are the whole text's steps."""
    text = "Dr. Smith arrived [rate 0.8] late. Then we ate. 你好。[voice default]Bye!"
    opts = SynthesisOptions(sentence_silence=0.2)

    async def run() -> list[list[Step]]:
        s = TextStream()
        for piece in ["Dr.", " Smith arrived [rate 0.8] late. The", "n we ate. 你好。",
                      "[voice default]Bye!"]:
            s.feed(piece)
        s.feed("", final=True)
        return [b async for b in s.steps(engine.planner(None, opts))]

    batches = asyncio.run(run())
    assert [said(b) for b in batches] == [["Dr. Smith arrived", "late."], ["Then we ate."],
                                          ["你好。"], ["Bye!"]]
    assert [s.rate for b in batches for s in b if isinstance(s, Say)] == [1.0] + [0.8] * 4
    assert [s.seconds for b in batches for s in b if isinstance(s, Silence)] == [0.2] * 3
    whole = engine.planner(None, opts)
    assert [s for b in batches for s in b] == whole.feed(text) + whole.finish()


def test_an_ssml_stream_is_one_batch_at_the_end(engine: Engine) -> None:
    ssml = "<speak>One. <break time='1s'/>Two.</speak>"

    async def run() -> list[list[Step]]:
        s = TextStream()
        s.feed(ssml[:30])
        s.feed(ssml[30:], final=True)
        return [b async for b in s.steps(engine.planner(None, SynthesisOptions(), "ssml"))]

    whole = engine.planner(None, SynthesisOptions(), "ssml")
    assert asyncio.run(run()) == [whole.feed(ssml) + whole.finish()]
    assert [said(b) for b in asyncio.run(run())] == [["One.", "Two."]]


def test_text_stream_failure_comes_after_the_sentences(engine: Engine) -> None:
    async def run() -> tuple[list[str], str]:
        s = TextStream()
        s.feed("One. Two")
        s.fail(RequestError("timed out"))
        got = []
        try:
            async for b in s.steps(engine.planner(None, SynthesisOptions())):
                got += said(b)
        except RequestError as e:
            return got, str(e)
        return got, ""

    assert asyncio.run(run()) == (["One."], "timed out")


def test_every_front_resolves_voices_alike(engine: Engine) -> None:
    """One resolver for MQTT, Wyoming and HTTP: a name, a language where the name goes (as
    people type it) or in Wyoming's language field, else the default; or UnknownVoice
    saying what is installed."""
    joe = "en_US-joe-medium"
    assert engine.resolve_voice(joe) == engine.resolve_voice("en") == joe
    assert engine.resolve_voice("en-us") == engine.resolve_voice(None, "en_US") == joe
    assert engine.resolve_voice(None, default="chosen") == "chosen"  # MQTT's set/voice
    assert engine.resolve_voice("") == engine.resolve_voice() == engine.catalog.default
    for name, language, words in [("nobody", None, "unknown voice 'nobody'"),
                                  ("xx", None, "unknown voice 'xx'"),
                                  (None, "tlh", "no voice speaks 'tlh'")]:
        with pytest.raises(UnknownVoice, match=re.escape(words)) as e:
            engine.resolve_voice(name, language)
        assert joe in str(e.value).partition("installed: ")[2]
    with pytest.raises(UnknownVoice, match="too long"):
        engine.resolve_voice("x" * 201)


async def test_audio_buffer_is_bounded_and_ends_with_the_error() -> None:
    buf = AudioBuffer(max_samples=100)
    chunk = bytes(120)  # 60 samples
    await buf.put(chunk)
    await buf.put(chunk)  # 120 >= 100: the next put waits
    blocked = asyncio.ensure_future(buf.put(chunk))
    await asyncio.sleep(0.05)
    assert not blocked.done()
    assert await buf.get() is chunk
    await asyncio.wait_for(blocked, 1)
    buf.finish(RuntimeError("synthesis broke"))
    assert await buf.get() is chunk and await buf.get() is chunk
    with pytest.raises(RuntimeError, match="synthesis broke"):
        await buf.get()
    assert await buf.get() is None


def test_request_options_keep_the_configured_defaults() -> None:
    """A request replaces only what it sets; pauses and gain stay as configured."""
    base = SynthesisOptions(sentence_silence=0.2, paragraph_silence=0.9, gain=0.5,
                            noise_w=0.3)
    opts = Request(text="Hi.", rate=1.4, volume=0.5, seed=7).options(base)
    assert (opts.sentence_silence, opts.paragraph_silence) == (0.2, 0.9)
    assert (opts.length_scale, opts.gain, opts.seed, opts.noise_w) == (1.4, 0.25, 7, 0.3)

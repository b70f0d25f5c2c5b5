"""The fleet's wire format: every message round-trips, what comes off the wire is checked
strictly, and every fleet topic is built (and parsed) with its levels checked."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from daemon.fleet import messages as m
from daemon.fleet.topics import AudioTopic, FleetTopics
from daemon.mqtt.topics import TopicError

F = "herald/fleet"
OPTIONS = m.JobOptions(seed=123456789, length_scale=1.2, noise_scale=0.5, noise_w=0.6,
                       gain=0.8, sentence_silence=0.1)
EXAMPLES: list[m._Message] = [
    m.VoiceInfo(name="en_US-joe-medium", language="en_US", rate=22050, speakers=1),
    m.Presence(state="online", role="worker", version="1.0",
               voices=[m.VoiceInfo("en_US-joe-medium", "en_US", 22050, 1)], slots=4,
               groups=["downstairs"]),
    m.Presence(state="offline", role="satellite"),
    OPTIONS,
    m.Job(job="a1b2c3d4", attempt=2, owner="kitchen", text="Dinner is ready.",
          voice="en_US-joe-medium", options=OPTIONS, audio=f"{F}/group/downstairs/audio",
          expires=1764620030.0, sent=1764620000.123, format="ssml", speaker=0, chunk_ms=100,
          skip_chunks=3, stream=True, sync=True),
    m.Job(job="j:2.x", attempt=1, owner="hall", text="", voice="v", speaker="amy",
          options=m.JobOptions(seed=0), audio=f"{F}/device/hall/audio", expires=1.0),
    m.JobState(job="a1", attempt=1, worker="nuc", state="claimed", text_offset=12),
    m.JobState(job="a1", attempt=1, worker="nuc", state="failed", chunks=4,
               error="no voice 'xx'", code="unknown-voice"),
    m.TextPiece(offset=10, text="more text", end=True),
    m.Cancel(attempt=3),
    m.Cancel(),
    m.AudioStart(rate=22050, job="a1", attempt=1, worker="nuc", voice="v",
                 chunk_samples=2205, play_at=1764620000.5),
    m.AudioStop(chunks=10, samples=22050, outcome="error", attempt=2,
                error="synthesis failed", code="synthesis-failed"),
    m.AudioStop(chunks=10, samples=22050, outcome="finished", attempt=1),
    m.Resumed(id="a1", lost="nuc", from_chunk=7, worker="pi"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda x: type(x).__name__)
def test_every_message_round_trips(message: m._Message) -> None:
    payload = message.to_json()
    data = json.loads(payload)
    assert type(message).from_json(payload) == message
    assert type(message).from_json(payload.encode()) == message
    # The optional error fields are left out when unset, as the spec shows them.
    if isinstance(message, (m.JobState, m.AudioStop)) and message.error is None:
        assert "error" not in data and "code" not in data
    # Keys a newer node adds are ignored.
    data["added_later"] = {"x": 1}
    assert type(message).from_json(json.dumps(data)) == message


def _job(**change: Any) -> dict[str, Any]:
    data = json.loads(EXAMPLES[4].to_json())
    for key, value in change.items():
        if value is _DROP:
            del data[key]
        else:
            data[key] = value
    return data


_DROP = object()

MALFORMED: list[tuple[type[m._Message], Any, str]] = [
    (m.Job, b"\xff\xfe", "Invalid JSON"),
    (m.Job, b"[1, 2]", "object"),
    (m.Job, _job(job="a/b"), "job:"),
    (m.Job, _job(job="a+"), "job:"),
    (m.Job, _job(job="x" * 65), "job:"),
    (m.Job, _job(attempt=0), "attempt:"),
    (m.Job, _job(attempt="1"), "attempt:"),
    (m.Job, _job(attempt=1.0), "attempt:"),
    (m.Job, _job(attempt=True), "attempt:"),
    (m.Job, _job(owner="#"), "owner:"),
    (m.Job, _job(text=5), "text:"),
    (m.Job, _job(voice=""), "voice:"),
    (m.Job, _job(format="markdown"), "format:"),
    (m.Job, _job(skip_chunks=-1), "skip_chunks:"),
    (m.Job, _job(chunk_ms=5), "chunk_ms:"),
    (m.Job, _job(stream="yes"), "stream:"),
    (m.Job, _job(expires=_DROP), "expires: required field missing"),
    (m.Job, _job(options={"seed": -1}), "options.seed:"),
    (m.Job, _job(options={"gain": 1.0}), "options.seed: required field missing"),
    (m.Job, _job(options={"seed": 1, "noise_w": 3}), "options.noise_w:"),
    (m.Job, _job(speaker=1.5), "speaker"),
    (m.Job, json.dumps(_job()).replace("1764620030.0", "NaN"), "expires:"),
    (m.Job, json.dumps(_job()).replace("1764620030.0", "1e999"), "expires:"),
    (m.JobState, {"job": "a", "attempt": 1, "worker": "w", "state": "sleeping"}, "state:"),
    (m.JobState, {"job": "a", "attempt": 1, "worker": "w", "state": "failed",
                  "code": "oops"}, "code:"),
    (m.JobState, {"job": "a", "attempt": 1, "state": "done"}, "worker: required"),
    (m.TextPiece, {"offset": -1, "text": "x"}, "offset:"),
    (m.TextPiece, {"offset": 0}, "text: required"),
    (m.Cancel, {"attempt": "all"}, "attempt:"),
    (m.Cancel, "null", "object"),
    (m.AudioStart, {"rate": 22050, "job": "a", "attempt": 1, "worker": "w", "voice": "v",
                    "chunk_samples": 0}, "chunk_samples:"),
    (m.AudioStart, {"rate": 22050, "job": "a", "attempt": 1, "worker": "w", "voice": "v",
                    "chunk_samples": 10, "width": 4}, "width:"),
    (m.AudioStop, {"chunks": 1, "samples": 1, "outcome": "maybe", "attempt": 1},
     "outcome:"),
    (m.Presence, {"state": "online", "role": "boss"}, "role:"),
    (m.Presence, {"state": "online", "role": "worker", "groups": ["a b"]}, "groups.0:"),
    (m.Presence, {"state": "online", "role": "worker",
                  "voices": [{"name": "v", "language": "en", "rate": "22050"}]},
     "voices.0.rate:"),
]


@pytest.mark.parametrize("cls,payload,says", MALFORMED,
                         ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(MALFORMED)])
def test_malformed_messages_are_refused(cls: type[m._Message], payload: Any, says: str) -> None:
    raw = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
    with pytest.raises(m.MessageError, match=f"malformed {cls.kind}: .*") as info:
        cls.from_json(raw)
    assert says in str(info.value)


def test_decode_drops_and_logs_a_fault_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "daemon.fleet.messages")
    junk = b'{"offset": "ten", "text": "x"}'
    for _ in range(5):
        assert m.decode(m.TextPiece, junk, f"{F}/job/a/text") is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "offset" in warnings[0].getMessage()
    assert m.decode(m.TextPiece, b'{"offset": 0, "text": "x"}', "t") == m.TextPiece(0, "x")


def test_fleet_topics() -> None:
    t = FleetTopics(F, "kitchen", "herald")
    assert t.node() == f"{F}/nodes/kitchen" and t.node("hall") == f"{F}/nodes/hall"
    assert t.node_id(f"{F}/nodes/hall") == "hall" and t.node_id(f"{F}/nodes/a/b") is None
    assert t.jobs_shared == f"$share/herald/{F}/jobs"
    assert t.job_state("a1") == f"{F}/job/a1/state"
    assert t.job_of(t.job_cancel("a1"), "cancel") == "a1"
    assert t.job_of(t.job_cancel("a1"), "state") is None
    assert t.group_say_shared("down") == f"$share/herald-down/{F}/group/down/say"
    assert t.group_say_stream_shared("down").endswith("/group/down/say/stream")
    assert t.group_stop("down") == f"{F}/group/down/stop"
    assert t.group_event("down") == f"{F}/group/down/event"
    prefix = t.check_audio_prefix(t.group_audio("down"))
    assert t.audio_chunk(prefix, "a1", 7) == f"{F}/group/down/audio/a1/chunk/7"
    assert t.audio_topic(prefix, t.audio_chunk(prefix, "a1", 7)) == AudioTopic(
        prefix, "a1", "chunk", 7)
    assert t.audio_topic(prefix, t.audio_stop(prefix, "a1")) == AudioTopic(prefix, "a1", "stop")
    assert t.audio_topic(prefix, f"{prefix}/a1/chunk/x") is None
    assert t.check_audio_prefix(t.device_audio()) == f"{F}/device/kitchen/audio"
    for bad in ("herald/kitchen/audio", f"{F}/device/+/audio", f"{F}/group/a b/audio",
                f"{F}/device/x/audio/more", "other/fleet/device/x/audio", f"{F}/jobs"):
        with pytest.raises(TopicError):
            t.check_audio_prefix(bad)
    for build in (lambda: t.job_state("a/b"), lambda: t.node("a+b"), lambda: t.group_say("a#"),
                  lambda: t.audio_start(prefix, "x/y"), lambda: FleetTopics("a/+", "k"),
                  lambda: FleetTopics(F, "k", "a/b"), lambda: FleetTopics("$SYS/x", "k")):
        with pytest.raises(TopicError):
            build()

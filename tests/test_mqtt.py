"""herald run against a real Mosquitto: the MQTT front, the scheduler, the MQTT audio sink,
the speaker path into ALSA's file plugin, broker outages, bad input and shutdown.

One daemon (a subprocess, like systemd would run it) serves the whole module; the tests
talk to it with paho like any automation would. The network lane runs one utterance at a
time here (scheduler.parallel = 1) so queue order, priority, interrupt and stop are visible
on the MQTT audio sink; tests/test_scheduler.py covers the parallel case.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from audio_checks import assert_pcm_close, assert_speech, pcm16, reference_pcm
from conftest import (
    ROOT,
    AlsaFile,
    Broker,
    NotifySocket,
    alsa_file_env,
    free_port,
    make_tls,
    voices_of_default,
    wait_port,
)
from herald_process import HeraldProcess, herald_env, start_herald, stop_all_still_running
from mqtt_client import BASE, DEVICE, Client, Msg
from paho.mqtt.enums import CallbackAPIVersion
from synthetic_voice import VARIANTS, export_like_piper, random_model

from daemon.errors import RequestError
from daemon.fronts.mqtt.hermes import decode_wav
from daemon.mqtt.connection import Connection
from daemon.mqtt.payload import Limits, parse_say, parse_stream_piece
from daemon.settings import MqttSettings
from tts import AudioFormat, SynthesisOptions, wav_bytes
from tts.audio import wav_stream_header

LONG_TEXT = (
    "This is a long announcement that keeps going for quite a while, so that other "
    "requests arrive while it is still being spoken. It talks about the weather, the "
    "garden, the trains that run late on Sundays, and the many small things a house "
    "might want to say out loud during a long and uneventful afternoon at home."
)


@dataclass
class Herald(HeraldProcess):
    """The module's daemon, with the sound device it plays into and the broker it uses."""

    alsa: AlsaFile
    broker: Broker


OTHER_VOICE = "xx_XX-test-x_low"
DEFAULT_VOICE = "en_US-joe-medium"


@pytest.fixture(scope="module")
def herald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Herald]:
    tmp = tmp_path_factory.mktemp("herald-mqtt")
    workdir = tmp / "broker"  # conftest's broker keeps root, so it can persist here
    workdir.mkdir()
    broker = Broker(free_port(), workdir)
    broker.start()
    alsa = alsa_file_env(tmp / "alsa")
    voices = tmp / "voices"  # a second voice, so that set/voice visibly changes something
    voices.mkdir()
    export_like_piper(random_model(VARIANTS["x_low"]), voices / f"{OTHER_VOICE}.onnx")
    voice_config = json.loads((voices_of_default() / "en_US-joe-medium.onnx.json").read_text())
    voice_config["audio"] = {"sample_rate": 16000, "quality": "x_low"}
    voice_config["language"] = {"code": "xx_XX"}
    (voices / f"{OTHER_VOICE}.onnx.json").write_text(json.dumps(voice_config))
    config = tmp / "herald.toml"
    config.write_text(f"""
device_id = "{DEVICE}"
[voices]
directories = ["{voices}"]
[mqtt]
host = "127.0.0.1"
port = {broker.port}
stream_timeout = 20
[mqtt.hermes]
enabled = true
site_id = "hall"
[scheduler]
parallel = 1
[wyoming]
enabled = false
[http]
enabled = false
""")
    started = start_herald(config, tmp / "herald.log", herald_env(base=alsa.env))
    h = Herald(started.proc, started.log, alsa, broker)
    watcher = Client(broker.port)
    try:
        watcher.wait_online()
    except BaseException:
        h.kill()
        print(h.output())
        raise
    finally:
        watcher.close()
    yield h
    h.kill()
    broker.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    print(h.output()[-5000:])


@pytest.fixture
def client(herald: Herald) -> Iterator[Client]:
    c = Client(herald.broker.port)
    yield c
    c.close()
    assert herald.proc.poll() is None, "herald died:\n" + herald.tail()


# --------------------------------------------------------------------------- payloads


@pytest.fixture
def limits(catalog: Any) -> Limits:
    return Limits(max_text=200, default_sinks=("speaker",), max_age=60.0,
                  resolve_voice=lambda name: catalog.resolve(name).name,
                  check_speaker=lambda voice, speaker: catalog.resolve(voice).speaker_id(speaker))


def test_say_payload_plain_text_and_json(limits: Limits) -> None:
    plain = parse_say(b"Hello, kitchen.", limits)
    assert plain.text == "Hello, kitchen." and plain.voice == "en_US-joe-medium"
    assert plain.sinks == ("speaker",) and plain.mode == "queue" and len(plain.id) == 8
    assert plain.id != parse_say(b"Hello again.", limits).id
    full = parse_say(json.dumps({
        "text": "Grüße!", "id": "r-1", "voice": "en_US-joe-medium", "speaker": 0, "rate": 1.2,
        "volume": 0.5, "mode": "interrupt", "priority": 2, "sinks": ["mqtt", "speaker"],
        "ts": time.time(), "seed": 4, "noise_scale": 0, "noise_w": 0}).encode(), limits)
    assert (full.id, full.text, full.rate, full.volume, full.mode, full.priority) == (
        "r-1", "Grüße!", 1.2, 0.5, "interrupt", 2)
    assert full.sinks == ("mqtt", "speaker") and full.seed == 4
    opts = full.options(SynthesisOptions(gain=2.0, sentence_silence=0.1))
    assert (opts.length_scale, opts.gain, opts.noise_scale, opts.seed) == (1.2, 1.0, 0, 4)


@pytest.mark.parametrize("payload, message", [
    (b"", "empty 'text'"), (b"   \n", "empty 'text'"), (b"x" * 201, "limit is 200"),
    (b"\xff\xfe", "not valid UTF-8"), (b"abc\x00def", "binary data"),
    (b'{"text": "hi"', "malformed JSON"), (b'{"text": ""}', "empty 'text'"),
    (b'{"txt": "hi"}', "missing 'text': the text to speak"),
    (b'{"text": "hi", "x": 1}', "unknown field 'x'"),
    (b'{"text": "hi", "voice": "nobody"}', "unknown voice"),
    (b'{"text": "hi", "rate": 0}', "'rate' is 0.0; it must be from 0.25 to 4.0"),
    (b'{"text": "hi", "rate": 10}', "'rate' is 10.0; it must be from 0.25 to 4.0"),
    (b'{"text": "hi", "speaker": "bob"}', "has a single speaker; got 'bob'"),  # before queueing
    (b'{"text": "hi", "mode": "now"}', "'mode' must be one of queue, interrupt, not 'now'"),
    (b'{"text": "hi", "priority": true}', "priority"),
    (b'{"text": "hi", "sinks": "mqtt"}', "sinks"), (b'{"text": "hi", "id": "a+b"}', "id"),
    (b'{"text": "hi", "ts": 1}', "not spoken late"),
    (b'{"text": "hi", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", "malformed JSON: nested too"),
    (b'{"text": "hi \\ud800"}', "JSON holds an unpaired UTF-16 surrogate (U+D800)"),
    (b'{"text": "hi", "ts": NaN}', "'ts' must be a number, not nan"),  # would pass max_age
    (b'{"text": "hi", "rate": NaN}', "'rate' must be a number from 0.25 to 4.0, not nan"),
    (b'{"text": "hi", "seed": 1208925819614629174706176}',
     "'seed' is 1208925819614629174706176; it must be from 0 to"),
    (b'{"text": "hi", "speaker": 1.5}', "'speaker' must be a speaker name or a whole number"),
    (b'{"text": "hi", "speaker": true}', "'speaker' must be a speaker name or a whole number"),
    (b'{"text": "hi", "id": "' + b"x" * 5000 + b'"}', "id of 5000 characters is not usable"),
])
def test_say_payload_errors(limits: Limits, payload: bytes, message: str) -> None:
    with pytest.raises(RequestError, match=re.escape(message)):
        parse_say(payload, limits)


def test_say_payload_ssml(limits: Limits) -> None:
    ssml = parse_say(json.dumps({"text": "<speak>Hi <break time='1s'/> there.</speak>",
                                 "format": "ssml"}).encode(), limits)
    assert ssml.text_format == "ssml"
    assert parse_say(b'{"text": "<b>hi</b>"}', limits).text_format == "text"
    with pytest.raises(RequestError, match="malformed SSML at line 1, column 20") as e:
        parse_say(b'{"text": "<speak>Hi <break></speak>", "format": "ssml", "id": "m1"}',
                  limits)
    assert e.value.id == "m1"
    with pytest.raises(RequestError, match="'format' must be one of text, ssml, not 'html'"):
        parse_say(b'{"text": "hi", "format": "html"}', limits)


def test_stream_piece_payload() -> None:
    p = parse_stream_piece(b'{"id": "s1", "seq": 2, "text": "more ", "final": true}')
    assert (p.id, p.seq, p.text, p.final) == ("s1", 2, "more ", True)
    with pytest.raises(RequestError, match="missing 'id': it ties a stream's pieces together"):
        parse_stream_piece(b'{"text": "x"}')
    with pytest.raises(RequestError, match="seq"):
        parse_stream_piece(b'{"id": "s1", "seq": -1, "text": "x"}')


# --------------------------------------------------------------------------- audio out


def test_mqtt_sink_audio_equals_synthesis(client: Client, synth: Any) -> None:
    text = "The kitchen timer is done. Dinner is ready!"
    client.say(id="ref1", text=text, sinks=["mqtt"], seed=7)
    assert client.wait_event("ref1")["event"] == "finished"
    start, pcm, stop = client.audio("ref1")
    assert start == {"format": "pcm", "rate": synth.sample_rate, "width": 2, "channels": 1}
    chunk = round(synth.sample_rate * 0.1) * 2
    sizes = [len(m.payload) for m in client.msgs if "/audio/ref1/chunk/" in m.topic]
    assert all(s == chunk for s in sizes[:-1]) and 0 < sizes[-1] <= chunk
    assert stop["chunks"] == len(sizes) and stop["samples"] == len(pcm) // 2
    assert_pcm_close(pcm, reference_pcm(synth, text, SynthesisOptions(seed=7)))
    assert_speech(pcm16(pcm), synth.sample_rate, min_seconds=1.5)


def test_say_events_latency_and_speaker(client: Client, herald: Herald, synth: Any) -> None:
    before = len(herald.alsa.pcm())
    client.say(id="spk1", text="The front door is open.")
    end = client.wait_event("spk1")
    assert end["event"] == "finished", end
    kinds = [e["event"] for e in client.events("spk1")]
    assert kinds == ["queued", "started", "finished"]
    rec = client.wait(lambda ms: next((m.json() for m in ms if m.topic == f"{BASE}/latency"
                                       and m.json()["id"] == "spk1"), None), what="latency")
    assert set(rec) == {"id", "front", "sink", "voice", "queue_ms", "first_audio_ms",
                        "synth_ms", "audio_ms", "rtf", "underruns", "outcome", "start_skew_ms"}
    assert rec["start_skew_ms"] is None  # no start time asked for
    assert (rec["front"], rec["sink"], rec["outcome"]) == ("mqtt", "speaker", "ok")
    assert rec["voice"] == "en_US-joe-medium"
    assert 0 <= rec["queue_ms"] <= rec["first_audio_ms"] and rec["audio_ms"] > 500
    assert rec["rtf"] > 0 and rec["synth_ms"] > 0
    # the speaker wrote the utterance into ALSA's file plugin
    played = pcm16(herald.alsa.pcm()[before:])
    assert_speech(played, synth.sample_rate, min_seconds=rec["audio_ms"] / 1000 * 0.9)
    client.wait(lambda ms: any(m.topic == f"{BASE}/status" and m.json()["state"] == "idle"
                               and (m.json()["last_latency"] or {}).get("id") == "spk1"
                               for m in ms), 30, "idle status with the last latency")


def test_say_stream_speaks_before_the_text_is_complete(client: Client, synth: Any) -> None:
    sentences = ["Here is the forecast for today.",
                 "Clouds in the morning, then plenty of sun later on.",
                 "Take a jacket anyway."]
    words = " ".join(sentences).split(" ")
    pieces = [" ".join(words[i:i + 3]) + (" " if i + 3 < len(words) else "")
              for i in range(0, len(words), 3)]
    for seq, piece in enumerate(pieces[:-1]):
        client.publish("say/stream", json.dumps({"id": "st1", "seq": seq, "text": piece,
                                                 "final": False, "sinks": ["mqtt"],
                                                 "seed": 3}))
    # herald must start speaking while the last piece is still unsent
    client.wait(lambda ms: any(m.topic == f"{BASE}/audio/st1/chunk/0" for m in ms),
                what="first audio of the stream")
    client.publish("say/stream", json.dumps({"id": "st1", "seq": len(pieces) - 1,
                                             "text": pieces[-1], "final": True}))
    assert client.wait_event("st1")["event"] == "finished"
    assert [e["event"] for e in client.events("st1")] == ["queued", "started", "finished"]
    _, pcm, _ = client.audio("st1")
    assert_pcm_close(pcm, reference_pcm(synth, sentences, SynthesisOptions(seed=3)))


def test_say_stream_reorders_pieces_and_refuses_a_bad_stream_whole(client: Client,
                                                                    synth: Any) -> None:
    piece = {"id": "oo", "sinks": ["mqtt"], "seed": 5}
    client.publish("say/stream", json.dumps({**piece, "seq": 1, "text": "world. See"}))
    client.publish("say/stream", json.dumps({**piece, "seq": 0, "text": "Hello "}))
    client.publish("say/stream", json.dumps({**piece, "seq": 2, "text": " you.", "final": True}))
    client.publish("say/stream", json.dumps({**piece, "seq": 2, "text": " you."}))  # late dup
    assert client.wait_event("oo")["event"] == "finished"
    _, pcm, _ = client.audio("oo")
    assert_pcm_close(pcm, reference_pcm(synth, ["Hello world.", "See you."],
                                          SynthesisOptions(seed=5)))

    client.publish("say/stream", json.dumps({"id": "rf", "seq": 0, "text": "Hi ",
                                             "voice": "xx_XX-nobody-low"}))
    client.publish("say/stream", json.dumps({"id": "rf", "seq": 1, "text": "there.",
                                             "final": True}))
    # The refusal, then (5 s later) the count of the pieces dropped after it: one each.
    client.wait(lambda ms: len([m for m in ms if m.topic == f"{BASE}/event"
                                and m.json().get("id") == "rf"]) >= 2, 30, "two errors for rf")
    errors = client.events("rf")
    assert [e["event"] for e in errors] == ["error", "error"]
    assert "unknown voice" in errors[0]["error"]
    assert "was refused: dropped 1 more piece" in errors[1]["error"]


def test_say_stream_pieces_held_for_a_missing_one_count_towards_max_text(
        client: Client) -> None:
    # Piece 0 never comes. What waits for it must not pile up for as long as pieces keep
    # coming (each restarts mqtt.stream_timeout): past mqtt.max_text (10000) it is refused.
    for seq in (1, 2, 3):
        client.publish("say/stream", json.dumps({"id": "held", "seq": seq, "sinks": ["mqtt"],
                                                 "text": "word " * 800}))  # 4000 characters
    err = client.wait_event("held")
    assert err["event"] == "error" and "(mqtt.max_text)" in err["error"], err
    assert [e["event"] for e in client.events("held")] == ["queued", "started", "error"]
    client.say(id="after-held", text="Still here.", sinks=["mqtt"])
    assert client.wait_event("after-held")["event"] == "finished"


# --------------------------------------------------------------------------- text and markup

QUIET = {"sinks": ["mqtt"], "noise_scale": 0, "noise_w": 0}  # deterministic audio


def test_ssml_say_and_malformed_ssml(client: Client, synth: Any) -> None:
    client.say(id="ssml-bad", text="<speak>Hi <break></speak>", format="ssml", **QUIET)
    err = client.wait_event("ssml-bad", ("error", "queued"))
    assert err["event"] == "error" and "malformed SSML at line 1" in err["error"]
    client.say(id="ssml-plain", text="Wait here.", **QUIET)
    client.say(id="ssml-break", text='<speak>Wait <break time="500ms"/> here.</speak>',
               format="ssml", **QUIET)
    assert client.wait_event("ssml-break")["event"] == "finished"  # still serving
    assert [e["event"] for e in client.events("ssml-bad")] == ["error"]  # nothing spoken
    plain, marked = (pcm16(client.audio(rid)[1]) for rid in ("ssml-plain", "ssml-break"))
    assert_speech(marked, synth.sample_rate, min_seconds=1.0)
    assert len(marked) - len(plain) >= 0.45 * synth.sample_rate  # the break, in samples


def test_mixed_chinese_and_english_sentence(client: Client, synth: Any) -> None:
    """The Chinese run is spoken by espeak-ng's Mandarin, the rest by the English voice,
    in one stream at the English voice's rate."""
    english = "This is a real-time TTS demo."
    client.say(id="mix", text=f"你好，欢迎试用 herald！{english}", **QUIET)
    client.say(id="mix-en", text=english, **QUIET)
    assert client.wait_event("mix-en")["event"] == "finished"
    assert client.wait_event("mix")["event"] == "finished"
    (start, mixed, _), (_, alone, _) = client.audio("mix"), client.audio("mix-en")
    assert start["rate"] == synth.sample_rate
    assert_speech(pcm16(mixed), synth.sample_rate, min_seconds=2.5)
    assert len(mixed) - len(alone) >= 1.0 * synth.sample_rate * 2  # a second more, in bytes


def test_say_stream_splits_like_the_whole_text(client: Client) -> None:
    """Split mid-sentence right after "Dr.": the stream speaks the same sentences as the
    whole text, and a [rate] set in one sentence carries over to the next."""
    text = "Dr. Smith arrived [rate 0.7] late. Then we ate."
    client.say(id="abbr-whole", text=text, **QUIET)
    pieces = ["Dr.", " Smith arrived [rate 0.7] la", "te. Then", " we ate."]
    for seq, piece in enumerate(pieces):
        client.publish("say/stream", json.dumps({
            "id": "abbr-stream", "seq": seq, "text": piece, "final": seq == len(pieces) - 1,
            **QUIET}))
    assert client.wait_event("abbr-stream")["event"] == "finished"
    assert client.wait_event("abbr-whole")["event"] == "finished"
    _, whole, _ = client.audio("abbr-whole")
    _, streamed, _ = client.audio("abbr-stream")
    assert_pcm_close(streamed, whole, "the whole text's audio")


# --------------------------------------------------------------------------- queue control


def _started_order(client: Client, ids: set[str]) -> list[str]:
    return [e["id"] for e in client.events() if e["event"] == "started" and e["id"] in ids]


def test_priority_jumps_the_queue(client: Client) -> None:
    client.say(id="pA", text=LONG_TEXT, sinks=["mqtt"])
    client.wait_event("pA", ("started",))
    client.say(id="pB", text="Second.", sinks=["mqtt"])
    client.say(id="pC", text="Urgent.", sinks=["mqtt"], priority=5)
    client.wait_event("pC", ("queued",))
    client.publish("stop", json.dumps({"id": "pA"}))
    assert client.wait_event("pA")["event"] == "stopped"
    assert client.wait_event("pB")["event"] == "finished"
    assert client.wait_event("pC")["event"] == "finished"
    assert _started_order(client, {"pA", "pB", "pC"}) == ["pA", "pC", "pB"]


def test_interrupt_cuts_the_current_utterance(client: Client) -> None:
    client.say(id="iA", text=LONG_TEXT, sinks=["mqtt"])
    client.wait_event("iA", ("started",))
    client.say(id="iB", text="Someone is at the door.", sinks=["mqtt"], mode="interrupt")
    assert client.wait_event("iB")["event"] == "finished"
    a = [e["event"] for e in client.events("iA")]
    assert a == ["queued", "started", "stopped"]
    evs = [(e["id"], e["event"]) for e in client.events() if e.get("id") in ("iA", "iB")]
    assert evs.index(("iA", "stopped")) < evs.index(("iB", "started"))
    _, _, stop = client.audio("iA")
    assert stop["outcome"] == "stopped"


def test_stop_by_id_and_stop_all(client: Client) -> None:
    client.say(id="sA", text=LONG_TEXT, sinks=["mqtt"])
    client.wait_event("sA", ("started",))
    client.say(id="sB", text="Not this one.", sinks=["mqtt"])
    client.say(id="sC", text="Nor this one.", sinks=["mqtt"])
    client.wait_event("sC", ("queued",))
    client.publish("stop", json.dumps({"id": "sB"}))
    assert client.wait_event("sB")["event"] == "stopped"
    client.publish("stop", "PRESS")
    assert client.wait_event("sA")["event"] == "stopped"
    assert client.wait_event("sC")["event"] == "stopped"
    assert _started_order(client, {"sA", "sB", "sC"}) == ["sA"]
    client.publish("stop", json.dumps({"id": "nobody"}))
    err = client.wait_event("nobody", ("error",))
    assert "nothing queued or playing" in err["error"]


# --------------------------------------------------------------------------- bad input

MB_TEXT = b"blah " * 200_000
BAD_UTF8 = b"caf\xc3\x28 \xff\xfe"
JUNK = b"\x00\x01\x02\x03PK\x03\x04\x1b[2J"
DEEP_JSON = b'{"text": "hi", "voice": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
BAD_INPUT: list[tuple[str, bytes]] = [
    ("say", b""), ("say", MB_TEXT), ("say", BAD_UTF8), ("say", b'{"text": "hi",'),
    ("say", b'{"text": "hi", "voice": "xx_XX-nobody-low"}'), ("say", JUNK),
    ("say", b'{"text": 5}'), ("say", b'{"text": "hi", "rate": "fast"}'),
    ("say", b'{"text": "hi", "sinks": ["tv"]}'), ("say", b'{"text": "hi", "id": "a/#"}'),
    ("say/stream", b""), ("say/stream", MB_TEXT), ("say/stream", BAD_UTF8),
    ("say/stream", b'{"id": "x1", "text": "hi"'), ("say/stream", JUNK),
    ("say/stream", b'{"id": "x2", "seq": 0, "text": "hi", "voice": "xx_XX-nobody-low"}'),
    ("say/stream", b'{"text": "no id"}'),
    ("stop", MB_TEXT), ("stop", BAD_UTF8), ("stop", b'{"id": '), ("stop", JUNK),
    ("set/volume", b""), ("set/volume", MB_TEXT), ("set/volume", BAD_UTF8),
    ("set/volume", b"{"), ("set/volume", b"loud"), ("set/volume", b"1.5"), ("set/volume", JUNK),
    ("set/voice", b""), ("set/voice", MB_TEXT), ("set/voice", BAD_UTF8), ("set/voice", b"{"),
    ("set/voice", b"xx_XX-nobody-low"), ("set/voice", JUNK),
    ("say", DEEP_JSON), ("set/voice", DEEP_JSON),
]


def test_bad_input_gets_an_error_event_each_and_herald_keeps_serving(client: Client) -> None:
    for topic, payload in BAD_INPUT:
        client.publish(topic, payload)
    want: dict[str, int] = {}
    for topic, _ in BAD_INPUT:
        want[f"{BASE}/{topic}"] = want.get(f"{BASE}/{topic}", 0) + 1

    def counted(msgs: list[Msg]) -> Any:
        got: dict[str, int] = {}
        for e in (m.json() for m in msgs if m.topic == f"{BASE}/event"):
            if e["event"] == "error":
                got[e["topic"]] = got.get(e["topic"], 0) + 1
        return got if got == want else None

    client.wait(counted, 60, f"one error event per bad input {want}")
    errors = [e for e in client.events() if e["event"] == "error"]
    assert all(e["error"] and len(e["error"]) < 400 for e in errors)
    messages = " | ".join(e["error"] for e in errors)
    for expected in ("empty 'text'", "limit is", "not valid UTF-8", "malformed JSON",
                     "unknown voice", "binary data", "volume must be", "nested too deeply"):
        assert expected in messages, expected
    assert "internal error" not in messages
    # still serving
    client.say(id="after-bad", text="Still here.", sinks=["mqtt"])
    assert client.wait_event("after-bad")["event"] == "finished"


def test_old_say_is_not_spoken_late(client: Client) -> None:
    client.say(id="old1", text="Yesterday's news.", ts=time.time() - 3600, sinks=["mqtt"])
    err = client.wait_event("old1", ("error", "queued"))
    assert err["event"] == "error" and "max_age" in err["error"]
    client.say(id="fresh1", text="Today.", ts=time.time(), sinks=["mqtt"])
    assert client.wait_event("fresh1")["event"] == "finished"
    assert [e["event"] for e in client.events("old1")] == ["error"]


def test_set_volume_and_voice_update_the_status(client: Client) -> None:
    client.publish("set/volume", "0.4")
    client.wait(lambda ms: any(m.topic == f"{BASE}/status" and m.json()["volume"] == 0.4
                               for m in ms), 30, "volume 0.4 in status")
    def statuses(ms: list[Msg], since: int) -> list[dict[str, Any]]:
        return [m.json() for m in ms[since:] if m.topic == f"{BASE}/status"]

    since = len(client.msgs)
    client.publish("set/voice", OTHER_VOICE)
    client.wait(lambda ms: any(s["voice"] == OTHER_VOICE for s in statuses(ms, since)), 30,
                "the other voice in status")
    since = len(client.msgs)
    client.publish("set/voice", "en")  # a language picks an installed voice that speaks it
    client.publish("set/volume", "1")
    # Every status from now on carries the English voice again, the last one volume 1.
    client.wait(lambda ms: (st := statuses(ms, since)) and st[-1]["volume"] == 1.0, 30,
                "volume 1 in status")
    assert not [e for e in client.events() if e["event"] == "error"]
    after = statuses(client.msgs, since)
    assert all(s["voice"] == DEFAULT_VOICE for s in after), after
    assert after[-1]["version"]


def test_retained_commands_published_live_are_refused_once_and_never_executed(
        client: Client) -> None:
    """MQTT 5 (herald's default) keeps the retain flag on live delivery (Retain As
    Published), so a retained command published while herald is connected is recognised:
    refused with one error event each, on every command topic, and not executed."""
    def status() -> dict[str, Any]:
        return next(m.json() for m in reversed(client.msgs) if m.topic == f"{BASE}/status")
    client.wait(lambda ms: any(m.topic == f"{BASE}/status" for m in ms), 10, "the status")
    before = status()
    retained = {
        f"{BASE}/say": json.dumps({"id": "ret-say", "text": "Never.", "sinks": ["mqtt"]}),
        f"{BASE}/say/stream": json.dumps({"id": "ret-stream", "seq": 0, "text": "Never.",
                                          "final": True, "sinks": ["mqtt"]}),
        f"{BASE}/stop": "PRESS",
        f"{BASE}/set/volume": "0.1" if before["volume"] != 0.1 else "0.2",
        f"{BASE}/set/voice": OTHER_VOICE if before["voice"] != OTHER_VOICE else "en",
        "hermes/tts/say": json.dumps({"text": "Never.", "siteId": "hall", "id": "ret-h"}),
    }
    try:
        for topic, payload in retained.items():
            client.publish(topic, payload, retain=True)
        client.say(id="after-retained", text="Only this.", sinks=["mqtt"])
        assert client.wait_event("after-retained")["event"] == "finished"
        refused = [e for e in client.events() if e["event"] == "error"
                   and "retained command refused" in e["error"]]
        assert sorted(e["topic"] for e in refused) == sorted(retained), refused
        assert all(f"mosquitto_pub -r -n -t '{e['topic']}'" in e["error"] for e in refused)
        for rid in ("ret-say", "ret-stream", "ret-h"):
            assert client.events(rid) == [], rid  # never queued
        after = status()
        assert (after["volume"], after["voice"]) == (before["volume"], before["voice"])
        finished = [m.json() for m in client.msgs if m.topic == "hermes/tts/sayFinished"]
        assert {"id": "ret-h", "sessionId": None, "siteId": "hall"} in finished
    finally:
        for topic in retained:  # clearing one is not a command: no error, no stop
            client.publish(topic, b"", retain=True)
    client.say(id="after-cleared", text="Cleared.", sinks=["mqtt"])
    assert client.wait_event("after-cleared")["event"] == "finished"
    errors = [e for e in client.events() if e["event"] == "error"]
    assert len(errors) == len(retained), errors


def test_discovery_is_republished_when_home_assistant_comes_online(client: Client) -> None:
    topic = f"homeassistant/device/{DEVICE}/config"
    first = client.wait(lambda ms: next((m for m in ms if m.topic == topic), None), 10,
                        "retained discovery")
    assert first.retain and first.json()["cmps"]["say"]["command_topic"] == f"{BASE}/say"
    client.publish("homeassistant/status", "online")
    again = client.wait(lambda ms: next((m for m in ms if m.topic == topic and not m.retain),
                                        None), 30, "discovery republished")
    assert again.json() == first.json()


def test_hermes_say_for_our_site_is_spoken_and_answered(client: Client) -> None:
    say = {"text": "Rhasspy says hi.", "siteId": "hall", "id": "h-1", "sessionId": "sess-9"}
    client.publish("hermes/tts/say", json.dumps({**say, "siteId": "garage", "id": "h-0"}))
    client.publish("hermes/tts/say", json.dumps(say))
    done = client.wait(lambda ms: next((m.json() for m in ms
                                        if m.topic == "hermes/tts/sayFinished"), None),
                       what="hermes sayFinished")
    assert done == {"id": "h-1", "sessionId": "sess-9", "siteId": "hall"}
    assert [e["event"] for e in client.events("h-1")] == ["queued", "started", "finished"]
    assert client.events("h-0") == []  # another site's request is not ours


# Hermes audio server: playBytes/<requestId> (a WAV) -> the speaker -> playFinished

PLAY = "hermes/audioServer/hall/playBytes"
PLAY_FINISHED = "hermes/audioServer/hall/playFinished"


@pytest.fixture
def audio_server(herald: Herald) -> Iterator[Client]:
    """A client that also sees the Hermes audio server topics, as Rhasspy's dialogue does."""
    c = Client(herald.broker.port, topics=(f"{BASE}/#", "hermes/audioServer/#"))
    yield c
    c.close()
    assert herald.proc.poll() is None, "herald died:\n" + herald.tail()


def play_finished(client: Client, request_id: str, site: str = "hall") -> dict[str, Any]:
    topic = f"hermes/audioServer/{site}/playFinished"
    return client.wait(lambda ms: next((m.json() for m in ms if m.topic == topic
                                        and m.json().get("id") == request_id), None),
                       what=f"playFinished for {request_id}")


def played_tail(herald: Herald) -> np.ndarray:
    """The last sound in ALSA's file, after the silence PortAudio wrote around it. (ALSA's
    file plugin truncates the file when the device is reopened for another rate.)"""
    out = np.frombuffer(herald.alsa.pcm()[: len(herald.alsa.pcm()) // 2 * 2], dtype="<i2")
    nonzero = np.flatnonzero(out)
    assert len(nonzero), "nothing was played"
    return out[: nonzero[-1] + 1]


def test_decode_wav_downmixes_and_refuses_what_it_cannot_play() -> None:
    left = np.array([1000, -2000, 30000, 7], dtype="<i2")
    right = np.array([3000, 2000, 30001, -8], dtype="<i2")
    stereo = np.stack([left, right], axis=1).tobytes()
    pcm, rate = decode_wav(wav_bytes(stereo, AudioFormat(16000, channels=2)))
    assert rate == 16000
    assert np.frombuffer(pcm, "<i2").tolist() == [2000, 0, 30000, 0]  # averaged, rounded
    mono = np.arange(-300, 300, dtype="<i2").tobytes()
    assert decode_wav(wav_bytes(mono, AudioFormat(44100))) == (mono, 44100)
    # a streamer's header (sizes at their maximum) is fine too
    assert decode_wav(wav_stream_header(AudioFormat(22050)) + mono) == (mono, 22050)
    for payload, message in [
        (b"", "empty payload"), (b"hello, not audio", "not a usable WAV file"),
        (wav_bytes(mono, AudioFormat(22050))[:30], "not a usable WAV file"),
        (wav_bytes(mono[:200], AudioFormat(22050, width=1)), "8-bit samples"),
        (wav_bytes(b"", AudioFormat(22050)), "no audio frames"),
        (wav_bytes(mono, AudioFormat(22050)) + b"\0" * 2000, "the limit is"),
    ]:
        with pytest.raises(RequestError, match=re.escape(message)):
            decode_wav(payload, max_bytes=2000)


def test_hermes_play_bytes_plays_the_wav_and_answers(audio_server: Client, herald: Herald,
                                                     synth: Any) -> None:
    ref = np.frombuffer(reference_pcm(synth, "Ding dong.", SynthesisOptions(seed=3)), "<i2")
    wav = wav_bytes(ref.tobytes(), AudioFormat(synth.sample_rate))
    audio_server.publish(f"{PLAY}/chime-1", wav)
    assert play_finished(audio_server, "chime-1") == {
        "id": "chime-1", "siteId": "hall", "sessionId": None}
    assert [e["event"] for e in audio_server.events("chime-1")] == [
        "queued", "started", "finished"]
    rec = audio_server.wait(lambda ms: next((m.json() for m in ms if m.topic == f"{BASE}/latency"
                                             and m.json()["id"] == "chime-1"), None),
                            what="latency of chime-1")
    assert (rec["voice"], rec["sink"], rec["synth_ms"], rec["outcome"]) == (
        "wav", "speaker", 0, "ok")
    assert rec["audio_ms"] == pytest.approx(len(ref) / synth.sample_rate * 1000, abs=1)
    # the speaker played exactly the WAV's samples (after its leading silence)
    nz = np.flatnonzero(ref)
    want = ref[nz[0]: nz[-1] + 1]
    got = played_tail(herald)
    assert len(got) >= len(want)
    assert np.array_equal(got[-len(want):], want), "the speaker did not play the WAV as sent"
    assert_speech(want.astype(np.float32) / 32767, synth.sample_rate, min_seconds=0.3)


def test_hermes_play_bytes_stereo_16k_is_mixed_down(audio_server: Client,
                                                    herald: Herald) -> None:
    rate, seconds, freq = 16000, 0.5, 440.0
    tone = np.sin(2 * np.pi * freq * np.arange(int(rate * seconds)) / rate)
    stereo = np.stack([0.6 * tone, 0.2 * tone], axis=1)  # averaged: 0.4 * tone
    wav = wav_bytes(np.rint(stereo * 32767).astype("<i2").tobytes(),
                    AudioFormat(rate, channels=2))
    audio_server.publish(f"{PLAY}/tone-1", wav)
    play_finished(audio_server, "tone-1")
    assert audio_server.wait_event("tone-1")["event"] == "finished"
    out = played_tail(herald)
    # the tone is the last sound: back from its end to the silence before it
    zero_runs = np.flatnonzero(np.convolve(out == 0, np.ones(64), "valid") == 64)
    tone_out = out[zero_runs[-1] + 64:].astype(np.float64) / 32767
    device_rate = min((16000, 22050, 44100, 48000),
                      key=lambda r: abs(len(tone_out) / seconds - r))
    assert len(tone_out) / seconds == pytest.approx(device_rate, rel=0.02)
    spectrum = np.abs(np.fft.rfft(tone_out))
    peak = np.fft.rfftfreq(len(tone_out), 1 / device_rate)[spectrum.argmax()]
    assert peak == pytest.approx(freq, abs=3)
    middle = tone_out[len(tone_out) // 4: 3 * len(tone_out) // 4]
    level = float(np.sqrt(np.mean(middle ** 2)))
    assert level == pytest.approx(0.4 / np.sqrt(2), rel=0.03), "not the channels' average"


def test_hermes_play_bytes_waits_its_turn_and_can_be_stopped(audio_server: Client) -> None:
    chime = wav_bytes(np.full(1600, 500, "<i2").tobytes(), AudioFormat(16000))
    audio_server.say(id="q-long", text=LONG_TEXT)
    audio_server.wait_event("q-long", ("started",))
    audio_server.publish(f"{PLAY}/q-wav", chime)
    audio_server.publish(f"{PLAY}/q-wav2", chime)
    audio_server.wait_event("q-wav2", ("queued",))
    audio_server.publish("stop", json.dumps({"id": "q-wav"}))
    assert audio_server.wait_event("q-wav")["event"] == "stopped"
    assert play_finished(audio_server, "q-wav")["id"] == "q-wav"
    audio_server.publish("stop", json.dumps({"id": "q-long"}))
    assert audio_server.wait_event("q-long")["event"] == "stopped"
    assert audio_server.wait_event("q-wav2")["event"] == "finished"
    play_finished(audio_server, "q-wav2")
    evs = [(e["id"], e["event"]) for e in audio_server.events()]
    assert evs.index(("q-long", "stopped")) < evs.index(("q-wav2", "started"))
    assert ("q-wav", "started") not in evs


def test_hermes_play_bytes_bad_wav_and_other_sites(audio_server: Client) -> None:
    good = wav_bytes(np.zeros(1600, "<i2").tobytes(), AudioFormat(16000))
    audio_server.publish("hermes/audioServer/garage/playBytes/g-1", good)
    audio_server.publish(f"{PLAY}/bad-1", b"\x00\x01 certainly not a WAV file")
    audio_server.publish(f"{PLAY}/bad-2", wav_bytes(b"\x80" * 800, AudioFormat(8000, width=1)))
    for rid, message in [("bad-1", "not a usable WAV file"), ("bad-2", "8-bit samples")]:
        err = audio_server.wait_event(rid, ("error",))
        assert message in err["error"] and err["topic"] == f"{PLAY}/{rid}"
        assert play_finished(audio_server, rid)["id"] == rid  # Rhasspy is not left waiting
        assert [e["event"] for e in audio_server.events(rid)] == ["error"]
    # still serving, and the garage's audio was never ours
    audio_server.publish(f"{PLAY}/play-after-bad", good)
    assert play_finished(audio_server, "play-after-bad")["id"] == "play-after-bad"
    assert audio_server.wait_event("play-after-bad")["event"] == "finished"
    assert audio_server.events("g-1") == []
    assert not [m for m in audio_server.msgs if m.topic.startswith("hermes/audioServer/garage/")
                and not m.topic.endswith("/g-1")]


def test_herald_say_mqtt_cli(herald: Herald) -> None:
    out = subprocess.run([sys.executable, "-m", "daemon.cli", "say", "--mqtt",
                          f"127.0.0.1:{herald.broker.port}", "--device-id", DEVICE,
                          "Hello from the command line."], cwd=ROOT, env=herald_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "finished" in out.stdout


def test_herald_say_mqtt_cli_sends_the_request_options(herald: Herald, client: Client) -> None:
    """--speaker, --length-scale and the noise options go into the `say` request (they were
    dropped, so the daemon spoke at its own rate): a speaker the voice lacks is refused."""
    def say(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "daemon.cli", "say", "--mqtt",
                               f"127.0.0.1:{herald.broker.port}", "--device-id", DEVICE,
                               *options, "Slowly now."], cwd=ROOT, env=herald_env(),
                              capture_output=True, text=True, timeout=120)

    out = say("--length-scale", "1.5", "--noise-scale", "0.3", "--noise-w", "0")
    assert out.returncode == 0, out.stderr
    sent = [m.json() for m in client.msgs if m.topic == f"{BASE}/say"]
    assert [(p["rate"], p["noise_scale"], p["noise_w"]) for p in sent] == [(1.5, 0.3, 0.0)]
    refused = say("--speaker", "3")
    assert refused.returncode == 1
    assert "has a single speaker; got '3'" in refused.stderr


# --------------------------------------------------------------------------- outages, shutdown


def test_broker_restart_reconnects_and_delivers_queued_say_once(herald: Herald) -> None:
    # A persistent-session client (like an automation) with QoS 1 subscriptions.
    pc = Client(herald.broker.port, client_id="test-persistent", clean=False)
    log_start = len(herald.output())
    try:
        # A retained command is refused, once: herald's resumed session does not get the
        # broker's stored copy again when it resubscribes after the outage.
        pc.publish("say", json.dumps({"id": "retained1", "text": "Never.",
                                      "sinks": ["mqtt"]}), retain=True)
        pc.wait(lambda ms: any(m.topic == f"{BASE}/event" and "retained" in m.json().get(
            "error", "") for m in ms), 30, "the retained say refused")
        herald.broker.stop()
        restarted = time.monotonic()
        # published while the broker (and so herald) is down: paho keeps it and resends it
        pc.c.publish(f"{BASE}/say", json.dumps({"id": "while-down", "text": "Welcome back.",
                                                "sinks": ["mqtt"]}), qos=1)
        herald.broker.start()
        assert pc.wait_event("while-down", timeout=120)["event"] == "finished"
        pc.wait(lambda ms: any(m.topic == f"{BASE}/availability" and m.payload == b"online"
                               and not m.retain and m.at > restarted for m in ms), 60,
                "herald's own 'online' after the restart")
        pc.say(id="after-restart", text="And again.", sinks=["mqtt"])
        assert pc.wait_event("after-restart")["event"] == "finished"
        # QoS 1 is at-least-once towards the test client too (an event in flight when the
        # broker died is redelivered), so "spoken once" is read from herald's own log.
        log = herald.output()[log_start:]
        assert {e["event"] for e in pc.events("while-down")} == {"queued", "started",
                                                                 "finished"}
        assert log.count(" while-down queued ") == 1 and log.count(" while-down started ") == 1
        assert pc.events("retained1") == [] and " retained1 queued " not in log
        assert log.count("retained command refused") == 1, "reported once, not per connect"
        refused = [e for e in pc.events() if e["event"] == "error" and "retained" in e["error"]]
        assert refused and refused[0]["topic"] == f"{BASE}/say"
        assert herald.proc.poll() is None
    finally:
        pc.publish("say", b"", retain=True)  # clear the retained command
        pc.close()


def test_sigterm_cuts_publishes_offline_and_exits_0(herald: Herald) -> None:
    c = Client(herald.broker.port)
    try:
        c.say(id="last", text=LONG_TEXT)
        c.wait_event("last", ("started",))
        assert herald.terminate() == 0
        assert c.wait_event("last")["event"] == "stopped"
        c.wait(lambda ms: any(m.topic == f"{BASE}/availability" and m.payload == b"offline"
                              for m in ms), 10, "offline")
        evs = [m for m in c.msgs if m.topic in (f"{BASE}/event", f"{BASE}/availability")]
        assert evs[-1].payload == b"offline", "offline must come after the last event"
    finally:
        c.close()


# --------------------------------------------------------------------------- embedded broker


def test_embedded_broker_when_no_host_is_configured(tmp_path: Path) -> None:
    """Also: the service talks to systemd (READY, STATUS, watchdog pets, STOPPING)."""
    port = free_port()
    config = tmp_path / "herald.toml"
    config.write_text(f'device_id = "{DEVICE}"\n[mqtt]\nhost = ""\nport = {port}\n'
                      "[speaker]\nenabled = false\n[wyoming]\nenabled = false\n"
                      "[http]\nenabled = false\n")
    notify = NotifySocket(tmp_path / "notify.sock")
    messages: list[str] = []
    herald = start_herald(config, tmp_path / "herald.log", herald_env(
        {"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "2000000"}))
    try:
        wait_port(port, 60)
        c = Client(port)
        try:
            c.wait_online(what="online via the embedded broker")
            c.say(id="emb1", text="No broker needed.")  # speaker off: defaults to mqtt
            assert c.wait_event("emb1")["event"] == "finished"
            _, pcm, _ = c.audio("emb1")
            assert_speech(pcm16(pcm), 22050, min_seconds=0.8)
        finally:
            c.close()
        deadline = time.monotonic() + 30
        while "WATCHDOG=1" not in messages and time.monotonic() < deadline:
            messages += notify.received(0.2)
        assert herald.terminate() == 0
        sent = "\n".join(messages + notify.received(0.2))
        for line in ("READY=1", "STATUS=idle, 0 queued, MQTT connected", "WATCHDOG=1",
                     "STOPPING=1"):
            assert line in sent, (line, sent)
        assert sent.index("READY=1") < sent.index("STOPPING=1")
    finally:
        notify.close()
        herald.kill()
        print(herald.tail())


def test_credentials_and_mqtt_311(tmp_path: Path) -> None:
    """A broker that wants a password: herald logs in (MQTT 3.1.1 here) and serves; with a
    wrong password it says so in one log line and keeps running until stopped."""
    workdir = tmp_path / "broker"
    workdir.mkdir()
    passwd = workdir / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwd), "herald", "s3cret"],
                   check=True, capture_output=True)
    broker = Broker(free_port(), workdir, password_file=passwd)
    broker.start()
    heralds: dict[str, HeraldProcess] = {}
    try:
        for password, device in (("s3cret", DEVICE), ("wrong", "authbad")):
            config = tmp_path / f"{password}.toml"
            config.write_text(
                f'device_id = "{device}"\n[mqtt]\nhost = "127.0.0.1"\nport = {broker.port}\n'
                f'protocol = "3.1.1"\nusername = "herald"\npassword = "{password}"\n'
                "[speaker]\nenabled = false\n[wyoming]\nenabled = false\n"
                "[http]\nenabled = false\n")
            heralds[password] = start_herald(config, tmp_path / f"{password}.log")
        c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
        c.username_pw_set("herald", "s3cret")
        events: list[dict[str, Any]] = []
        online: list[bytes] = []
        c.on_message = lambda cl, u, m: (online.append(m.payload) if m.topic.endswith(
            "/availability") else events.append(json.loads(m.payload)))
        c.connect("127.0.0.1", broker.port)
        c.subscribe([(f"{BASE}/event", 1), (f"{BASE}/availability", 1)])
        c.loop_start()
        try:
            deadline = time.monotonic() + 60
            heralds["s3cret"].wait_log("connected to")
            # "online" comes after herald's subscriptions: a say sent before them is lost
            while b"online" not in online:
                assert time.monotonic() < deadline, heralds["s3cret"].tail()
                time.sleep(0.05)
            c.publish(f"{BASE}/say", json.dumps({"id": "auth1", "text": "Logged in."}), 1)
            while not any(e.get("id") == "auth1" and e["event"] == "finished" for e in events):
                assert time.monotonic() < deadline, heralds["s3cret"].tail()
                time.sleep(0.1)
            refused = heralds["wrong"].wait_log("refused the connection")
        finally:
            c.disconnect()
            c.loop_stop()
        assert "Not authorized" in refused and "mqtt.password" in refused
        stop_all_still_running(heralds.values(), "a refused login must not end herald")
    finally:
        for h in heralds.values():
            h.kill()
        broker.stop()


def test_tls_with_the_brokers_ca_and_with_a_wrong_one(tls_broker: Broker, tmp_path: Path,
                                                      synth: Any) -> None:
    """mqtt.tls against a broker that speaks only TLS. With the CA that signed the broker's
    certificate herald connects and serves. With another CA the handshake fails: herald
    says so in one log line that names the TLS settings, and keeps trying (the broker sees
    one refused handshake after another) instead of exiting."""
    assert tls_broker.tls is not None
    wrong_ca = make_tls(tmp_path / "another-pki").ca
    heralds: dict[str, HeraldProcess] = {}
    try:
        for name, device, ca in (("right", DEVICE, tls_broker.tls.ca),
                                 ("wrong", "tlsbad", wrong_ca)):
            config = tmp_path / f"{name}.toml"
            config.write_text(
                f'device_id = "{device}"\n[mqtt]\nhost = "127.0.0.1"\n'
                f'port = {tls_broker.port}\n[mqtt.tls]\nenabled = true\nca = "{ca}"\n'
                "[speaker]\nenabled = false\n[wyoming]\nenabled = false\n"
                "[http]\nenabled = false\n")
            heralds[name] = start_herald(config, tmp_path / f"{name}.log")
        c = Client(tls_broker.port, ca=tls_broker.tls.ca)
        try:
            c.wait_online(what="herald online over TLS")
            c.say(id="tls1", text="Spoken over TLS.", seed=4)  # speaker off: to MQTT
            assert c.wait_event("tls1")["event"] == "finished"
            _, pcm, _ = c.audio("tls1")
            assert_pcm_close(pcm, reference_pcm(synth, "Spoken over TLS.",
                                                SynthesisOptions(seed=4)))
            c.wait(lambda ms: any(m.topic == f"{BASE}/status"
                                  and (m.json()["last_latency"] or {}).get("id") == "tls1"
                                  for m in ms), 30, "the status after tls1")
        finally:
            c.close()
        failed = heralds["wrong"].wait_log("TLS with the broker")
        assert "certificate verify failed" in failed and "mqtt.tls.ca" in failed, failed
        deadline = time.monotonic() + 60
        while tls_broker.log().count("unknown ca") < 2:  # a second attempt: it retries
            assert time.monotonic() < deadline, tls_broker.log()[-2000:]
            time.sleep(0.1)
        assert heralds["wrong"].output().count("TLS with the broker") == 1, \
            "one line, not one per attempt"
        stop_all_still_running(heralds.values(), "a failed TLS handshake must not end herald")
    finally:
        for h in heralds.values():
            h.kill()


async def test_herald_sends_each_mqtt_packet_at_once(broker: Broker) -> None:
    """Nagle's algorithm is off on herald's connection: an audio chunk right behind its
    stream's ``start`` would otherwise wait for the broker's delayed acknowledgement."""
    loop = asyncio.get_running_loop()
    connected = asyncio.Event()
    conn = Connection("test", MqttSettings(port=broker.port), "127.0.0.1", "herald-nodelay",
                      topics=lambda: [], call=loop.call_soon_threadsafe,
                      on_message=lambda msg: None, on_connected=connected.set)
    conn.start()
    try:
        await asyncio.wait_for(connected.wait(), 10)
        assert conn.client is not None
        sock = conn.client.socket()
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        await conn.stop()

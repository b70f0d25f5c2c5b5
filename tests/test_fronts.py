"""One device, three fronts: what MQTT sets and reports holds for Wyoming and HTTP too.

One ``herald run`` (a subprocess, as systemd runs it) serves the module with all three
fronts on: MQTT on a real Mosquitto, Wyoming over real TCP with the ``wyoming`` client, HTTP
with real requests, and the speaker into ALSA's file plugin. A second installed voice (16 kHz,
the bundled one is 22.05 kHz) shows which voice spoke by the audio's sample rate.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from audio_checks import assert_speech, energy, pcm16
from conftest import AlsaFile, Broker, alsa_file_env, free_port, wait_port
from herald_process import HeraldProcess, herald_env, start_herald
from mqtt_client import BASE, DEVICE, Client, Msg
from synthetic_voice import install_test_voice
from wyoming.audio import AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize, SynthesizeVoice

DEFAULT_VOICE = "en_US-joe-medium"
GUARD = 90.0  # a hang guard, never a performance threshold


@dataclass
class Herald(HeraldProcess):
    alsa: AlsaFile
    broker: Broker
    http_port: int
    wyoming_port: int
    other_voice: str

    def http(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        """POST JSON; (status, headers, body), 4xx included."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=GUARD) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def wyoming(self, synthesize: Synthesize) -> list[Any]:
        """The events a Wyoming client gets for one ``synthesize``, up to audio-stop or error."""
        async def run() -> list[Any]:
            events = []
            async with AsyncTcpClient("127.0.0.1", self.wyoming_port, connect_timeout=10,
                                      read_timeout=GUARD) as client:
                await client.write_event(synthesize.event())
                while (event := await client.read_event()) is not None:
                    events.append(event)
                    if event.type in ("audio-stop", "error"):
                        break
            return events
        return asyncio.run(run())


def write_config(tmp: Path, broker: Broker, voices: Path, http_port: int,
                 wyoming_port: int) -> Path:
    config = tmp / "herald.toml"
    config.write_text(f"""
device_id = "{DEVICE}"
[voices]
directories = ["{voices}"]
[mqtt]
host = "127.0.0.1"
port = {broker.port}
[wyoming]
uri = "tcp://127.0.0.1:{wyoming_port}"
[http]
port = {http_port}
""")
    return config


def start(tmp: Path, broker: Broker, voices: Path, alsa: AlsaFile, state: Path,
          other_voice: str) -> Herald:
    http_port, wyoming_port = free_port(), free_port()
    config = write_config(tmp, broker, voices, http_port, wyoming_port)
    env = herald_env(base=alsa.env, extra={"STATE_DIRECTORY": str(state)})
    p = start_herald(config, tmp / "herald.log", env)
    h = Herald(p.proc, p.log, alsa, broker, http_port, wyoming_port, other_voice)
    try:
        wait_port(http_port, timeout=GUARD)
        wait_port(wyoming_port, timeout=GUARD)
    except BaseException:
        h.kill()
        print(h.output())
        raise
    return h


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp("voices")
    return directory, install_test_voice(directory)


@pytest.fixture(scope="module")
def herald(tmp_path_factory: pytest.TempPathFactory,
           voices: tuple[Path, str]) -> Iterator[Herald]:
    tmp = tmp_path_factory.mktemp("herald-fronts")
    (tmp / "broker").mkdir()
    broker = Broker(free_port(), tmp / "broker")
    broker.start()
    h = start(tmp, broker, voices[0], alsa_file_env(tmp / "alsa"), tmp / "state", voices[1])
    watcher = Client(broker.port)
    try:
        watcher.wait_online()
    finally:
        watcher.close()
    yield h
    h.kill()
    broker.stop()
    shutil.rmtree(tmp / "broker", ignore_errors=True)
    print(h.output()[-5000:])


@pytest.fixture
def client(herald: Herald) -> Iterator[Client]:
    c = Client(herald.broker.port)
    yield c
    c.close()
    assert herald.proc.poll() is None, "herald died:\n" + herald.tail()


def statuses(msgs: list[Msg], since: int = 0) -> list[dict[str, Any]]:
    return [m.json() for m in msgs[since:] if m.topic == f"{BASE}/status" and m.payload]


def set_and_wait(client: Client, topic: str, value: str, key: str, expected: Any) -> None:
    since = len(client.msgs)
    client.publish(topic, value)
    client.wait(lambda ms: any(s[key] == expected for s in statuses(ms, since)), 30,
                f"{key} {expected!r} in status")


def wav_rate(body: bytes) -> int:
    with wave.open(BytesIO(body)) as w:
        return w.getframerate()


# --------------------------------------------------------------------------- one device state


def test_set_voice_over_mqtt_is_the_default_of_http_and_wyoming(herald: Herald,
                                                                client: Client) -> None:
    other = herald.other_voice
    set_and_wait(client, "set/voice", other, "voice", other)
    try:
        status, headers, body = herald.http("/tts", {"text": "Which voice is this?"})
        assert status == 200, body
        assert headers["X-Herald-Voice"] == other
        assert wav_rate(body) == 16000
        events = herald.wyoming(Synthesize(text="Which voice is this?"))
        assert events[-1].type == "audio-stop", [e.type for e in events]
        assert AudioStart.from_event(events[0]).rate == 16000
        # A request that names its voice still gets it.
        status, headers, _ = herald.http("/tts", {"text": "Hi.", "voice": DEFAULT_VOICE})
        assert (status, headers["X-Herald-Voice"]) == (200, DEFAULT_VOICE)
    finally:
        set_and_wait(client, "set/voice", DEFAULT_VOICE, "voice", DEFAULT_VOICE)
    status, headers, body = herald.http("/tts", {"text": "And now?"})
    assert (status, headers["X-Herald-Voice"], wav_rate(body)) == (200, DEFAULT_VOICE, 22050)
    events = herald.wyoming(Synthesize(text="And now?"))
    assert AudioStart.from_event(events[0]).rate == 22050


# --------------------------------------------------------------------------- Home Assistant


def test_a_notify_message_beginning_with_a_brace_is_spoken(herald: Herald,
                                                           client: Client) -> None:
    """Home Assistant's notify entity renders the discovery's command_template with the
    message as ``value``; "{kitchen} timer done." used to arrive bare and be refused as
    malformed JSON."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    topic = f"homeassistant/device/{DEVICE}/config"
    discovery = client.wait(lambda ms: next((m.json() for m in ms if m.topic == topic), None),
                            10, "retained discovery")
    say = discovery["cmps"]["say"]
    assert (say["command_topic"], say["qos"]) == (f"{BASE}/say", 1)
    payload = ImmutableSandboxedEnvironment().from_string(say["command_template"]).render(
        value="{kitchen} timer done.")
    before = len(herald.alsa.pcm())
    since = len(client.msgs)
    client.publish(say["command_topic"], payload, qos=say["qos"])
    queued = client.wait(lambda ms: next((m.json() for m in ms[since:]
                                          if m.topic == f"{BASE}/event"), None), 30, "an event")
    assert queued["event"] == "queued", queued
    assert client.wait_event(queued["id"])["event"] == "finished"
    record = client.wait(lambda ms: next((m.json() for m in ms if m.topic == f"{BASE}/latency"
                                          and m.json()["id"] == queued["id"]), None))
    assert record["sink"] == "speaker" and record["audio_ms"] > 1000  # "kitchen" too
    assert_speech(pcm16(herald.alsa.pcm()[before:]), 22050,
                  min_seconds=record["audio_ms"] / 1000 * 0.9)


# --------------------------------------------------------------------------- status of all work


@pytest.mark.parametrize("front", ["wyoming", "http"])
def test_work_on_every_front_moves_the_status_and_latency_sensors(herald: Herald,
                                                                  client: Client,
                                                                  front: str) -> None:
    """Home Assistant's State, Time to first audio and Real-time factor sensors read the
    retained status: a Wyoming or HTTP synthesis must show there as MQTT work does."""
    since = len(client.msgs)
    text = "Herald is busy speaking this sentence for a while, one word after another."
    if front == "wyoming":
        events = herald.wyoming(Synthesize(text=text))
        assert events[-1].type == "audio-stop"
    else:
        status, _, _ = herald.http("/tts", {"text": text})
        assert status == 200

    def latest(ms: list[Msg]) -> dict[str, Any] | None:
        st = statuses(ms, since)
        done = [s for s in st if (s["last_latency"] or {}).get("front") == front]
        return done[-1] if done and st[-1]["state"] == "idle" else None

    last = client.wait(latest, 30, f"an idle status with the {front} latency")
    assert any(s["state"] == "speaking" for s in statuses(client.msgs, since))
    latency = last["last_latency"]
    assert latency["outcome"] == "ok" and latency["first_audio_ms"] > 0 and latency["rtf"] > 0
    # The same record went out on the latency topic.
    records = [m.json() for m in client.msgs[since:] if m.topic == f"{BASE}/latency"]
    assert latency in records


# --------------------------------------------------------------------------- logs


def test_every_log_line_about_a_request_carries_its_id(herald: Herald, client: Client) -> None:
    """README's ``journalctl -u herald HERALD_REQUEST_ID=<id>``: herald's handler (journald
    under systemd, stderr here; the same filter fills HERALD_REQUEST_ID and the ``[id]``
    prefix) must get the id from the request being served, on every front."""
    since = len(client.msgs)
    client.say(id="logged-mqtt", text="Log me.", sinks=["mqtt"])
    assert client.wait_event("logged-mqtt")["event"] == "finished"
    status, headers, _ = herald.http("/tts", {"text": "Log me."})
    assert status == 200
    http_id = headers["X-Herald-Id"]
    assert herald.wyoming(Synthesize(text="Log me."))[-1].type == "audio-stop"
    wyoming_id = client.wait(lambda ms: next((m.json()["id"] for m in ms[since:]
                                              if m.topic == f"{BASE}/latency"
                                              and m.json()["front"] == "wyoming"), None))
    herald.wait_log(f"[{wyoming_id}] {wyoming_id} ", 30)  # its latency line is written
    lines = herald.output().splitlines()
    for rid, expected in (("logged-mqtt", ("queued from mqtt", "started", "via mqtt->mqtt")),
                          (http_id, ("via http->http",)),
                          (wyoming_id, ("via wyoming->wyoming",))):
        tagged = [line for line in lines if f"[{rid}]" in line]
        for text in expected:
            assert any(text in line for line in tagged), (rid, text, tagged)
        # No line names the request without carrying its id.
        assert [line for line in lines if rid in line and f"[{rid}]" not in line] == []


def test_voice_and_volume_survive_a_restart(tmp_path: Path, voices: tuple[Path, str]) -> None:
    (tmp_path / "broker").mkdir()
    broker = Broker(free_port(), tmp_path / "broker")
    broker.start()
    state = tmp_path / "state"
    heard: list[float] = []
    try:
        for run, alsa_dir in enumerate(("alsa1", "alsa2")):
            alsa = alsa_file_env(tmp_path / alsa_dir)
            h = start(tmp_path / alsa_dir, broker, voices[0], alsa, state, voices[1])
            c = Client(broker.port)
            try:
                c.wait(lambda ms: any(s.get("version") for s in statuses(ms)), 60,
                       "a status from this run")
                if run == 0:
                    c.say(id="loud", text="The same words twice.", seed=3,
                          voice=DEFAULT_VOICE, sinks=["speaker"])
                    assert c.wait_event("loud")["event"] == "finished"
                    set_and_wait(c, "set/voice", voices[1], "voice", voices[1])
                    set_and_wait(c, "set/volume", "0.3", "volume", 0.3)
                else:
                    # Only this run's status counts: the retained one of the first run was
                    # cleared before it started.
                    last = statuses(c.msgs)[-1]
                    assert (last["voice"], last["volume"]) == (voices[1], 0.3), last
                    status, headers, _ = h.http("/tts", {"text": "Still me?"})
                    assert (status, headers["X-Herald-Voice"]) == (200, voices[1])
                    c.say(id="soft", text="The same words twice.", seed=3,
                          voice=DEFAULT_VOICE, sinks=["speaker"])
                    assert c.wait_event("soft")["event"] == "finished"
                assert h.terminate() == 0, h.tail()
                heard.append(energy(pcm16(alsa.pcm())))
            finally:
                h.kill()
                c.publish("status", b"", retain=True)  # forget the retained status
                c.close()
        saved = json.loads((state / "state.json").read_text())
        assert saved == {"voice": voices[1], "volume": 0.3}
        # The speaker plays at the saved volume: the same words, 0.3 as loud. Their energy
        # is compared, not their mean level: the device's file holds as much silence as the
        # stream happened to write around the words, which differs from run to run.
        assert heard[0] > 1.0
        assert 0.29 < heard[1] / heard[0] < 0.31, heard
    finally:
        broker.stop()


# The same bad fields, sent through each front: (what, fields, words of the one verdict,
# HTTP status, error code). Each front answers in its own form; the verdict and its code are
# one (MQTT's event and Wyoming's error carry the code, HTTP maps it to the status).
BAD_FIELDS = [
    ("control character", {"text": "Lights\x07 off."}, "control character", 400, "bad-text"),
    ("blank text", {"text": " \n "}, "empty", 400, "empty-text"),
    ("unknown voice", {"text": "Hi.", "voice": "xx_XX-nobody-low"}, "unknown voice", 404,
     "unknown-voice"),
    # Wyoming names a speaker only together with its voice's name
    ("speaker the voice lacks", {"text": "Hi.", "voice": DEFAULT_VOICE, "speaker": "7"},
     "single speaker", 400, "bad-voice"),
]


@pytest.mark.parametrize(("what", "fields", "verdict", "status", "code"), BAD_FIELDS,
                         ids=[case[0] for case in BAD_FIELDS])
def test_the_same_bad_field_gets_the_same_verdict_on_every_front(
        herald: Herald, client: Client, what: str, fields: dict[str, Any], verdict: str,
        status: int, code: str) -> None:
    rid = client.say(id="bad-" + what.replace(" ", "-"), **fields)
    event = client.wait_event(rid, ("error", "queued"))
    assert event["event"] == "error" and verdict in event["error"], event
    assert event["code"] == code, event

    got, _, body = herald.http("/tts", fields)
    assert got == status and verdict in json.loads(body)["error"], body

    voice = SynthesizeVoice(name=fields.get("voice"), speaker=fields.get("speaker"))
    events = herald.wyoming(Synthesize(text=fields["text"], voice=voice))
    assert [e.type for e in events] == ["error"], f"{what}: {[e.type for e in events]}"
    assert events[0].data["code"] == code and verdict in events[0].data["text"], events[0].data

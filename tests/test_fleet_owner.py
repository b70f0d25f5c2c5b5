"""A satellite without a model (``node.role = "satellite"``) as the owner of its jobs,
against workers the test plays per the protocol (``protocol_worker``): what the owner must
cope with, on purpose: no worker, a busy one, one that never answers, one that dies mid-job,
a stop, streamed text. A real ``herald run`` satellite, a real Mosquitto with MQTT 5, the
speaker on ALSA's file plugin.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from audio_checks import assert_pcm_close, assert_speech, pcm16, reference_pcm
from conftest import AlsaFile, Broker, alsa_file_env, start_broker
from herald_process import HeraldProcess, herald_env, start_herald
from mqtt_client import BASE, DEVICE, Client
from protocol_worker import FLEET, Behaviour, ProtocolWorker

from tts import SynthesisOptions

# The workers synthesize in this process while their heartbeats must get through every half
# second and a claim within CLAIM_TIMEOUT: a busy neighbour would make claims of slowness.
pytestmark = pytest.mark.alone

TEXT = "The laundry is done. Please take it out of the machine."
CLAIM_TIMEOUT = 1.0
ATTEMPTS = 3


@dataclass
class Satellite(HeraldProcess):
    alsa: AlsaFile
    broker: Broker


@pytest.fixture(scope="module")
def satellite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Satellite]:
    tmp = tmp_path_factory.mktemp("fleet-owner")
    broker = start_broker(tmp / "broker")
    alsa = alsa_file_env(tmp / "alsa")
    config = tmp / "herald.toml"
    config.write_text(f"""
device_id = "{DEVICE}"
[node]
role = "satellite"
[mqtt]
host = "127.0.0.1"
port = {broker.port}
[fleet]
claim_timeout = {CLAIM_TIMEOUT}
dead_after = 1.5
attempts = {ATTEMPTS}
""")
    started = start_herald(config, tmp / "herald.log", herald_env(base=alsa.env))
    sat = Satellite(started.proc, started.log, alsa, broker)
    watcher = Client(broker.port)
    try:
        watcher.wait_online()
        yield sat
    finally:
        watcher.close()
        sat.kill()
        broker.stop()
        print(sat.output()[-5000:])


@pytest.fixture
def client(satellite: Satellite) -> Iterator[Client]:
    c = Client(satellite.broker.port, topics=(f"{BASE}/#", f"{FLEET}/#"))
    yield c
    c.close()
    assert satellite.proc.poll() is None, "the satellite died:\n" + satellite.tail()


@pytest.fixture
def workers(satellite: Satellite, synth: Any) -> Iterator[list[ProtocolWorker]]:
    """Start workers with ``add``; each is closed (offline) after the test."""
    started: list[ProtocolWorker] = []
    yield started
    for w in started:
        w.close()


def render(synth: Any) -> Any:
    def make(job: dict[str, Any]) -> bytes:
        return reference_pcm(synth, job["text"], SynthesisOptions(seed=job["options"]["seed"]))
    return make


def add(workers: list[ProtocolWorker], satellite: Satellite, synth: Any, name: str,
        **behaviour: Any) -> ProtocolWorker:
    """Start a worker and wait until the satellite has taken in its presence (its view of the
    fleet is what it sends jobs by; each worker here has a name of its own)."""
    w = ProtocolWorker(satellite.broker.port, name, render(synth), Behaviour(**behaviour))
    workers.append(w)
    satellite.wait_log(f"fleet: {name} is online", 10)
    return w


def kinds(client: Client, rid: str) -> list[str]:
    return [e["event"] for e in client.events(rid)]


# --------------------------------------------------------------------------- no model here


def test_a_satellite_loads_no_model(satellite: Satellite) -> None:
    """No torch in the process: neither its library mapped nor its Python module loaded,
    and the fronts that need a model said they are off."""
    maps = open(f"/proc/{satellite.proc.pid}/maps").read()
    assert "libtorch" not in maps and "torch/lib" not in maps
    assert "Wyoming and HTTP: off on a satellite" in satellite.output()
    status = open(f"/proc/{satellite.proc.pid}/status").read()
    rss_kb = int(next(line.split()[1] for line in status.splitlines()
                      if line.startswith("VmRSS")))
    assert rss_kb < 150_000, f"a satellite holds {rss_kb / 1024:.0f} MB"


def test_a_satellite_reloads_with_no_voices_to_rescan(satellite: Satellite) -> None:
    satellite.proc.send_signal(signal.SIGHUP)
    satellite.wait_log("reload done", 10)
    assert satellite.proc.poll() is None


def test_no_worker_online_is_unavailable_and_sends_nothing(client: Client) -> None:
    client.say(id="none1", text=TEXT)
    ev = client.wait_event("none1")
    assert (ev["event"], ev["code"]) == ("error", "unavailable"), ev
    assert "start one" in ev["error"]
    assert not [m for m in client.msgs if m.topic == f"{FLEET}/jobs"]


# --------------------------------------------------------------------------- one worker


def test_say_through_one_worker(client: Client, satellite: Satellite, synth: Any,
                                workers: list[ProtocolWorker]) -> None:
    w = add(workers, satellite, synth, "w-one")
    before = len(satellite.alsa.pcm())
    client.say(id="one1", text=TEXT, sinks=["speaker", "mqtt"])
    assert client.wait_event("one1")["event"] == "finished"
    assert kinds(client, "one1") == ["queued", "started", "finished"]
    [job] = w.seen.jobs
    assert (job["job"], job["attempt"], job["owner"], job["text"]) == ("one1", 1, DEVICE, TEXT)
    assert job["audio"] == f"{FLEET}/device/{DEVICE}/audio"
    assert (job["voice"], job["skip_chunks"], job["stream"], job["sync"]) == (
        "en_US-joe-medium", 0, False, False)
    assert isinstance(job["options"]["seed"], int)  # the owner always picks one
    start, pcm, stop = client.audio("one1")  # what the satellite played, as it played it
    assert start["rate"] == 22050
    want = reference_pcm(synth, TEXT, SynthesisOptions(seed=job["options"]["seed"]))
    assert_pcm_close(pcm, want, "the worker's audio")
    assert_speech(pcm16(satellite.alsa.pcm()[before:]), 22050, min_seconds=2.0)
    rec = client.wait(lambda ms: next((m.json() for m in ms if m.topic == f"{BASE}/latency"
                                       and m.json()["id"] == "one1"), None), what="latency")
    assert (rec["front"], rec["outcome"], rec["voice"]) == ("mqtt", "ok", "en_US-joe-medium")
    assert rec["audio_ms"] == pytest.approx(len(want) / 2 / 22.05, abs=1)


def test_unknown_voice_is_refused_at_once(client: Client, satellite: Satellite, synth: Any,
                                          workers: list[ProtocolWorker]) -> None:
    w = add(workers, satellite, synth, "w-voice")
    client.say(id="uv1", text=TEXT, voice="de_DE-nobody-low")
    ev = client.wait_event("uv1", timeout=5)
    assert (ev["event"], ev["code"]) == ("error", "unknown-voice"), ev
    assert "en_US-joe-medium" in ev["error"]  # says what the workers offer
    client.say(id="uv2", text=TEXT, voice="en")  # a language resolves as on a model node
    assert client.wait_event("uv2")["event"] == "finished"
    assert [j["job"] for j in w.seen.jobs] == ["uv2"]


def test_a_stop_cancels_the_job(client: Client, satellite: Satellite, synth: Any,
                                workers: list[ProtocolWorker]) -> None:
    w = add(workers, satellite, synth, "w-stop", pace=0.1)
    client.say(id="st1", text=TEXT)
    client.wait_event("st1", ("started",))
    client.wait(lambda ms: len(w.seen.published.get("st1", [])) >= 3, 10, "a few chunks")
    client.publish("stop", json.dumps({"id": "st1"}))
    assert client.wait_event("st1")["event"] == "stopped"
    assert kinds(client, "st1") == ["queued", "started", "stopped"]
    client.wait(lambda ms: ("st1", None) in w.seen.cancels, 5, "the cancel")
    # At most the chunk it was sending as the cancel came; five of its chunk intervals later,
    # counted from there rather than from the say, however long the cancel took to come.
    sent = len(w.seen.published["st1"])
    time.sleep(0.5)
    assert len(w.seen.published["st1"]) <= sent + 1, "the worker went on after the cancel"


def test_say_stream_goes_to_the_worker_piece_by_piece(
        client: Client, satellite: Satellite, synth: Any,
        workers: list[ProtocolWorker]) -> None:
    w = add(workers, satellite, synth, "w-stream")
    pieces = ["The weather today: ", "sunny in the morning, ", "rain after lunch."]
    for seq, text in enumerate(pieces):
        client.publish("say/stream", json.dumps({"id": "ss1", "seq": seq, "text": text,
                                                 "final": seq == len(pieces) - 1}))
        time.sleep(0.3)
    assert client.wait_event("ss1")["event"] == "finished"
    assert kinds(client, "ss1") == ["queued", "started", "finished"]
    [job] = w.seen.jobs
    assert job["stream"] is True and "".join(pieces).startswith(job["text"])
    assert w.seen.texts["ss1"] == "".join(pieces)


# --------------------------------------------------------------------------- misbehaving


def test_busy_workers_make_the_owner_send_again(client: Client, satellite: Satellite,
                                                synth: Any,
                                                workers: list[ProtocolWorker]) -> None:
    busy = add(workers, satellite, synth, "w-busy", busy=True)
    good = add(workers, satellite, synth, "w-good")
    for i in range(3):  # the broker deals the sends out in turn: some land on the busy one
        client.say(id=f"b{i}", text="Busy or not.", sinks=["mqtt"])
        assert client.wait_event(f"b{i}")["event"] == "finished"
    refused = {(j, a) for j, a, s in busy.seen.states if s == "busy"}
    assert refused, "no job reached the busy worker"
    for job, attempt in refused:  # each went on to the good one, as a later attempt
        assert any(j == job and a > attempt for j, a, s in good.seen.states
                   if s == "claimed"), (job, good.seen.states)


def test_a_job_waits_for_busy_workers_however_many_sends_it_takes(
        client: Client, satellite: Satellite, synth: Any,
        workers: list[ProtocolWorker]) -> None:
    """Busy answers prove the workers are there: the job waits for room, as in a single
    herald's queue, rather than failing after ``attempts`` sends like a job nobody answers."""
    busy = add(workers, satellite, synth, "w-full", busy=True)
    client.say(id="full1", text="Wait for a worker.", sinks=["mqtt"])
    client.wait(lambda ms: sum(1 for j, _, s in busy.seen.states if j == "full1"
                               and s == "busy") > ATTEMPTS, 15, "more busy answers than attempts")
    assert not [e for e in client.events("full1") if e["event"] in ("error", "finished")]
    good = add(workers, satellite, synth, "w-free")
    assert client.wait_event("full1", timeout=15)["event"] == "finished"
    assert any(j == "full1" and s == "claimed" for j, _, s in good.seen.states)


def test_no_answer_gives_up_after_the_attempts(client: Client, satellite: Satellite,
                                               synth: Any,
                                               workers: list[ProtocolWorker]) -> None:
    mute = add(workers, satellite, synth, "w-mute", silent=True)
    t0 = time.monotonic()
    client.say(id="mute1", text=TEXT)
    ev = client.wait_event("mute1", timeout=10)
    assert (ev["event"], ev["code"]) == ("error", "unavailable"), ev
    assert "no herald worker answered" in ev["error"]
    assert [j["attempt"] for j in mute.seen.jobs] == list(range(1, ATTEMPTS + 1))
    assert time.monotonic() - t0 >= ATTEMPTS * CLAIM_TIMEOUT * 0.9  # claim_timeout each


def test_a_worker_dying_mid_job_is_resumed_on_another(
        client: Client, satellite: Satellite, synth: Any,
        workers: list[ProtocolWorker]) -> None:
    """The owner hears nothing from the worker for dead_after, sends the job again from
    the chunks it has in a row, and the audio is whole: no chunk twice, none missing."""
    first = add(workers, satellite, synth, "w-dies", die_after=8, pace=0.05)
    client.say(id="die1", text=TEXT, sinks=["speaker", "mqtt"])
    client.wait(lambda ms: first.seen.states, 10, "the first claim")
    second = add(workers, satellite, synth, "w-takes-over")
    assert client.wait_event("die1")["event"] == "finished"
    assert kinds(client, "die1") == ["queued", "started", "resumed", "finished"]
    resumed = next(e for e in client.events("die1") if e["event"] == "resumed")
    assert resumed == {"event": "resumed", "id": "die1", "worker": "w-takes-over",
                       "lost": "w-dies", "from_chunk": 8}
    [again] = second.seen.jobs
    assert (again["attempt"], again["skip_chunks"]) == (2, 8)
    assert again["options"] == first.seen.jobs[0]["options"]  # the same seed
    assert second.seen.published["die1"][0] == 8
    _, pcm, _ = client.audio("die1")
    want = reference_pcm(synth, TEXT, SynthesisOptions(seed=again["options"]["seed"]))
    assert_pcm_close(pcm, want, "the whole audio from one worker")

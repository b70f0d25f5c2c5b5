"""The fleet worker (``node.role = "worker"``) against a real Mosquitto over MQTT 5, as
separate ``herald run`` processes; the test plays a job's owner with a paho MQTT 5 client,
the way the protocol says an owner does.

Two fleets share the broker: ``herald/fleet`` with two workers (the share group balances
jobs between them) and ``herald/solo`` with one, for what must reach one given worker (a
duplicate delivery, its slots, a cancel, a SIGKILL).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from audio_checks import assert_pcm_close, assert_speech, pcm16, reference_pcm
from conftest import Broker, start_broker
from herald_process import HeraldProcess, mqtt_only_config, start_herald
from paho.mqtt.enums import CallbackAPIVersion

from tts import SynthesisOptions

PAIR = "herald/fleet"
SOLO = "herald/solo"
VOICE = "en_US-joe-medium"
RATE = 22050
SEED = 4242
SLOTS = 2
HEARTBEAT = 0.25
SYNC_DELAY = 0.4  # fleet.sync_delay, as the workers have it (its default)
WAIT = 90.0
SHORT = "The washing machine has finished."
MEDIUM = ("The kitchen timer has finished. Dinner is ready in the dining room, please come "
          "down now.")
LONG = " ".join([
    "This is a long announcement, long enough to still be synthesizing when the test acts.",
    "The weather tomorrow will be sunny with a light breeze from the west and mild "
    "temperatures in the afternoon.",
    "Remember to take the recycling out before seven in the morning, and to water the "
    "plants on the balcony.",
    "The train to the city leaves at a quarter past eight from platform two; it is on time.",
    "The back door has been open for ten minutes, and the heating is on in the living room.",
] * 3)


# --------------------------------------------------------------------------- the owner


@dataclass
class Msg:
    topic: str
    payload: bytes
    at: float  # time.time() when it arrived

    def json(self) -> Any:
        return json.loads(self.payload)


class Owner:
    """A paho MQTT 5 client that sends jobs and records everything under the fleet topics
    and the workers' own events and latency records."""

    def __init__(self, port: int, fleets: tuple[str, ...] = (PAIR, SOLO)) -> None:
        self.msgs: list[Msg] = []
        self.cond = threading.Condition()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        subscribed = threading.Event()
        topics = [f"{f}/{t}" for f in fleets for t in ("nodes/+", "job/+/state", "device/#",
                                                       "group/#")]
        topics += ["herald/+/event", "herald/+/latency"]
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe([(t, 1) for t in topics])
        self.c.on_subscribe = lambda *a: subscribed.set()
        self.c.on_message = self._on_message
        self.c.connect("127.0.0.1", port, keepalive=10, clean_start=True)
        self.c.loop_start()
        assert subscribed.wait(10), "owner could not subscribe"

    def _on_message(self, c: Any, u: Any, m: mqtt.MQTTMessage) -> None:
        with self.cond:
            self.msgs.append(Msg(m.topic, bytes(m.payload), time.time()))
            self.cond.notify_all()

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()

    def publish(self, topic: str, payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.c.publish(topic, data, 1).wait_for_publish(10)

    def send(self, job: dict[str, Any], fleet: str = PAIR) -> dict[str, Any]:
        self.publish(f"{fleet}/jobs", job)
        return job

    def wait(self, pred: Callable[[list[Msg]], Any], what: str, timeout: float = WAIT) -> Any:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not (result := pred(self.msgs)):
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"timed out waiting for {what}; last: "
                                f"{[(m.topic, m.payload[:100]) for m in self.msgs[-6:]]}")
                self.cond.wait(left)
            return result

    def states(self, job: str, fleet: str = PAIR) -> list[dict[str, Any]]:
        with self.cond:
            return [m.json() for m in self.msgs if m.topic == f"{fleet}/job/{job}/state"]

    def wait_state(self, job: str, states: tuple[str, ...] = ("done", "failed"),
                   fleet: str = PAIR, timeout: float = WAIT) -> dict[str, Any]:
        def found(_: list[Msg]) -> Any:
            return next((s for s in self.states(job, fleet) if s["state"] in states), None)
        return self.wait(found, f"{states} of job {job}", timeout)  # type: ignore[no-any-return]

    def audio(self, prefix: str, job: str) -> list[Msg]:
        with self.cond:
            return [m for m in self.msgs if m.topic.startswith(f"{prefix}/{job}/")]

    def wait_audio(self, prefix: str, job: str) -> tuple[dict[str, Any], dict[int, bytes],
                                                          dict[str, Any]]:
        """start, {seq: chunk}, stop of a job's audio (each seq once: asserted)."""
        self.wait(lambda ms: any(m.topic == f"{prefix}/{job}/stop" for m in ms),
                  f"audio stop of {job}")
        mine = self.audio(prefix, job)
        starts = [m.json() for m in mine if m.topic.endswith("/start")]
        stops = [m.json() for m in mine if m.topic.endswith("/stop")]
        assert len(starts) == 1 and len(stops) == 1, (len(starts), len(stops))
        chunks: dict[int, bytes] = {}
        for m in mine:
            if "/chunk/" in m.topic:
                seq = int(m.topic.rsplit("/", 1)[1])
                assert seq not in chunks, f"chunk {seq} of {job} came twice"
                chunks[seq] = m.payload
        return starts[0], chunks, stops[0]

    def events(self, device: str, job: str) -> list[str]:
        with self.cond:
            evs = [m.json() for m in self.msgs if m.topic == f"herald/{device}/event"]
        return [e["event"] for e in evs if e.get("id") == job]


def job(job_id: str, text: str, audio: str, attempt: int = 1, **more: Any) -> dict[str, Any]:
    now = time.time()
    data: dict[str, Any] = {
        "job": job_id, "attempt": attempt, "owner": "tester", "text": text, "format": "text",
        "voice": VOICE, "speaker": None,
        "options": {"length_scale": None, "noise_scale": None, "noise_w": None, "gain": 1.0,
                    "sentence_silence": 0.0, "seed": SEED},
        "audio": audio, "chunk_ms": 100, "skip_chunks": 0, "stream": False, "sync": False,
        "sent": now, "expires": now + 60}
    data.update(more)
    return data


# --------------------------------------------------------------------------- the heralds


@dataclass
class Fleet:
    broker: Broker
    owner: Owner
    workers: dict[str, HeraldProcess]
    start_worker: Callable[[str, str], HeraldProcess]


def worker_config(device: str, port: int, fleet: str) -> str:
    return (mqtt_only_config(device, port, "keepalive = 5")
            + '[voices]\nthreads = 1\nworkers = 1\nkeep_warm = "off"\n'
            + f'[node]\nrole = "worker"\n[fleet]\ntopic = "{fleet}"\nslots = {SLOTS}\n'
            + f"heartbeat = {HEARTBEAT}\n")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet-worker")
    broker = start_broker(tmp / "broker")
    owner = Owner(broker.port)
    started: list[HeraldProcess] = []

    def start_worker(device: str, topic: str) -> HeraldProcess:
        """Start (or start again) a worker; each run logs into a file of its own."""
        d = tmp / device
        d.mkdir(exist_ok=True)
        (d / "herald.toml").write_text(worker_config(device, broker.port, topic))
        runs = len(list(d.glob("herald*.log")))
        h = start_herald(d / "herald.toml", d / f"herald{runs or ''}.log")
        started.append(h)
        return h

    workers = {"w1": start_worker("w1", PAIR), "w2": start_worker("w2", PAIR),
               "w3": start_worker("w3", SOLO)}
    for device, topic in (("w1", PAIR), ("w2", PAIR), ("w3", SOLO)):
        owner.wait(lambda ms, d=device, t=topic: any(
            m.topic == f"{t}/nodes/{d}" and m.json()["state"] == "online" for m in ms),
            f"{device} online", timeout=120)
        workers[device].wait_log("taking jobs from")
    try:
        yield Fleet(broker, owner, workers, start_worker)
    finally:
        owner.close()
        for h in started:
            if h.proc.poll() is None:
                h.terminate()
        broker.stop()


def device_audio(fleet: str, device: str = "sat") -> str:
    return f"{fleet}/device/{device}/audio"


def joined(chunks: dict[int, bytes]) -> bytes:
    return b"".join(chunks[k] for k in sorted(chunks))


# --------------------------------------------------------------------------- tests


def test_presence_says_what_the_worker_offers(fleet: Fleet) -> None:
    with fleet.owner.cond:
        presence = [m.json() for m in fleet.owner.msgs if m.topic == f"{PAIR}/nodes/w1"][-1]
    assert presence["state"] == "online" and presence["role"] == "worker"
    assert presence["slots"] == SLOTS and presence["groups"] == []
    assert {"name": VOICE, "language": "en_US", "rate": RATE, "speakers": 1} in \
        presence["voices"]


def test_a_job_is_claimed_heartbeats_and_its_audio_arrives(fleet: Fleet, synth: Any) -> None:
    owner, prefix = fleet.owner, device_audio(PAIR)
    owner.send(job("basic", MEDIUM, prefix))
    done = owner.wait_state("basic")
    states = owner.states("basic")
    assert done["state"] == "done", done
    worker = states[0]["worker"]
    assert [s["state"] for s in states][0] == "claimed" and worker in ("w1", "w2")
    assert all(s["worker"] == worker and s["attempt"] == 1 for s in states)
    assert "working" in [s["state"] for s in states[1:-1]], states  # heartbeats while held
    start, chunks, stop = owner.wait_audio(prefix, "basic")
    assert start == {"format": "pcm", "rate": RATE, "width": 2, "channels": 1, "job": "basic",
                     "attempt": 1, "worker": worker, "voice": VOICE, "play_at": None,
                     "chunk_samples": 2205}
    assert sorted(chunks) == list(range(len(chunks))), "chunks missing"
    assert all(len(c) == 2205 * 2 for k, c in chunks.items() if k < len(chunks) - 1)
    pcm = joined(chunks)
    assert stop == {"chunks": len(chunks), "samples": len(pcm) // 2, "outcome": "finished",
                    "attempt": 1}
    assert done["chunks"] == len(chunks)
    assert_speech(pcm16(pcm), RATE, min_seconds=3.0, max_seconds=10.0)
    # The seeded audio is the engine's own, sample for sample: the length is right.
    assert_pcm_close(pcm, reference_pcm(synth, MEDIUM, SynthesisOptions(seed=SEED)))
    # An ordinary request on the worker's own topics: events and a latency record.
    owner.wait(lambda ms: "finished" in owner.events(worker, "basic"), "worker's events")
    assert owner.events(worker, "basic")[:2] == ["queued", "started"]
    with owner.cond:
        records = [m.json() for m in owner.msgs if m.topic == f"herald/{worker}/latency"]
    record = next(r for r in records if r["id"] == "basic")
    assert record["front"] == "fleet" and record["sink"] == "fleet"


def test_skip_chunks_resumes_with_the_same_chunks(fleet: Fleet) -> None:
    """A resumed job (another process here: the solo fleet's worker) publishes exactly the
    chunks from ``skip_chunks`` on, the same samples (to within rounding) under the same
    seq."""
    owner = fleet.owner
    full_prefix, part_prefix = device_audio(PAIR, "full"), device_audio(SOLO, "part")
    owner.send(job("whole", MEDIUM, full_prefix))
    _, full, full_stop = owner.wait_audio(full_prefix, "whole")
    k = 7
    owner.send(job("resumed", MEDIUM, part_prefix, attempt=2, skip_chunks=k), SOLO)
    start, part, stop = owner.wait_audio(part_prefix, "resumed")
    assert owner.wait_state("resumed", fleet=SOLO)["state"] == "done"
    assert start["attempt"] == 2 and start["worker"] == "w3"
    assert sorted(part) == list(range(k, len(full)))
    for seq in part:  # the same synthesis again, as its window sizes round it
        assert_pcm_close(part[seq], full[seq], f"chunk {seq} of the whole run")
    assert (stop["chunks"], stop["samples"]) == (full_stop["chunks"], full_stop["samples"])
    # Published after the start: nothing of the skipped chunks went out first.
    topics = [m.topic.removeprefix(f"{part_prefix}/resumed/") for m in
              owner.audio(part_prefix, "resumed")]
    assert topics[0] == "start" and topics[1] == f"chunk/{k}" and topics[-1] == "stop"


def test_a_group_job_says_when_to_play(fleet: Fleet) -> None:
    """``sync``: ``start`` carries ``play_at``, ``fleet.sync_delay`` (0.4 s) after it went
    out with the first chunk, so every member of the group starts at that moment.

    When the start went out is pinned between two moments on the test's own clock, however
    long the broker and the worker take: the job's text is streamed and sent only once the
    job is claimed, so no audio can go out before the text did; and the start went out
    before it arrived."""
    owner, prefix = fleet.owner, f"{SOLO}/group/downstairs/audio"
    owner.send(job("together", "", prefix, sync=True, stream=True), SOLO)
    owner.wait_state("together", ("claimed",), SOLO)
    text_sent = time.time()
    owner.publish(f"{SOLO}/job/together/text", {"offset": 0, "text": SHORT, "end": True})
    start, chunks, stop = owner.wait_audio(prefix, "together")
    received = next(m.at for m in owner.audio(prefix, "together") if m.topic.endswith("/start"))
    assert start["play_at"] is not None
    went_out = start["play_at"] - SYNC_DELAY
    assert text_sent < went_out < received, (went_out - text_sent, received - went_out)
    assert stop["outcome"] == "finished" and sorted(chunks) == list(range(stop["chunks"]))


def test_a_duplicate_delivery_is_ignored(fleet: Fleet) -> None:
    owner, prefix = fleet.owner, device_audio(SOLO)
    copy = job("twice", SHORT, prefix)
    owner.send(copy, SOLO)
    owner.send(copy, SOLO)  # while the worker holds the job
    owner.wait_state("twice", fleet=SOLO)
    owner.send(copy, SOLO)  # and once it is done
    time.sleep(1.0)  # a second claim or refusal would come meanwhile
    assert [s["state"] for s in owner.states("twice", SOLO)
            if s["state"] != "working"] == ["claimed", "done"]
    start, chunks, _ = owner.wait_audio(prefix, "twice")  # one start, each chunk once
    assert sorted(chunks) == list(range(len(chunks)))


def test_an_expired_job_is_refused(fleet: Fleet) -> None:
    owner = fleet.owner
    owner.send(job("stale", SHORT, device_audio(SOLO), expires=time.time() - 5), SOLO)
    state = owner.wait_state("stale", fleet=SOLO)
    assert state["state"] == "failed" and state["code"] == "too-old", state
    assert "expired" in state["error"]
    assert [s["state"] for s in owner.states("stale", SOLO)] == ["failed"]
    assert owner.audio(device_audio(SOLO), "stale") == []


def test_an_unknown_voice_fails(fleet: Fleet) -> None:
    owner = fleet.owner
    owner.send(job("nobody", SHORT, device_audio(SOLO), voice="xx_XX-nobody-low"), SOLO)
    state = owner.wait_state("nobody", fleet=SOLO)
    assert state["state"] == "failed" and state["code"] == "unknown-voice", state
    assert "xx_XX-nobody-low" in state["error"]
    assert owner.audio(device_audio(SOLO), "nobody") == []


def test_malformed_jobs_are_dropped_and_the_worker_serves_on(fleet: Fleet) -> None:
    owner = fleet.owner
    for junk in ("not json", json.dumps({"job": "a/b", "attempt": 1}),
                 json.dumps(job("junk", SHORT, device_audio(SOLO), attempt="1"))):
        owner.publish(f"{SOLO}/jobs", junk)
    owner.send(job("outside", SHORT, "herald/solo/jobs"), SOLO)  # audio outside the fleet
    refused = owner.wait_state("outside", fleet=SOLO)
    assert refused["state"] == "failed" and refused["code"] == "bad-request", refused
    owner.send(job("after-junk", SHORT, device_audio(SOLO)), SOLO)
    assert owner.wait_state("after-junk", fleet=SOLO)["state"] == "done"
    assert owner.states("junk", SOLO) == []
    assert "dropped a message on herald/solo/jobs" in fleet.workers["w3"].output()


def test_cancel_stops_the_job(fleet: Fleet) -> None:
    owner, prefix = fleet.owner, device_audio(SOLO)
    owner.send(job("cut", LONG, prefix), SOLO)
    owner.wait(lambda ms: any(m.topic.startswith(f"{prefix}/cut/chunk/") for m in ms),
               "first chunk")
    owner.publish(f"{SOLO}/job/cut/cancel", {"attempt": 1})
    _, chunks, stop = owner.wait_audio(prefix, "cut")
    assert stop["outcome"] == "stopped", stop
    assert len(chunks) * 0.1 < 60, "the whole text was sent"  # LONG is over 90 s
    assert stop["chunks"] == max(chunks) + 1
    owner.wait(lambda ms: "stopped" in owner.events("w3", "cut"), "worker's stopped event")
    time.sleep(4 * HEARTBEAT)  # heartbeats that went on would come meanwhile
    states = [s["state"] for s in owner.states("cut", SOLO)]
    assert "done" not in states and "failed" not in states, states
    # The worker's messages come in the order it sent them (one connection, QoS 1): the
    # stop is the last of the job's, with no heartbeat after it.
    with owner.cond:
        order = [m.topic.removeprefix(f"{SOLO}/job/cut/").removeprefix(f"{prefix}/cut/")
                 for m in owner.msgs
                 if m.topic == f"{SOLO}/job/cut/state" or m.topic.startswith(f"{prefix}/cut/")]
    assert order[-1] == "stop", f"after the stop: {order[order.index('stop') + 1:]}"


def test_a_streamed_text_job(fleet: Fleet, synth: Any) -> None:
    """The text comes on the job's text topic after the claim; pieces sent twice or
    overlapping add only what is new."""
    owner, prefix = fleet.owner, device_audio(SOLO)
    first, second = "The kitchen timer has finished. ", "Dinner is ready in the dining room."
    owner.send(job("typed", first, prefix, stream=True), SOLO)
    claim = owner.wait_state("typed", ("claimed",), SOLO)
    assert claim["text_offset"] == len(first)
    text = f"{SOLO}/job/typed/text"
    owner.publish(text, {"offset": 0, "text": first})  # again: nothing new
    owner.publish(text, {"offset": len(first), "text": second[:10]})
    owner.publish(text, {"offset": len(first) + 5, "text": second[5:], "end": False})
    owner.publish(text, {"offset": len(first) + len(second), "text": "", "end": True})
    assert owner.wait_state("typed", fleet=SOLO)["state"] == "done"
    _, chunks, stop = owner.wait_audio(prefix, "typed")
    want = reference_pcm(synth, [first.strip(), second], SynthesisOptions(seed=SEED))
    assert_pcm_close(joined(chunks), want, "the two sentences' reference")


def test_over_slots_the_worker_answers_busy(fleet: Fleet) -> None:
    owner, prefix = fleet.owner, device_audio(SOLO)
    ids = [f"full{i}" for i in range(SLOTS + 1)]
    for i in ids:
        owner.send(job(i, LONG, prefix), SOLO)
    answers = {i: owner.wait_state(i, ("claimed", "busy"), SOLO)["state"] for i in ids}
    assert sorted(answers.values()) == ["busy"] + ["claimed"] * SLOTS, answers
    for i in ids:
        owner.publish(f"{SOLO}/job/{i}/cancel", {"attempt": None})
    for i in ids:
        if answers[i] == "claimed":
            owner.wait(lambda ms, i=i: any(m.topic == f"{prefix}/{i}/stop" for m in ms),
                       f"stop of {i}")


def test_jobs_from_four_owners_spread_over_both_workers(fleet: Fleet) -> None:
    """Four owners at once, each sending its jobs; a ``busy`` is sent again (attempt + 1)
    after a short backoff, as the protocol says: the share group balances them."""
    owners = [Owner(fleet.broker.port, (PAIR,)) for _ in range(4)]
    try:
        ids = [f"o{n}-{k}" for n in range(4) for k in range(2)]
        threads = []
        results: dict[str, dict[str, Any]] = {}

        def run(owner: Owner, job_id: str) -> None:
            attempt = 1
            while True:
                owner.send(job(job_id, SHORT, device_audio(PAIR, "spread"), attempt=attempt))
                answer = owner.wait(lambda ms, a=attempt: next(
                    (s for s in owner.states(job_id) if s["attempt"] == a
                     and s["state"] in ("claimed", "busy")), None), f"answer to {job_id}")
                if answer["state"] == "claimed":
                    results[job_id] = answer
                    owner.wait_state(job_id)
                    return
                attempt += 1
                assert attempt < 20, f"{job_id} never found a free worker"
                time.sleep(0.3)

        for n, o in enumerate(owners):
            for k in range(2):
                t = threading.Thread(target=run, args=(o, f"o{n}-{k}"))
                t.start()
                threads.append(t)
        for t in threads:
            t.join(WAIT)
        assert set(results) == set(ids)
        workers = [results[i]["worker"] for i in ids]
        assert set(workers) == {"w1", "w2"}, workers
    finally:
        for o in owners:
            o.close()


def test_a_stopped_worker_hands_its_job_back_and_leaves_the_share_group(fleet: Fleet
                                                                        ) -> None:
    """SIGTERM mid-job: the job is answered ``failed``/``unavailable`` (its owner sends it to
    another worker at once), the audio stops, the presence says offline. While the worker is
    gone a job sent to its share group is not kept for it: its session ended with it."""
    owner, prefix = fleet.owner, device_audio(SOLO)
    owner.send(job("handed-back", LONG, prefix), SOLO)
    owner.wait_state("handed-back", ("working",), SOLO)
    left = time.time()
    assert fleet.workers["w3"].terminate() == 0
    state = owner.wait_state("handed-back", fleet=SOLO)
    assert state["state"] == "failed" and state["code"] == "unavailable", state
    _, _, stop = owner.wait_audio(prefix, "handed-back")
    assert stop["outcome"] == "stopped"
    owner.wait(lambda ms: any(m.topic == f"{SOLO}/nodes/w3" and m.at >= left and
                              m.json()["state"] == "offline" for m in ms), "offline")
    owner.send(job("while-away", SHORT, prefix), SOLO)
    time.sleep(0.5)
    fleet.workers["w3"] = again = fleet.start_worker("w3", SOLO)
    again.wait_log("taking jobs from")
    owner.wait(lambda ms: any(m.topic == f"{SOLO}/nodes/w3" and m.at >= left and
                              m.json()["state"] == "online" for m in ms), "online again")
    owner.send(job("after-return", SHORT, prefix), SOLO)
    assert owner.wait_state("after-return", fleet=SOLO)["state"] == "done"
    assert owner.states("while-away", SOLO) == []


def test_a_killed_worker_stops_its_heartbeats(fleet: Fleet) -> None:
    """SIGKILL mid-job: its ``working`` states stop, and the broker says it is offline (its
    last will); what the job's owner then does is the pool's."""
    owner, prefix, solo = fleet.owner, device_audio(SOLO), fleet.workers["w3"]
    owner.send(job("orphan", LONG, prefix), SOLO)
    owner.wait(lambda ms: [s["state"] for s in owner.states("orphan", SOLO)].count(
        "working") >= 2, "heartbeats")
    with owner.cond:
        before_kill = len(owner.msgs)  # (an earlier test's offline is before this)
    solo.proc.kill()
    solo.proc.wait(10)

    def last_will(ms: list[Msg]) -> int | None:
        """Where the broker's ``offline`` for the killed worker is among the messages."""
        return next((i for i in range(before_kill, len(ms)) if ms[i].topic ==
                     f"{SOLO}/nodes/w3" and ms[i].json()["state"] == "offline"), None)

    owner.wait(last_will, "the killed worker's last will", timeout=20)
    time.sleep(6 * HEARTBEAT)  # heartbeats that went on would come meanwhile
    # The broker sends the will once it has read all the worker wrote: any of its
    # heartbeats came before it, and none may come after.
    with owner.cond:
        will = last_will(owner.msgs)
        assert will is not None
        after = [m for m in owner.msgs[will + 1:] if m.topic == f"{SOLO}/job/orphan/state"]
    assert after == [], [m.json() for m in after]
    assert not any(m.topic == f"{prefix}/orphan/stop" for m in owner.msgs)

"""A home of heralds on one MQTT 5 broker: two model nodes (``plain``, a herald as today that
also takes the fleet's jobs, ``node.role = "all"``; ``w2``, a worker) and three satellites
without a model (``sat1``..``sat3``, members of the group ``downstairs``), each a separate
``herald run`` on a real Mosquitto, every speaker on ALSA's file plugin.

* a satellite serves ``say``, ``stop`` and ``say/stream`` through the fleet with the events
  a plain herald gives the same requests;
* a group announcement is played by every member, exactly once, sample for sample;
* a worker killed (SIGKILL) mid-announcement: the job finishes on the other, every member
  plays it once, with no chunk twice and none missing, and ``resumed`` says what happened.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from audio_checks import PCM_TOLERANCE, as_samples, assert_speech, pcm16, reference_pcm
from conftest import AlsaFile, Broker, alsa_file_env, start_broker
from herald_process import HeraldProcess, herald_env, start_herald
from mqtt_client import Client, Msg
from speaker_driver import Pacer

from bench.net import alsa_env
from tts import SynthesisOptions

# Five heralds share the cores, a job is claimed within a second, a member missing heartbeats
# for 1.5 s is dead and a group's members start within TOGETHER_MS: a busy neighbour would
# make claims and deaths of slowness, and move the start times.
pytestmark = pytest.mark.alone

FLEET = "herald/fleet"
GROUP = "downstairs"
SATELLITES = ("sat1", "sat2", "sat3")
RATE = 22050
TOGETHER_MS = 30  # the members of a group start an announcement at most this far apart
TEXT = "The front door is open. Somebody should close it before the cat gets out."
LONG = ("This is a long announcement for the whole ground floor. The weather tomorrow will "
        "be sunny with a light breeze from the west. Remember to take the recycling out "
        "before seven in the morning, and to water the plants on the balcony. The train to "
        "the city leaves at a quarter past eight from platform two.")


@dataclass
class Node:
    device: str
    proc: HeraldProcess
    alsa: AlsaFile | None = None  # the plain herald's speaker: a file, taken at any speed
    sound_card: Pacer | None = None  # a satellite's: played in real time, like a card

    def heard(self) -> bytes:
        """Everything its speaker has played so far."""
        if self.sound_card is not None:
            return Path(self.sound_card.out.name).read_bytes()
        return self.alsa.pcm() if self.alsa is not None else b""


@dataclass
class Home:
    broker: Broker
    nodes: dict[str, Node]
    client: Client

    def base(self, device: str) -> str:
        return f"herald/{device}"


def config(device: str, port: int, role: str, groups: tuple[str, ...] = ()) -> str:
    """A node of the home; a plain herald (``all``) joins the fleet with fleet.enabled."""
    return (f'device_id = "{device}"\n[node]\nrole = "{role}"\n'
            f'[mqtt]\nhost = "127.0.0.1"\nport = {port}\nkeepalive = 5\n'
            '[voices]\nkeep_warm = "off"\n[wyoming]\nenabled = false\n'
            '[http]\nenabled = false\n'
            f"[fleet]\nenabled = true\nclaim_timeout = 1.0\ndead_after = 1.5\n"
            f"heartbeat = 0.25\ngroups = {json.dumps(list(groups))}\n")


def start(tmp: Path, device: str, port: int, role: str, groups: tuple[str, ...] = (),
          speaker: str | None = "file") -> Node:
    """``speaker``: "file" (ALSA's file plugin, as fast as it is written), "paced" (a FIFO
    read in real time, whose reads say when each byte was played), or None (no speaker)."""
    d = tmp / device
    d.mkdir()
    (d / "herald.toml").write_text(config(device, port, role, groups)
                                   + ("" if speaker else "[speaker]\nenabled = false\n"))
    alsa = card = None
    env = herald_env()
    if speaker == "file":
        alsa = alsa_file_env(d / "alsa")
        env = herald_env(base=alsa.env)
    elif speaker == "paced":
        fifo = d / "device.fifo"
        os.mkfifo(fifo)
        # Reading before herald's PortAudio opens the device (it would block on the FIFO).
        card = Pacer(str(fifo), str(d / "heard.raw"), RATE * 2, stamp=True)
        env = herald_env(base=alsa_env(d, fifo))
    return Node(device, start_herald(d / "herald.toml", d / "herald.log", env), alsa, card)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    tmp = tmp_path_factory.mktemp("fleet-home")
    broker = start_broker(tmp / "broker")
    client = Client(broker.port, topics=("herald/#", "homeassistant/#"))
    nodes = {"plain": start(tmp, "plain", broker.port, "all"),
             "w2": start(tmp, "w2", broker.port, "worker", speaker=None)}
    nodes |= {s: start(tmp, s, broker.port, "satellite", (GROUP,), "paced")
              for s in SATELLITES}
    try:
        for device in nodes:
            client.wait(lambda ms, d=device: any(
                m.topic == f"herald/{d}/availability" and m.payload == b"online" for m in ms),
                120, f"{device} online")
        for worker in ("plain", "w2"):
            client.wait(lambda ms, w=worker: any(
                m.topic == f"{FLEET}/nodes/{w}" and m.json()["state"] == "online"
                and m.json()["voices"] for m in ms), 60, f"{worker} taking jobs")
        yield Home(broker, nodes, client)
    finally:
        client.close()
        for node in nodes.values():
            node.proc.kill()
            if node.sound_card is not None:
                node.sound_card.stop()
        broker.stop()
        for node in nodes.values():
            print(f"--- {node.device}\n{node.proc.output()[-3000:]}")


# --------------------------------------------------------------------------- helpers


def events(home: Home, device: str, rid: str) -> list[dict[str, Any]]:
    with home.client.cond:
        msgs = [m.json() for m in home.client.msgs if m.topic == f"herald/{device}/event"]
    return [e for e in msgs if e.get("id") == rid]


def group_events(home: Home, rid: str) -> list[dict[str, Any]]:
    with home.client.cond:
        msgs = [m.json() for m in home.client.msgs if m.topic == f"{FLEET}/group/{GROUP}/event"]
    return [e for e in msgs if e.get("id") == rid]


def wait_end(home: Home, device: str, rid: str, timeout: float = 90) -> dict[str, Any]:
    def ended(_: list[Msg]) -> Any:
        return next((e for e in events(home, device, rid)
                     if e["event"] in ("finished", "stopped", "error")), None)
    return home.client.wait(ended, timeout, f"the end of {rid} on {device}")  # type: ignore[no-any-return]


def wait_group_end(home: Home, rid: str, timeout: float = 90) -> dict[str, Any]:
    def ended(_: list[Msg]) -> Any:
        return next((e for e in group_events(home, rid)
                     if e["event"] in ("finished", "stopped", "error")), None)
    return home.client.wait(ended, timeout, f"the end of {rid} on the group")  # type: ignore[no-any-return]


def say(home: Home, device: str, **fields: Any) -> None:
    home.client.publish(f"herald/{device}/say", json.dumps(fields))


def kinds(evs: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in evs]


SILENCE_RUN = 32  # samples: a run of zeros this long may be silence the speaker put in


def sound(x: np.ndarray) -> list[np.ndarray]:
    """``x`` cut at its runs of silence (zeros, at least SILENCE_RUN long), each piece
    without the zeros at its ends. ALSA's null device takes audio as fast as it comes, so
    the speaker plays silence wherever the audio came later than that (an underrun), and a
    resumed job's audio comes after fleet.dead_after without any."""
    zero = np.concatenate([[True], x == 0, [True]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))  # starts and ends of sound
    pieces, start = [], None
    for a, b in zip(edges[::2], edges[1::2]):  # a run of sound x[a:b]
        if start is None:
            start = a
        nxt = edges[np.searchsorted(edges, b, side="right")] if b < edges[-1] else None
        if nxt is None or nxt - b >= SILENCE_RUN:
            pieces.append(x[start:b])
            start = None
    return pieces


def heard_from_now(home: Home, devices: Iterable[str], settle: float = 0.3,
                   timeout: float = 10) -> dict[str, int]:
    """How much each device has heard, once what it heard in the last ``settle`` seconds
    is silence: the end of an earlier request (in the device's buffers after its
    ``finished``) is not counted as the next one's."""
    def samples(d: str) -> np.ndarray:
        pcm = home.nodes[d].heard()
        return as_samples(pcm[:len(pcm) - len(pcm) % 2])

    since = {d: len(samples(d)) for d in devices}
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(settle)
        now = {d: samples(d) for d in since}
        if all(np.abs(now[d][since[d]:]).max(initial=0) <= PCM_TOLERANCE for d in since):
            return {d: 2 * len(now[d]) for d in since}
        assert time.monotonic() < deadline, "the devices are still playing something"
        since = {d: len(now[d]) for d in since}


def played_once(out: bytes, want: bytes, what: str) -> None:
    """The sound in ``out`` is ``want``, sample for sample, once and in order: no part of it
    twice, none missing, nothing else. Between the pieces the speaker played, only silence
    it inserted, or quiet stretches of ``want`` that it happened to replace.

    A piece quiet all through (within ``PCM_TOLERANCE`` of silence) is inaudible and fits
    any quiet stretch: it is not placed. Placed greedily at the first quiet stretch it
    fits, a few such pieces would move the cursor past where the next sound truly starts."""
    w = as_samples(want)
    quiet = np.abs(w) <= PCM_TOLERANCE
    cursor = 0
    pieces = [p for p in sound(as_samples(out)) if np.abs(p).max() > PCM_TOLERANCE]
    assert pieces, f"{what}: nothing played"
    for n, piece in enumerate(pieces):
        loud = np.flatnonzero(~quiet[cursor:])
        last = cursor + (int(loud[0]) if len(loud) else len(w) - cursor)
        at = next((p for p in range(cursor, min(last, len(w) - len(piece)) + 1)
                   if np.abs(w[p:p + len(piece)] - piece).max() <= PCM_TOLERANCE), None)
        assert at is not None, (f"{what}: piece {n} of what was played ({len(piece)} "
                                f"samples) is not what comes next in the announcement "
                                f"(at sample {cursor} of {len(w)}): repeated, or out of order")
        cursor = at + len(piece)
    assert quiet[cursor:].all(), (f"{what}: the announcement's sound from sample {cursor} of "
                                  f"{len(w)} was never played")


# --------------------------------------------------------------------------- one satellite


def test_the_satellites_run_without_a_model(home: Home) -> None:
    for s in SATELLITES:
        pid = home.nodes[s].proc.proc.pid
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "libtorch" not in maps, f"{s} loaded torch"
    plain = Path(f"/proc/{home.nodes['plain'].proc.proc.pid}/maps").read_text()
    assert "libtorch" in plain  # (the check can see torch where it is)


def test_a_satellite_answers_like_a_plain_herald(home: Home) -> None:
    """The same say, stop and say/stream to a satellite and to a plain herald: the same
    events, and the satellite's audio is speech."""
    sequences: dict[str, list[list[str]]] = {}
    for device in ("plain", "sat1"):
        say(home, device, id=f"{device}-say", text=TEXT)
        wait_end(home, device, f"{device}-say")
        say(home, device, id=f"{device}-stop", text=LONG)
        home.client.wait(lambda ms, d=device: "started" in kinds(events(home, d, f"{d}-stop")),
                         60, "started")
        time.sleep(0.5)
        home.client.publish(f"herald/{device}/stop", json.dumps({"id": f"{device}-stop"}))
        wait_end(home, device, f"{device}-stop")
        for seq, piece in enumerate(["Dinner is ready. ", "Please come to ", "the table."]):
            home.client.publish(f"herald/{device}/say/stream", json.dumps(
                {"id": f"{device}-stream", "seq": seq, "text": piece, "final": seq == 2}))
            time.sleep(0.2)
        wait_end(home, device, f"{device}-stream")
        sequences[device] = [kinds(events(home, device, f"{device}-{what}"))
                             for what in ("say", "stop", "stream")]
    assert sequences["sat1"] == sequences["plain"] == [
        ["queued", "started", "finished"], ["queued", "started", "stopped"],
        ["queued", "started", "finished"]]
    with home.client.cond:
        records = {m.json()["id"]: m.json() for m in home.client.msgs
                   if m.topic == "herald/sat1/latency"}
    assert records["sat1-say"]["outcome"] == "ok" and records["sat1-say"]["audio_ms"] > 2000
    assert records["sat1-stop"]["outcome"] == "stopped"
    heard = np.concatenate(sound(as_samples(home.nodes["sat1"].heard()))).astype(np.float32)
    heard /= 32767
    assert_speech(heard, RATE, min_seconds=4.0)


# --------------------------------------------------------------------------- groups


def test_a_group_announcement_is_played_by_every_member_once(home: Home, synth: Any) -> None:
    before = heard_from_now(home, SATELLITES)
    home.client.publish(f"{FLEET}/group/{GROUP}/say",
                        json.dumps({"id": "g1", "text": TEXT, "seed": 11}))
    assert wait_group_end(home, "g1")["event"] == "finished"
    assert kinds(group_events(home, "g1")) == ["queued", "started", "finished"]
    want = reference_pcm(synth, TEXT, SynthesisOptions(seed=11))
    for s in SATELLITES:
        assert wait_end(home, s, "g1")["event"] == "finished"
        assert kinds(events(home, s, "g1")) == ["queued", "started", "finished"]
        out = home.nodes[s].heard()[before[s]:]
        played_once(out, want, s)
        assert_speech(pcm16(want), RATE, min_seconds=3.0)
    with home.client.cond:
        records = {m.topic.split("/")[1]: m.json() for m in home.client.msgs
                   if m.topic.endswith("/latency") and m.json()["id"] == "g1"}
    for s in SATELLITES:  # each member's own record, as for any request it plays
        assert (records[s]["front"], records[s]["sink"], records[s]["outcome"]) == (
            "fleet", "speaker", "ok")
    # Every member started at the agreed time, by its own clock's account.
    skews = [records[s]["start_skew_ms"] for s in SATELLITES]
    assert None not in skews, records
    assert max(skews) - min(skews) <= TOGETHER_MS, skews


def test_the_group_takes_plain_text_from_home_assistant(home: Home) -> None:
    """Every member publishes the same notify entity for the group; its command is plain
    text on the group's say (HA's notify sends the message as the payload)."""
    topic = f"homeassistant/device/herald_group_{GROUP}/config"
    members = {f"{FLEET}/nodes/{s}" for s in SATELLITES}

    def latest(ms: list[Msg]) -> Any:
        last = next((m.json() for m in reversed(ms) if m.topic == topic and m.payload), None)
        return last if last and {a["topic"] for a in last["availability"]} == members else None
    final = home.client.wait(latest, 10, "the group's discovery naming every member")
    assert final["cmps"]["say"]["p"] == "notify"
    assert final["cmps"]["say"]["command_topic"] == f"{FLEET}/group/{GROUP}/say"
    assert final["availability_mode"] == "any"
    with home.client.cond:  # every member published it, the same bytes, once settled
        same = [m for m in home.client.msgs if m.topic == topic and m.json() == final]
    assert len({m.payload for m in same}) == 1 and len(same) >= len(SATELLITES)
    for s in SATELLITES:  # each satellite's own voice select lists what the workers offer
        device = next(m.json() for m in reversed(home.client.msgs)
                      if m.topic == f"homeassistant/device/{s}/config")
        assert device["cmps"]["voice"]["options"] == ["en_US-joe-medium"]
    home.client.publish(f"{FLEET}/group/{GROUP}/say", "Plain text works here too.")
    rid = home.client.wait(lambda ms: next((m.json()["id"] for m in ms
                                            if m.topic == f"{FLEET}/group/{GROUP}/event"
                                            and m.json()["event"] == "queued"
                                            and m.json()["id"] != "g1"), None), 10, "queued")
    assert wait_group_end(home, rid)["event"] == "finished"
    for s in SATELLITES:
        assert wait_end(home, s, rid)["event"] == "finished"


def test_a_group_stream_is_spoken_once_whoever_gets_its_pieces(home: Home) -> None:
    """The share group deals a stream's pieces out to any member: the one that got piece 0
    speaks it, and the others relay it the pieces they got."""
    pieces = ["Attention please. ", "The shop closes ", "in ten minutes, ", "thank you."]
    for seq, text in enumerate(pieces):
        home.client.publish(f"{FLEET}/group/{GROUP}/say/stream", json.dumps(
            {"id": "gs1", "seq": seq, "text": text, "final": seq == len(pieces) - 1}))
        time.sleep(0.1)
    assert wait_group_end(home, "gs1")["event"] == "finished"
    assert kinds(group_events(home, "gs1")) == ["queued", "started", "finished"]
    for s in SATELLITES:
        assert wait_end(home, s, "gs1")["event"] == "finished"
        assert kinds(events(home, s, "gs1")) == ["queued", "started", "finished"]
    with home.client.cond:
        relayed = [m for m in home.client.msgs
                   if m.topic == f"{FLEET}/group/{GROUP}/stream/gs1"]
    assert relayed, "every piece reached the owner itself: the relay was not exercised"


def test_a_group_stop_stops_every_member(home: Home) -> None:
    home.client.publish(f"{FLEET}/group/{GROUP}/say", json.dumps({"id": "gstop", "text": LONG}))
    for s in SATELLITES:
        home.client.wait(lambda ms, d=s: "started" in kinds(events(home, d, "gstop")), 60,
                         f"{s} started")
    home.client.publish(f"{FLEET}/group/{GROUP}/stop", "PRESS")
    for s in SATELLITES:
        assert wait_end(home, s, "gstop", 10)["event"] == "stopped"
    assert wait_group_end(home, "gstop", 10)["event"] == "stopped"
    home.client.wait(lambda ms: any(m.topic == f"{FLEET}/job/gstop/cancel" for m in ms), 5,
                     "the owner's cancel")


def test_retained_group_commands_are_refused(home: Home) -> None:
    stop = f"{FLEET}/group/{GROUP}/stop"
    home.client.publish(stop, "PRESS", retain=True)
    try:
        home.client.wait(lambda ms: any(
            m.topic == f"{FLEET}/group/{GROUP}/event" and "retained command refused"
            in m.json().get("error", "") for m in ms), 10, "the refusal")
    finally:
        home.client.publish(stop, b"", retain=True)  # clear it


# --------------------------------------------------------------------------- a worker dies


def test_a_worker_killed_mid_announcement_is_resumed_on_the_other(home: Home,
                                                                 synth: Any) -> None:
    before = heard_from_now(home, SATELLITES)
    home.client.publish(f"{FLEET}/group/{GROUP}/say",
                        json.dumps({"id": "kill1", "text": LONG, "seed": 23}))
    audio = f"{FLEET}/group/{GROUP}/audio/kill1"
    start = home.client.wait(lambda ms: next((m.json() for m in ms
                                              if m.topic == f"{audio}/start"), None),
                             60, "the announcement's start")
    home.client.wait(lambda ms: sum(m.topic.startswith(f"{audio}/chunk/") for m in ms) >= 10,
                     60, "ten chunks")
    victim = start["worker"]
    home.nodes[victim].proc.kill()  # SIGKILL
    other = "w2" if victim == "plain" else "plain"
    assert wait_group_end(home, "kill1", 120)["event"] == "finished"
    [resumed] = [e for e in group_events(home, "kill1") if e["event"] == "resumed"]
    assert (resumed["lost"], resumed["worker"]) == (victim, other)
    assert resumed["from_chunk"] >= 10
    want = reference_pcm(synth, LONG, SynthesisOptions(seed=23))
    for s in SATELLITES:
        assert wait_end(home, s, "kill1", 120)["event"] == "finished"
        played_once(home.nodes[s].heard()[before[s]:], want, s)

"""Starting an utterance at an agreed wall-clock time (several speakers, one announcement),
through the real path: SpeakerSink -> sounddevice -> PortAudio -> ALSA's file plugin.

The device is the paced one of tests/test_speaker.py: the file plugin writes into a FIFO that
the driver's pacer reads in real time, like a sound card, and here it notes the wall-clock
time of every read, so the tests know when the device played each sample. That device has
latency PortAudio doesn't see (the buffer of silence PortAudio starts a stream with, the file
plugin's own buffer, the FIFO): everything it plays comes that much later than PortAudio's
DAC times say, the same for every stream start. So "heard at the start time" means here:
heard that long after it, as an utterance started at once is heard that long after the DAC
time the sink reported for it. On a sound card that reports its delay, that is zero.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from audio_checks import as_samples, assert_pcm_close, assert_speech, reference_pcm
from conftest import ROOT
from fresh_python import run_python
from test_speaker import (
    DRIVER,
    LONG,
    RATE,
    SHORT,
    align,
    heard_at,
    locate,
    paced_device,
    run_driver,
)

from tts import SynthesisOptions

TOGETHER = 0.03  # seconds: two speakers playing one announcement start at most this apart
# How far two stream starts' unreported latencies on the paced device may differ: the
# pacer's reads are 512 bytes (12 ms) apart, and its thread wakes a few ms late at times.
SAME_DEVICE = 0.02

# Starts to 10 ms: measured with no other test running beside (tests/parallel.py).
# Start times are the rule here: the tests compare when the device heard audio with when it
# was due, in milliseconds, on a device that plays in real time.
pytestmark = [pytest.mark.alone, pytest.mark.timed]


@pytest.fixture(scope="module")
def speech(synth, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("speech") / "short.raw"
    path.write_bytes(reference_pcm(synth, SHORT, SynthesisOptions(seed=3)))
    return path


def plays_heard(results: list[dict[str, Any]], device: bytes, x: np.ndarray
                ) -> list[dict[str, Any]]:
    """Each play's output (the device's, between the pacer's count before it and before the
    next) and when its first sample was heard (None: nothing of it was)."""
    *plays, tail = results
    bounds = [r["consumed_before"] for r in plays] + [tail["consumed_total"]]
    for i, r in enumerate(plays):
        out = as_samples(device[bounds[i]:bounds[i + 1]])
        r.update(output=out, start=None, heard=None)
        if out.any():
            r["start"] = start = align(out, x)
            r["heard"] = heard_at(tail["stamps"], bounds[i] + 2 * start)
    return plays


def assert_whole(r: dict[str, Any], x: np.ndarray) -> None:
    """The play went well and the device played all of the utterance, as it was."""
    assert r["error"] is None, r
    assert r["stats"]["samples"] == len(x) and r["stats"]["underruns"] == 0, r["stats"]
    assert not r["stats"]["cut"], r["stats"]
    got = r["output"][r["start"]:r["start"] + len(x)]
    assert np.array_equal(got, x), "the device did not play the utterance as it was"
    assert_speech(got / 32767.0, RATE, min_seconds=1.0)


def test_an_utterance_starts_at_its_time_or_says_how_late_it_is(  # type: ignore[no-untyped-def]
        speech, tmp_path: Path) -> None:
    """Plays on one paced device: one asked to start 0.3 s ago (it starts at once and says
    it is 0.3 s late, and more by what the device took to start), one asked to start 0.5 s
    from now (held until then, heard then, skew near zero), one with no start time (as
    before: no skew), and one cut while it waits for its time (it ends then, unheard)."""
    dev = paced_device(tmp_path, RATE)
    results = run_driver(dev.spec(stamp=True, start_rate=RATE, plays=[
        {"pcm": str(speech), "rate": RATE, "start_in": -0.3},
        {"pcm": str(speech), "rate": RATE, "start_in": 0.5},
        {"pcm": str(speech), "rate": RATE},
        {"pcm": str(speech), "rate": RATE, "start_in": 2.0, "cut_after_chunk": 0},
    ]), dev.env, tmp_path)
    x = as_samples(speech.read_bytes())
    late, timed, plain, cut = plays_heard(results, dev.out.read_bytes(), x)
    for r in (late, timed, plain):
        assert_whole(r, x)

    # Past: started at once (as soon after the call as one with no start time), and said
    # so. Its first sample was heard the device's unreported latency after the DAC time the
    # sink reported for it (start_at + skew).
    assert late["stats"]["skew"] >= 0.3, late["stats"]
    unreported = late["heard"] - (late["start_at"] + late["stats"]["skew"])
    assert 0 <= unreported < 0.3, unreported  # a buffer, a period, the FIFO
    at_once = plain["heard"] - plain["called_at"]
    assert late["heard"] - late["called_at"] < at_once + 0.1, (late["heard"], at_once)

    # In the future: the sink says it started on time, and the device heard it on time, give
    # or take the latency it doesn't report, which is the same as when started at once.
    skew = timed["stats"]["skew"]
    assert abs(skew) < 0.01, skew
    assert timed["heard"] >= timed["start_at"], "heard before its start time"
    assert timed["heard"] - timed["start_at"] == pytest.approx(unreported, abs=SAME_DEVICE)
    # Held, not played: the audio came in well before its time (the loop kept moving it),
    # and the device wasn't started at once to play half a second of silence.
    assert timed["sent_at_first_audio"] == timed["chunks"], "the source was held up"
    assert timed["start"] < 0.45 * RATE, f"{timed['start'] / RATE:.2f} s of silence first"

    assert plain["stats"]["skew"] is None

    assert cut["error"] is None and cut["seconds"] < 1.0, cut
    assert cut["stats"]["cut"] and cut["stats"]["samples"] == 0 and cut["stats"]["skew"] is None
    assert not cut["output"].any(), "the cut one was heard"


def test_two_speakers_given_one_start_time_start_together(  # type: ignore[no-untyped-def]
        speech, tmp_path: Path) -> None:
    """Two satellites, each its own process with its own (paced) sound device, are given the
    same start time: both say they started on time, and the two devices played the first
    sample within 30 ms of each other, by their own clocks."""
    procs, devices = [], []
    for name in ("hall", "kitchen"):
        directory = tmp_path / name
        dev = paced_device(directory, RATE)
        spec = directory / "spec.json"
        spec.write_text(json.dumps(dev.spec(stamp=True, start_rate=RATE, plays=[
            {"pcm": str(speech), "rate": RATE, "start_at": "stdin"}])))
        devices.append(dev)
        procs.append(subprocess.Popen([sys.executable, str(DRIVER), str(spec)], env=dev.env,
                                      cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for proc in procs:  # each has opened its device and waits for the start time
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline() or "{}").get("ready"), proc.communicate()
    start_at = time.time() + 1.0  # the announcement's start, a little in the future
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{start_at!r}\n")
        proc.stdin.flush()
    x = as_samples(speech.read_bytes())
    played = []
    for proc, dev in zip(procs, devices):
        stdout, stderr = proc.communicate(timeout=90)
        assert proc.returncode == 0, f"driver failed:\n{stdout}\n{stderr}"
        results = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        [r] = plays_heard(results, dev.out.read_bytes(), x)
        assert r["start_at"] == start_at
        assert_whole(r, x)
        played.append(r)
    hall, kitchen = played
    reported = [r["start_at"] + r["stats"]["skew"] for r in played]
    assert all(abs(r["stats"]["skew"]) < 0.01 for r in played), [r["stats"] for r in played]
    assert abs(reported[0] - reported[1]) <= TOGETHER, reported
    assert abs(hall["heard"] - kitchen["heard"]) <= TOGETHER, (hall["heard"], kitchen["heard"])
    assert min(hall["heard"], kitchen["heard"]) >= start_at


# The scheduler and the speaker of a herald in one process, on a paced device: a request
# without a start time (which also loads the voice), one with (``play_at``, which the fleet
# sets), then one whose time comes while the speaker is busy with a long one.
SCHEDULED = """
import asyncio, json, sys, time
sys.path.insert(0, "tests")
from speaker_driver import Pacer
fifo, out, text, long, rate = sys.argv[1:6]
rate = int(rate)
pacer = Pacer(fifo, out, rate * 2, stamp=True)  # reading before PortAudio opens the device
from daemon.synthesis.engine import Engine, EngineSettings
from daemon.jobs.metrics import Metrics
from daemon.jobs.request import Request
from daemon.jobs.scheduler import Scheduler
from daemon.settings import SchedulerSettings
from daemon.settings import SpeakerSettings
from daemon.sinks.speaker import SpeakerSink
from tts import AudioFormat, SynthesisOptions, VoiceCatalog

async def main():
    engine = Engine(VoiceCatalog(), EngineSettings(threads=1))
    metrics = Metrics()
    records = []
    metrics.add_listener(records.append)
    speaker = SpeakerSink(SpeakerSettings(), metrics)
    await speaker.start(AudioFormat(rate))
    scheduler = Scheduler(engine, metrics, SchedulerSettings(), SynthesisOptions(), speaker)
    outcomes = [await scheduler.submit(Request(text=text, id="now", seed=3))]
    await pacer.quiet()
    timed_from = pacer.consumed
    play_at = time.time() + 2.0
    outcomes.append(await scheduler.submit(Request(text=text, id="timed", seed=3,
                                                   play_at=play_at)))
    await pacer.quiet()
    busy_from = pacer.consumed
    busy = scheduler.submit(Request(text=long, id="busy", seed=4))
    busy_at = time.time() + 1.0
    behind = scheduler.submit(Request(text=text, id="behind", seed=3, play_at=busy_at))
    outcomes += await asyncio.gather(busy, behind)
    await scheduler.close()
    await speaker.stop()
    await pacer.quiet()
    pacer.stop()
    print(json.dumps({"outcomes": outcomes, "play_at": play_at, "busy_at": busy_at,
                      "timed_from": timed_from, "busy_from": busy_from, "stamps": pacer.stamps,
                      "records": [r.as_dict() for r in records]}))

asyncio.run(main())
"""


def test_a_request_with_a_start_time_is_heard_then_and_its_record_has_the_skew(  # type: ignore[no-untyped-def]
        synth, tmp_path: Path) -> None:
    """The scheduler hands ``play_at`` to the real speaker, which holds the utterance until
    then; its latency record carries the skew the speaker measured, the other one's none.
    One whose time comes while the speaker is busy starts when it is free, and says how
    late that was."""
    dev = paced_device(tmp_path, RATE)
    done = run_python(SCHEDULED, str(dev.fifo), str(dev.out), SHORT, LONG, str(RATE),
                      env=dev.env)
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["outcomes"] == ["finished"] * 4
    records = {r["id"]: r for r in result["records"]}
    assert records["now"]["start_skew_ms"] is None
    skew = records["timed"]["start_skew_ms"]
    assert skew is not None and abs(skew) < 10, skew
    # Heard whole at its time, give or take the latency the paced device doesn't report (see
    # the module's docstring); synthesized long before it, it was held, not played at once.
    ref = as_samples(reference_pcm(synth, SHORT, SynthesisOptions(seed=3)))
    heard = as_samples(dev.out.read_bytes())
    at = locate(heard, ref, result["timed_from"] // 2)
    assert_pcm_close(heard[at:at + len(ref)], ref, "the timed utterance")
    late = heard_at(result["stamps"], 2 * at) - result["play_at"]
    assert 0 <= late < 0.3, late

    # Behind a long one (3.7 s) that started just before its time: played when the speaker
    # was free, whole, and the record says it was late by what the device heard.
    busy, behind = records["busy"], records["behind"]
    assert busy["start_skew_ms"] is None
    last = int(np.flatnonzero(heard)[-1])
    at = locate(heard, ref, max(result["busy_from"] // 2, last - len(ref) - RATE // 10))
    assert_pcm_close(heard[at:at + len(ref)], ref, "the one behind the busy speaker")
    late = heard_at(result["stamps"], 2 * at) - result["busy_at"]
    assert behind["start_skew_ms"] > 2000, behind
    assert 0 <= late - behind["start_skew_ms"] / 1000 < 0.3, (late, behind)

"""The speaker sink through the real path: sounddevice -> PortAudio -> ALSA -> a file.

The sink runs in a subprocess (tests/speaker_driver.py, or a whole ``herald run``) because
PortAudio reads the ALSA configuration when sounddevice is imported. Three kinds of fake
sound card:

* ``alsa_file`` (conftest): ALSA's file plugin in front of the null PCM. It swallows audio as
  fast as it is written, so it tests what doesn't depend on a clock.
* ``paced``: the same file plugin writing into a FIFO that the driver reads at the device's
  byte rate. That is a sound card's clock: pre-roll, underruns, cut and "returned after the
  audio drained" mean here what they mean on hardware.
* ``listener`` (at the end): a paced device whose clock never stops, in front of a
  ``herald run``, for what the scheduler's interrupt and prefetch sound like.

Speech comes from the real default voice (seeded), so the checks are on real audio.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from audio_checks import PCM_TOLERANCE, as_samples, assert_pcm_close, assert_speech, reference_pcm
from conftest import ROOT, Broker, alsa_env, free_port
from herald_process import HeraldProcess, herald_env, start_herald
from mqtt_client import BASE, DEVICE, WAIT, Client
from speaker_driver import Pacer

from tts import SynthesisOptions
from tts.resample import Resampler

DRIVER = Path(__file__).with_name("speaker_driver.py")
RATE = 22050
PIPE_BYTES = 4096  # the paced FIFO's size: what may still sit between "drained" and the pacer
LONG = "The kitchen timer is done, and the laundry has finished its cycle."
SHORT = "Hello there, nice to meet you."
FAIL_AT = 30  # the failing source's chunk (of 2048 samples): 2.8 s of the long utterance


@dataclass
class Paced:
    """ALSA's default PCM writing into a FIFO the driver reads in real time."""

    env: dict[str, str]
    fifo: Path
    out: Path
    bytes_per_second: int

    def spec(self, **kw: Any) -> dict[str, Any]:
        return {"fifo": str(self.fifo), "out": str(self.out),
                "bytes_per_second": self.bytes_per_second, **kw}


def paced_device(directory: Path, rate: int) -> Paced:
    directory.mkdir(parents=True, exist_ok=True)
    fifo, out = directory / "device.fifo", directory / "out.raw"
    os.mkfifo(fifo)
    return Paced(alsa_env(directory, fifo), fifo, out, rate * 2)


def run_driver(spec: dict[str, Any], env: dict[str, str], directory: Path,
               timeout: float = 90, log: list[str] | None = None) -> list[dict[str, Any]]:
    """The driver's result lines; ``log`` gets the lines it logged."""
    path = directory / "spec.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(DRIVER), str(path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"driver failed:\n{proc.stdout}\n{proc.stderr}"
    if log is not None:
        log.extend(proc.stderr.splitlines())
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def heard_at(stamps: list[list[float]], byte: int) -> float:
    """Wall-clock time the paced device played ``byte`` of its output (from the pacer's
    read times, ``"stamp": true``: a read is played from the moment it is made, at the
    device's rate)."""
    consumed, at = max((s for s in stamps if s[0] <= byte), key=lambda s: s[0])
    return at + (byte - consumed) / (RATE * 2)


def first_nonzero(x: np.ndarray) -> int:
    nz = np.flatnonzero(x)
    return int(nz[0]) if len(nz) else len(x)


def align(out: np.ndarray, ref: np.ndarray) -> int:
    """Where ``ref`` starts in ``out``, given that the sink adds only leading silence."""
    start = first_nonzero(out) - first_nonzero(ref)
    assert start >= 0, "the output starts with audio the input doesn't have"
    return start


@pytest.fixture(scope="module")
def speech(synth, tmp_path_factory) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("speech")
    files = {}
    for name, text in (("long", LONG), ("short", SHORT)):
        files[name] = directory / f"{name}.raw"
        files[name].write_bytes(reference_pcm(synth, text, SynthesisOptions(seed=3)))
    return files


# ------------------------------------------------------------- one paced run, many checks

@pytest.fixture(scope="module")
def paced_run(speech, tmp_path_factory) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """One driver process plays several utterances on a paced 22 050 Hz device; each test
    below checks one of them. Each play's audio is the slice of the device output between
    the pacer's byte count before it and before the next one."""
    directory = tmp_path_factory.mktemp("paced")
    dev = paced_device(directory, RATE)
    long, short = str(speech["long"]), str(speech["short"])
    plays = {
        "exact": {"pcm": long, "rate": RATE},
        "half": {"pcm": short, "rate": RATE, "volume": 0.5},
        "ramp": {"pcm": long, "rate": RATE, "volume": 1.0,
                 "volume_after_first_audio": [1.0, 0.25]},
        "lead_in": {"pcm": short, "rate": RATE, "volume": 1.0,
                    "settings": {"lead_in_ms": 200.0}},
        "cut": {"pcm": long, "rate": RATE, "settings": {"lead_in_ms": 0.0},
                "cut_after_first_audio": 0.8},
        # Slow source and a pre-roll it never reaches: cut before anything is audible.
        "cut_early": {"pcm": short, "rate": RATE, "slow": 0.3, "cut_after_chunk": 0,
                      "settings": {"preroll_ms": 500.0}},
        # The task running play() is cancelled (service shutdown): it must still fade.
        "cancel": {"pcm": long, "rate": RATE, "cancel_after_first_audio": 0.6},
        # The source (synthesis) fails mid-utterance: its error comes out of play(), faded.
        # Its good chunks come at once and only the failure waits, 0.8 s into the audio
        # with 2.8 s of it buffered: no source pacing (which a busy host stretches) can let
        # the device run dry before the error (an underrun is silence, not a fade).
        "source_error": {"pcm": long, "rate": RATE, "fail_at_chunk": FAIL_AT,
                         "fail_after_first_audio": 0.8},
        # Everything sent, then 0.8 s of nothing mid-utterance, then the rest.
        "underrun": {"pcm": short, "rate": RATE, "chunk_bytes": 4410 * 2,
                     "pause": {"at": 1, "extra": 0.8}, "settings": {"preroll_ms": 60.0}},
    }
    results = run_driver(dev.spec(settings={"latency_ms": 250.0}, start_rate=RATE,
                                  plays=list(plays.values())), dev.env, directory)
    *per_play, tail = results
    assert len(per_play) == len(plays)
    device = dev.out.read_bytes()
    bounds = [r["consumed_before"] for r in per_play] + [tail["consumed_total"]]
    run: dict[str, Any] = {}
    for i, (name, play) in enumerate(plays.items()):
        run[name] = dict(per_play[i], input=as_samples(Path(play["pcm"]).read_bytes()),
                         output=as_samples(device[bounds[i]:bounds[i + 1]]),
                         behind_at_return=bounds[i + 1] - per_play[i]["consumed_at_return"])
    return run


def test_plays_the_exact_samples(paced_run: dict[str, Any]) -> None:
    r = paced_run["exact"]
    assert r["error"] is None
    x, out = r["input"], r["output"]
    assert r["stats"] == {"samples": len(x), "underruns": 0, "cut": False,
                          "device_rate": RATE, "xruns": 0, "skew": None}
    start = align(out, x)
    assert np.array_equal(out[start:start + len(x)], x), "samples differ from the input"
    assert not out[:start].any() and not out[start + len(x):].any()
    assert_speech(out[start:start + len(x)] / 32767.0, RATE, min_seconds=2.0)


def test_play_returns_after_the_device_has_played_it(paced_run: dict[str, Any]) -> None:
    # At return, at most the FIFO's contents (and one read in the pacer's hands) hadn't been
    # "heard". Returning when the last block went to PortAudio would leave the device's
    # 250 ms buffer (11 025 bytes) behind as well.
    r = paced_run["exact"]
    assert r["behind_at_return"] <= PIPE_BYTES + 512, r["behind_at_return"]


def test_on_first_audio_comes_before_the_source_is_done(paced_run: dict[str, Any]) -> None:
    # The underrun play sends its second chunk only after the first was heard, so first
    # audio must have been signalled while the source still had chunks to send.
    r = paced_run["underrun"]
    assert r["sent_at_first_audio"] is not None
    assert r["sent_at_first_audio"] < r["chunks"]


def test_volume_half_halves_the_samples(paced_run: dict[str, Any]) -> None:
    r = paced_run["half"]
    x, out = r["input"], r["output"]
    start = align(out, np.rint(x * 0.5).astype(np.int32))
    got = out[start:start + len(x)]
    assert np.abs(got - x * 0.5).max() <= 1.0
    ratio = np.sqrt(np.mean(got.astype(float) ** 2) / np.mean(x.astype(float) ** 2))
    assert abs(ratio - 0.5) < 0.005, ratio


def test_volume_change_ramps_without_a_step(paced_run: dict[str, Any]) -> None:
    r = paced_run["ramp"]
    x, out = r["input"], r["output"]
    start = align(out, x)
    got = out[start:start + len(x)]
    loud = np.flatnonzero(np.abs(x) > 2000)
    gain = got[loud] / x[loud]
    assert gain.max() < 1.001 and gain.min() > 0.249
    assert (gain > 0.999).any() and (gain < 0.251).any(), "the change didn't happen"
    # Full-scale 1.0 -> 0.25 at 20 ms per unit: ~15 ms, never one jump.
    last_full = loud[np.flatnonzero(gain > 0.99)[-1]]
    first_low = loud[np.flatnonzero(gain < 0.26)[0]]
    assert first_low - last_full >= 0.012 * RATE, (first_low - last_full)
    assert np.all(np.diff(gain[(loud >= last_full) & (loud <= first_low)]) <= 0.02)
    assert np.array_equal(got[first_low + 10:], np.rint(x[first_low + 10:] * 0.25)), \
        "after the ramp the level is not exactly 0.25"


def test_lead_in_adds_exactly_that_much_silence(paced_run: dict[str, Any]) -> None:
    with_lead, without = paced_run["lead_in"], paced_run["half"]
    # Both short: leading silence is PortAudio's start-up buffer (+ the lead-in).
    extra = align(with_lead["output"], with_lead["input"]) - align(
        without["output"], np.rint(without["input"] * 0.5).astype(np.int32))
    assert extra == int(0.2 * RATE), extra
    x = with_lead["input"]
    start = align(with_lead["output"], x)
    assert np.array_equal(with_lead["output"][start:start + len(x)], x)


def assert_fades_out(x: np.ndarray, out: np.ndarray) -> int:
    """``out`` is ``x`` up to some point, then a 15 ms linear fade, then silence and no
    click. Returns the samples heard (fade included)."""
    fade = int(0.015 * RATE)
    start = align(out, x)
    got = out[start:]
    same = int(np.argmax(got[: len(x)] != x[: len(got)]))  # first sample that differs
    assert same > 0.3 * RATE, "the audio before the cut differs from the input"
    tail = got[same:]
    assert not tail[fade + 1:].any(), "audio goes on after the fade"
    envelope = np.abs(x[same:same + fade + 1]) * (1 - np.arange(fade + 1) / fade) + 1
    assert np.all(np.abs(tail[:fade + 1]) <= envelope), "not a fade"
    # No click: the fade makes no step bigger than the speech itself has.
    steps = np.abs(np.diff(got[: same + fade + 2]))
    assert steps.max() <= np.abs(np.diff(x)).max()
    assert abs(int(tail[fade - 1])) <= 32767 // fade + 1
    return same + int(np.count_nonzero(tail[:fade + 1]))


def test_cut_fades_out_and_returns_early(paced_run: dict[str, Any]) -> None:
    r = paced_run["cut"]
    stats = r["stats"]
    assert stats["cut"] is True
    assert 0.5 * RATE < stats["samples"] < len(r["input"]) - RATE, stats  # ~1 s of 3.5 s
    heard = assert_fades_out(r["input"], r["output"])
    fade = int(0.015 * RATE)
    assert heard - fade - 1 <= stats["samples"] <= heard + fade + 1


def test_cancelled_play_fades_out(paced_run: dict[str, Any]) -> None:
    r = paced_run["cancel"]
    assert r["cancelled"] is True
    heard = assert_fades_out(r["input"], r["output"])
    assert heard < len(r["input"]) - RATE


def test_source_error_comes_out_of_play_after_a_fade(paced_run: dict[str, Any]) -> None:
    r = paced_run["source_error"]
    assert r["source_error"] == "synthesis failed (on purpose)"
    x, out = r["input"], r["output"]
    # Faded where the device was when the error came: what the source delivered that had not
    # been played is dropped, not played out first (nor anything after it).
    heard = int(np.flatnonzero(out)[-1]) + 1 - align(out, x)
    assert heard < FAIL_AT * 2048, f"{heard / RATE:.2f} s of {FAIL_AT * 2048 / RATE:.2f} s heard"
    assert_fades_out(x, out)


def test_cut_before_any_audio(paced_run: dict[str, Any]) -> None:
    r = paced_run["cut_early"]
    assert r["error"] is None
    assert r["stats"]["cut"] is True and r["stats"]["samples"] == 0
    assert not r["output"].any(), "something was played"


def test_starved_buffer_counts_one_underrun_and_loses_nothing(
        paced_run: dict[str, Any]) -> None:
    r = paced_run["underrun"]
    x, out = r["input"], r["output"]
    assert r["stats"]["underruns"] == 1, r["stats"]
    assert r["stats"]["samples"] == len(x)
    split = 4410  # the first chunk
    start = align(out, x)
    assert np.array_equal(out[start:start + split], x[:split])
    # The rest arrives after a gap of silence (the underrun), intact.
    rest = out[start + split:]
    gap = first_nonzero(rest) - first_nonzero(x[split:])
    assert gap >= 0.3 * RATE, f"only {gap} samples of gap: was there an underrun?"
    assert np.array_equal(rest[gap:gap + len(x) - split], x[split:])
    assert not rest[gap + len(x) - split:].any()


def test_hung_device_fails_the_play_and_the_next_one_plays(  # type: ignore[no-untyped-def]
        speech, tmp_path: Path) -> None:
    # The "sound card" stops taking audio 0.5 s into the first utterance (3.7 s long), for
    # 8 s: longer than the rest of it could take plus the stall margin (2 s). play() must
    # give up with SpeakerUnavailable (not hang, which would starve the watchdog), and the
    # next utterance, once the card is back, must play in full.
    dev = paced_device(tmp_path, RATE)
    results = run_driver(dev.spec(hold={"after_bytes": RATE, "seconds": 8.0}, plays=[
        {"pcm": str(speech["long"]), "rate": RATE},
        {"pcm": str(speech["short"]), "rate": RATE},
    ]), dev.env, tmp_path)
    hung, after = results[0], results[1]
    # PortAudio either sees the writes stall or reports the stream dead: both must fail the
    # play with the device named, and neither may hang.
    assert hung["error"] is not None, hung
    assert ("stopped taking audio" in hung["error"]
            or "stopped unexpectedly" in hung["error"]), hung
    assert after["error"] is None, after
    short = speech["short"].read_bytes()
    assert after["stats"]["samples"] == len(short) // 2
    assert dev.out.read_bytes().find(short.strip(b"\0")) > 0, "the second play is not intact"


# ------------------------------------------- back to back: the cue and the pause between

def at_device_rate(x: np.ndarray, rate: int) -> np.ndarray:
    """What the sink makes of ``x`` (voice rate) on a device at ``rate``: the same samples,
    or resampled whole (the resampler gives the same samples whatever the pieces)."""
    if rate == RATE:
        return x
    r = Resampler(RATE, rate)
    y = np.concatenate([r.process(x.astype(np.float32)), r.flush()])
    return np.clip(np.rint(y), -32768, 32767).astype(np.int32)


@pytest.mark.parametrize("device_rate", [RATE, 48000])
def test_a_cued_utterance_follows_after_exactly_its_pause(  # type: ignore[no-untyped-def]
        speech, tmp_path: Path, device_rate: int) -> None:
    """The next utterance, cued while one plays, goes on in the same stream the moment the
    first one ends: exactly its pause of silence in between (no device restart), to the
    sample; and the first one's play() still returns only once it has been heard."""
    pause, latency_ms = 0.25, 100.0
    dev = paced_device(tmp_path, device_rate)
    short, long = str(speech["short"]), str(speech["long"])
    results = run_driver(dev.spec(settings={"rate": device_rate, "latency_ms": latency_ms},
                                  start_rate=RATE, plays=[
        {"pcm": short, "rate": RATE, "key": "first",
         "after_first_audio": [[0.1, {"cue": {"pcm": long, "key": "next", "gap": pause}}]]},
        {"pcm": long, "rate": RATE, "key": "next", "gap": pause, "back_to_back": True},
    ]), dev.env, tmp_path)
    first, second = results[0], results[1]
    x, y = (as_samples(speech[name].read_bytes()) for name in ("short", "long"))
    for r, n in ((first, len(x)), (second, len(y))):
        assert r["stats"] == {"samples": n, "underruns": 0, "cut": False,
                              "device_rate": device_rate, "xruns": 0, "skew": None}, r
    out = as_samples(dev.out.read_bytes())
    rx, ry = at_device_rate(x, device_rate), at_device_rate(y, device_rate)
    a = locate(out, rx, 0)
    assert_pcm_close(out[a:a + len(rx)], rx, "the first utterance")
    b = locate(out, ry, a + len(rx))
    assert_pcm_close(out[b:b + len(ry)], ry, "the cued utterance")
    assert b - (a + len(rx)) == int(pause * device_rate), (b - (a + len(rx))) / device_rate
    assert not out[a + len(rx):b].any() and not out[b + len(ry):].any()
    # play() returned once its end had been played by PortAudio's count (its latency), not
    # when the end was handed over (a device buffer and the FIFO earlier): at most the FIFO
    # and what the device holds beyond the latency it reports (ALSA: a period, less than
    # latency_ms) were still to be heard.
    unreported = 2 * int(latency_ms / 1000 * device_rate)
    behind = 2 * (a + len(rx)) - first["consumed_at_return"]
    assert behind <= PIPE_BYTES + 512 + unreported, behind


def test_a_withdrawn_cue_is_not_heard_and_one_cut_after_it_started_fades(  # type: ignore[no-untyped-def]
        speech, tmp_path: Path) -> None:
    """A cue withdrawn (cut by its key) before the current utterance ends is never heard;
    one cut after it took over, before any play() claimed it, fades out like any cut."""
    dev = paced_device(tmp_path, RATE)
    short, long = str(speech["short"]), str(speech["long"])
    results = run_driver(dev.spec(start_rate=RATE, plays=[
        {"pcm": short, "rate": RATE, "key": "a", "after_first_audio": [
            [0.05, {"cue": {"pcm": long, "key": "x"}}], [0.3, {"cut": "x"}]]},
        {"pcm": short, "rate": RATE, "key": "b", "back_to_back": True,
         "after_first_audio": [[0.05, {"cue": {"pcm": long, "key": "y"}}]],
         "after_return": [{"cut": "y"}]},
        {"pcm": short, "rate": RATE, "key": "c", "back_to_back": True},
    ]), dev.env, tmp_path)
    x, y = (as_samples(speech[name].read_bytes()) for name in ("short", "long"))
    for r in results[:3]:
        assert r["error"] is None and r["stats"]["samples"] == len(x), r
        assert not r["stats"]["cut"], r
    out = as_samples(dev.out.read_bytes())
    a = locate(out, x, 0)
    b = locate(out, x, a + len(x))
    assert not out[a + len(x):b].any(), "the withdrawn cue was heard"
    end = b + len(x)
    started = heard_as_synthesized(out[end:], y)  # it went on right after b
    assert np.abs(out[end:end + started]).max() > LOUD, "the cue had not started"
    c = locate(out, x, end + started + FADE + 1)
    tail = out[end + started:c]
    assert np.count_nonzero(tail) <= FADE + 1, "more of it was heard than a fade"
    envelope = np.abs(y[started:started + FADE + 1]) * (1 - np.arange(FADE + 1) / FADE) + 1
    assert np.all(np.abs(tail[:FADE + 1]) <= envelope), "not a fade"
    for at in (a, b, c):
        assert_pcm_close(out[at:at + len(x)], x, "a played utterance")
    assert not out[c + len(x):].any()


def test_the_pause_follows_an_utterance_that_ended_by_itself_not_a_cut_one(  # type: ignore[no-untyped-def]
        speech, tmp_path: Path) -> None:
    """Without a cue (the next one wasn't ready in time) the pause is kept all the same,
    as lead-in silence; after a cut (stop, interrupt) the next one doesn't wait for it.

    The pause is what a listener hears: wall-clock time, from the pacer's read times. The
    recording holds only what was written, so the time between the two plays (in which the
    stream is stopped and nothing is written), a part of the pause the sink counts, is not
    in it; the silence PortAudio starts a stream with is."""
    pause = 1.0  # longer than the silence of a device restart
    dev = paced_device(tmp_path, RATE)
    short = str(speech["short"])
    *results, tail = run_driver(dev.spec(start_rate=RATE, stamp=True, plays=[
        {"pcm": short, "rate": RATE},
        {"pcm": short, "rate": RATE, "gap": pause, "back_to_back": True,
         "cut_after_first_audio": 0.5},
        {"pcm": short, "rate": RATE, "gap": pause, "back_to_back": True},
    ]), dev.env, tmp_path)
    assert [r["stats"]["cut"] for r in results] == [False, True, False], results
    x = as_samples(speech["short"].read_bytes())
    out = as_samples(dev.out.read_bytes())
    a = locate(out, x, 0)
    b = a + len(x) + align(out[a + len(x):], x)  # (cut short: too little of it to locate)
    # The sink counts the pause from PortAudio's report that the first one drained: the
    # FIFO behind the device (which PortAudio doesn't see) may still hold its end then.
    apart = heard_at(tail["stamps"], 2 * b) - heard_at(tail["stamps"], 2 * (a + len(x)))
    assert apart >= pause - (PIPE_BYTES + 512) / (2 * RATE), f"{apart:.3f} s apart"
    # After a cut, the recording: what is written between the cut one and the next (its
    # fade's block, a stream start's silence) does not grow with the time between plays.
    cut_at = b + heard_as_synthesized(out[b:], x) + FADE + 1
    c = locate(out, x, cut_at)
    assert c - cut_at < pause * RATE, f"{(c - cut_at) / RATE:.3f} s after the cut"
    assert_pcm_close(out[c:c + len(x)], x, "the utterance after the cut")


# ---------------------------------------------------------------------- resampling

def fft_resample(x: np.ndarray, n_out: int) -> np.ndarray:
    """Ideal band-limited resampling of a whole signal: an independent reference."""
    spectrum = np.fft.rfft(x.astype(np.float64))
    out = np.zeros(n_out // 2 + 1, dtype=complex)
    k = min(len(spectrum), len(out))
    out[:k] = spectrum[:k]
    return np.fft.irfft(out, n_out) * (n_out / len(x))


def test_resamples_when_the_device_runs_at_another_rate(speech, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dev = paced_device(tmp_path, 48000)
    results = run_driver(dev.spec(settings={"rate": 48000},
                                  plays=[{"pcm": str(speech["short"]), "rate": RATE}]),
                         dev.env, tmp_path)
    r = results[0]
    x = as_samples(speech["short"].read_bytes())
    assert r["error"] is None
    assert r["stats"]["device_rate"] == 48000 and r["stats"]["samples"] == len(x)
    out = as_samples(dev.out.read_bytes())
    # 22 050 -> 48 000 is 147 -> 320: pad to whole periods so the reference maps time exactly.
    padded = np.concatenate([x, np.zeros(-len(x) % 147, dtype=x.dtype)])
    n_out = len(padded) * 320 // 147
    ref = fft_resample(padded, n_out)
    # Align on the reference by cross-correlation around the first audio.
    guess = first_nonzero(out) - round(first_nonzero(x) * 48000 / RATE)
    best = max(range(max(0, guess - 200), guess + 200),
               key=lambda s: float(np.dot(out[s:s + n_out].astype(float), ref[: len(out) - s])))
    got = out[best:best + n_out].astype(float)
    assert len(got) == n_out, "output shorter than the input scaled by 48000/22050"
    assert not out[best + n_out + 64:].any(), "output longer than the input scaled"
    err = np.sqrt(np.mean((got - ref) ** 2)) / np.sqrt(np.mean(ref ** 2))
    assert err < 0.005, f"differs from ideal resampling by {err:.1%}"
    assert_speech(got / 32767.0, 48000, min_seconds=1.0)


# ------------------------------------------------ unpaced device: errors, no spinning

def test_missing_device_is_reported_and_a_good_one_still_plays(  # type: ignore[no-untyped-def]
        speech, alsa_file) -> None:
    bogus = "no-such-card-xyz"
    short = str(speech["short"])
    results = run_driver({
        # start() finds no device: it must log, not raise (the driver would stop here).
        "file": str(alsa_file.out), "start_rate": RATE,
        "settings": {"device": bogus, "retry_seconds": 1.0},
        "plays": [
            {"pcm": short, "rate": RATE},  # inside the retry window: fails fast
            {"pcm": short, "rate": RATE, "sleep_before": 1.2},  # window over: tries again
            {"pcm": short, "rate": RATE, "device": "default"},
        ]}, alsa_file.env, alsa_file.out.parent)
    fast, retried, good = results
    for r in (fast, retried):
        assert r["error"].startswith(f"no sound device '{bogus}'"), r["error"]
        assert "speaker.device" in r["error"] and "'default'" in r["error"]
    assert "retrying in" in fast["error"]
    assert "retrying in" not in retried["error"]
    assert good["error"] is None
    x = as_samples(speech["short"].read_bytes())
    assert good["stats"]["samples"] == len(x) and good["stats"]["underruns"] == 0
    out = as_samples(alsa_file.pcm())
    start = align(out, x)
    assert np.array_equal(out[start:start + len(x)], x)


def test_device_faster_than_real_time_does_not_spin_on_silence(  # type: ignore[no-untyped-def]
        speech, alsa_file) -> None:
    # The null PCM takes audio instantly, so a slow source starves it after every chunk.
    # Starved longer than park_ms, the stream must stop, not fill the file with silence.
    results = run_driver({
        "file": str(alsa_file.out), "settings": {"park_ms": 100.0},
        "plays": [{"pcm": str(speech["short"]), "rate": RATE, "slow": 0.1,
                   "chunk_bytes": 2205 * 2}]}, alsa_file.env, alsa_file.out.parent)
    r = results[0]
    x = as_samples(speech["short"].read_bytes())
    assert r["error"] is None and r["stats"]["samples"] == len(x)
    chunks = -(-len(x) // 2205)
    assert 1 <= r["stats"]["underruns"] <= chunks
    out = as_samples(alsa_file.pcm())
    # Each starvation may add park_ms of silence plus PortAudio's start-up buffer.
    per_restart = int(0.1 * RATE) + int(0.2 * RATE)
    assert len(out) <= len(x) + (r["stats"]["underruns"] + 1) * per_restart, len(out)
    assert np.count_nonzero(out) >= np.count_nonzero(x), "audio went missing"


# ------------------------------------- herald run: what a listener hears from the queue
#
# The scheduler's interrupt and prefetch, end to end: MQTT say -> herald run -> scheduler ->
# speaker sink -> PortAudio -> ALSA -> a paced device whose clock never stops (it records
# silence while nothing is written, as a sound card plays it; see Pacer), so the recording
# is what a listener heard, second for second. Each say's audio is compared with the
# engine's own synthesis of it (seeded): heard whole, heard cut short, and how much silence
# between.
#
# The speaker's pre-roll (5 s) is longer than these utterances, except the one that gets cut
# after 5 s of it are ready, so an utterance starts playing only once all of it is
# synthesized: no underrun puts silence inside it. Two queued utterances are two paragraphs:
# herald means the paragraph pause between them and nothing else. The second one, prefetched
# whole while the first plays, is the speaker's cue and follows in the same device stream.
# (Restarting the stream for it instead cost 0.18 s of PortAudio/ALSA silence on this device,
# whatever the pause; without prefetch the listener would also hear the whole synthesis of the
# second one: 0.5 to 1.0 s here, with scheduler.prefetch off.)

PAUSE = 0.4  # synthesis.paragraph_silence: the pause between two paragraphs of one say
# The longer first (5 s of audio, then 2.5 s): the second is made while the first plays even
# on a busy host. The other way round, 5 s of audio would have to be made in 2.5 s.
QUEUED = ("Please take the laundry out of the machine before it starts to smell, and hang it "
          "up outside.",
          "The washing machine has finished its program.")
INTERRUPTED = ("This announcement about the weather goes on for quite a while, so that "
               "something more urgent can cut it short.")
URGENT = "Someone is at the front door."
STALL = 0.2  # the device waits this long for a writer running late before playing silence
FADE = int(0.015 * RATE)  # speaker.fade_ms
LOUD = 100  # a sample this far from zero is sound, not a rounding step


@dataclass
class Listener:
    """A ``herald run`` playing into the paced device, and an MQTT client to ask it."""

    herald: HeraldProcess
    client: Client
    device: Pacer

    def mark(self) -> int:
        """A position in the recording (bytes): what is heard from now on starts there."""
        return self.device.consumed // 2 * 2

    def heard(self, since: int) -> np.ndarray:
        return as_samples(self.device_file.read_bytes()[since:])

    @property
    def device_file(self) -> Path:
        return Path(self.device.out.name)

    def wait_heard(self, since: int, samples: int) -> None:
        """Until ``samples`` sound samples have been heard since ``since``."""
        deadline = time.monotonic() + WAIT
        while np.count_nonzero(self.heard(since)) < samples:
            assert time.monotonic() < deadline, "nothing heard:\n" + self.herald.tail()
            time.sleep(0.05)

    def drained(self) -> None:
        """Until the device has taken everything herald wrote before now (the FIFO was
        found empty since)."""
        now = time.monotonic()
        deadline = now + WAIT
        while self.device.last_empty <= now:
            assert time.monotonic() < deadline, "the device never ran dry"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def listener(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listener]:
    tmp = tmp_path_factory.mktemp("listener")
    broker = Broker(free_port(), tmp / "broker")
    broker.workdir.mkdir()
    broker.start()
    fifo = tmp / "device.fifo"
    os.mkfifo(fifo)
    # The clock must be reading before herald's PortAudio opens the device.
    device = Pacer(str(fifo), str(tmp / "heard.raw"), RATE * 2, silence_after=STALL)
    config = tmp / "herald.toml"
    config.write_text(f"""
device_id = "{DEVICE}"
[mqtt]
host = "127.0.0.1"
port = {broker.port}
[synthesis]
paragraph_silence = {PAUSE}
[speaker]
preroll_ms = 5000
[wyoming]
enabled = false
[http]
enabled = false
""")
    herald = start_herald(config, tmp / "herald.log", herald_env(base=alsa_env(tmp, fifo)))
    client = None
    try:
        client = Client(broker.port)
        client.wait_online()
        yield Listener(herald, client, device)
        assert herald.proc.poll() is None, "herald died:\n" + herald.tail()
    finally:
        if client is not None:
            client.close()
        herald.kill()
        device.stop()
        broker.stop()
        print(herald.tail())


def locate(heard: np.ndarray, ref: np.ndarray, start: int) -> int:
    """Where ``ref`` starts in ``heard``, at or after ``start``: lined up on the first
    loud sample, then on the offset nearby that matches best (within rounding, the onset
    may cross the threshold a sample or two apart)."""
    onset = int(np.flatnonzero(np.abs(ref) > LOUD)[0])
    loud = np.flatnonzero(np.abs(heard[start + onset:]) > LOUD)
    assert len(loud), "not heard at all"
    guess = start + onset + int(loud[0])  # where ref[onset] seems to be
    span = min(len(ref) - onset, RATE // 2)

    def mismatch(at: int) -> int:
        got = heard[at:at + span]
        if at < start or len(got) < span:
            return 1 << 30
        return int(np.abs(got - ref[onset:onset + span]).max())

    return min(range(guess - 20, guess + 21), key=mismatch) - onset


def heard_as_synthesized(heard: np.ndarray, ref: np.ndarray) -> int:
    """How many samples from the start of ``heard`` are ``ref``'s, within rounding."""
    n = min(len(heard), len(ref))
    off = np.flatnonzero(np.abs(heard[:n] - ref[:n]) > PCM_TOLERANCE)
    return int(off[0]) if len(off) else n


# The listener's device hears silence wherever herald's audio thread writes nothing for
# STALL: a neighbour that kept it from a core that long would put zeros in what is heard.
@pytest.mark.alone
def test_interrupt_is_heard_cut_short_and_the_interrupting_say_whole(
        listener: Listener, synth: Any) -> None:
    """A say with "mode": "interrupt" while another is being heard: the listener hears the
    first as synthesized up to the cut, its fade-out, then the interrupting say in full."""
    c = listener.client
    long = as_samples(reference_pcm(synth, INTERRUPTED, SynthesisOptions(seed=11)))
    urgent = as_samples(reference_pcm(synth, URGENT, SynthesisOptions(seed=12)))
    since = listener.mark()
    c.say(id="long", text=INTERRUPTED, seed=11)
    listener.wait_heard(since, RATE // 2)  # half a second of it has been heard
    c.say(id="urgent", text=URGENT, seed=12, mode="interrupt")
    assert c.wait_event("urgent")["event"] == "finished"
    assert [e["event"] for e in c.events("long")] == ["queued", "started", "stopped"]
    evs = [(e["id"], e["event"]) for e in c.events() if e["id"] in ("long", "urgent")]
    assert evs.index(("long", "stopped")) < evs.index(("urgent", "started"))
    listener.drained()
    heard = listener.heard(since)

    start = locate(heard, long, 0)
    cut = heard_as_synthesized(heard[start:], long)
    # Heard as synthesized up to the cut (at least the half second waited for), then
    # cut short: not even half of it.
    assert RATE // 2 <= cut < len(long) // 2, f"{cut / RATE:.2f} s of {len(long) / RATE:.2f} s"
    # After the cut, at most the fade-out, then silence until the urgent say...
    after = start + cut + FADE + 1
    urgent_at = locate(heard, urgent, after)
    tail = np.count_nonzero(heard[start + cut:urgent_at])
    assert tail <= FADE + 1, f"{tail} samples more of it were heard"
    assert not heard[after:urgent_at].any()
    # ...which is heard whole, and nothing after it.
    assert_pcm_close(heard[urgent_at:urgent_at + len(urgent)], urgent, "the urgent say")
    assert not heard[urgent_at + len(urgent):].any()


@pytest.mark.alone  # as above
def test_queued_says_follow_each_other_without_a_gap(listener: Listener, synth: Any) -> None:
    """Two says queued at once: both heard whole, in order, the second synthesized while the
    first played, and exactly as far apart as two paragraphs of one say."""
    c = listener.client
    first, second = (as_samples(reference_pcm(synth, text, SynthesisOptions(seed=seed)))
                     for text, seed in zip(QUEUED, (21, 22)))
    since = listener.mark()
    c.say(id="q1", text=QUEUED[0], seed=21)
    c.say(id="q2", text=QUEUED[1], seed=22)
    assert c.wait_event("q2")["event"] == "finished"
    assert c.wait_event("q1")["event"] == "finished"
    one, two = (c.wait(lambda ms, rid=rid: next((m.json() for m in ms
                                                 if m.topic == f"{BASE}/latency"
                                                 and m.json()["id"] == rid), None),
                       what=f"the latency record of {rid}") for rid in ("q1", "q2"))
    # By herald's own clock, the second was synthesized whole before the first had played
    # (both received at once, give or take the broker's milliseconds, against seconds).
    assert two["queue_ms"] + two["synth_ms"] < one["first_audio_ms"] + one["audio_ms"], (
        one, two)
    listener.drained()
    heard = listener.heard(since)

    a = locate(heard, first, 0)
    assert_pcm_close(heard[a:a + len(first)], first, "the first say")
    b = locate(heard, second, a + len(first))
    assert_pcm_close(heard[b:b + len(second)], second, "the second say")
    assert not heard[b + len(second):].any()
    # Between them only silence: the paragraph pause, to the sample. The speaker joins them
    # inside one audio callback, so no device period (block_ms, latency_ms) can round it.
    gap = heard[a + len(first):b]
    assert not gap.any()
    assert len(gap) == int(PAUSE * RATE), f"{len(gap) / RATE:.4f} s of silence between them"

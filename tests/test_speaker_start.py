"""How the speaker starts an utterance, through the real path: sounddevice -> PortAudio ->
ALSA's file plugin (tests/speaker_driver.py).

A start PortAudio refuses. On a loaded host PortAudio gives up starting a stream whose audio
thread has not got going within a second: ``Error starting stream: Wait timed out`` (-9987).
That cannot be had on demand from load, so the sound card is made slow to start instead:
``slow_alsa_start.c``, preloaded into the driver, holds ALSA's ``snd_pcm_start`` (which
PortAudio calls on that new thread, before telling the waiting caller it runs) for longer
than the second, on the first N such threads. PortAudio runs as it does under load: its
wait times out, it ends the thread (whose end it reports through the stream's finished
callback) and the start raises -9987.

A pre-roll for audio from the network (a satellite's own say, chunk by chunk from a fleet
worker): the first audio waits until that much is buffered.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from audio_checks import as_samples, assert_speech, reference_pcm
from test_speaker import LONG, RATE, SHORT, paced_device, run_driver
from test_speaker_sync import plays_heard

from tts import SynthesisOptions

SLOW_START = 1.3  # seconds ALSA's start is held: over PortAudio's one-second wait


@pytest.fixture(scope="module")
def short(synth, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("speech") / "short.raw"
    path.write_bytes(reference_pcm(synth, SHORT, SynthesisOptions(seed=3)))
    return path


@pytest.fixture(scope="module")
def long(synth, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("speech") / "long.raw"
    path.write_bytes(reference_pcm(synth, LONG, SynthesisOptions(seed=3)))
    return path


@pytest.fixture(scope="module")
def slow_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The preload library, built here (gcc is in scripts/setup)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc is not None, "no C compiler: scripts/setup installs gcc"
    lib = tmp_path_factory.mktemp("preload") / "slow_alsa_start.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(lib),
                    str(Path(__file__).with_name("slow_alsa_start.c")), "-ldl"], check=True)
    return lib


def slow_env(env: dict[str, str], lib: Path, starts: int) -> dict[str, str]:
    return dict(env, LD_PRELOAD=str(lib), SLOW_ALSA_STARTS=str(starts),
                SLOW_ALSA_START_SECONDS=str(SLOW_START))


# PortAudio's start returns (refused) only once the audio thread it gave up on has got past
# the driver's start and PortAudio has ended it; meanwhile that thread primes the device from
# the stream callback, taking audio from the utterance. ALSA's null device would let it take
# any amount, as fast as it comes, depending on how soon the thread is ended; a device that
# plays in real time, like a sound card (paced_device), lets it take a buffer's worth. Beside
# a busy neighbour the thread is ended later still: alone, they run as in a serial run.
@pytest.mark.alone
def test_a_start_that_times_out_is_tried_again_and_plays(  # type: ignore[no-untyped-def]
        long, slow_start, tmp_path: Path) -> None:
    dev = paced_device(tmp_path, RATE)
    log: list[str] = []
    results = run_driver(dev.spec(start_rate=RATE, plays=[{"pcm": str(long), "rate": RATE}]),
                         slow_env(dev.env, slow_start, starts=1), tmp_path, log=log)
    r = results[0]
    assert r["error"] is None, "\n".join([r["error"], *log])
    x = as_samples(long.read_bytes())
    assert r["stats"]["samples"] == len(x)
    # The first start was refused, as on the loaded host, and tried again.
    refused = [line for line in log if "trying again" in line]
    assert len(refused) == 1, "\n".join(log)
    assert "could not start the sound device 'default'" in refused[0]
    assert "Wait timed out" in refused[0]
    # The refused start's thread may have primed the device with the utterance's first blocks
    # (a buffer's worth at most, on this device); from the retry on, the rest is on the
    # device sample for sample, to the end.
    out = as_samples(dev.out.read_bytes())
    tail = x[-RATE:]
    assert any(np.array_equal(out[i:i + len(tail)], tail)
               for i in np.flatnonzero(out == tail[0])), "the end of the utterance is missing"
    assert_speech(out / 32767.0, RATE, min_seconds=1.0)


@pytest.mark.alone
def test_a_start_refused_every_time_says_so_and_the_next_utterance_plays(  # type: ignore[no-untyped-def]
        long, short, slow_start, tmp_path: Path) -> None:
    # A device that plays in real time, like a sound card (paced_device), not ALSA's null
    # device, which would let a refused start's audio thread take the whole utterance in the
    # moment before PortAudio ends it: here each takes at most what plays meanwhile, so the
    # long utterance (3.7 s) has audio left when the tries run out, and the refusal is
    # reported rather than a play the refused threads finished.
    dev = paced_device(tmp_path, RATE)
    log: list[str] = []
    results = run_driver(dev.spec(start_rate=RATE, plays=[
        {"pcm": str(long), "rate": RATE}, {"pcm": str(short), "rate": RATE},
    ]), slow_env(dev.env, slow_start, starts=3), tmp_path, log=log)
    failed, after, _pacer = results
    error = failed["error"]
    assert error is not None, "\n".join(log)
    # Worded as what happened, with PortAudio's own message and what to do; not an unplug.
    assert error.startswith("could not start the sound device 'default': Error starting "
                            "stream: Wait timed out"), error
    assert "tried 3 times" in error and "too busy" in error and "more CPU" in error
    assert "unplugged" not in error
    assert sum("trying again" in line for line in log) == 2, "\n".join(log)
    # The device is reopened for the next utterance, which plays whole.
    assert after["error"] is None, after["error"]
    assert after["stats"]["samples"] == len(short.read_bytes()) // 2


def test_the_pause_before_a_retry_never_runs_past_the_start_time() -> None:
    from daemon.sinks.speaker.device import RETRY_AFTER, retry_pause

    assert [retry_pause(n) for n in range(1, len(RETRY_AFTER) + 2)] == [*RETRY_AFTER, None]
    now = time.monotonic()
    assert retry_pause(1, now - 1.0) == 0.0  # its start time has passed: at once
    assert retry_pause(2, now + 0.05) <= 0.05  # type: ignore[operator]
    assert retry_pause(1, now + 10.0) == RETRY_AFTER[0]


CHUNK = RATE // 10  # samples: 100 ms, as the fleet's chunks (mqtt.audio.chunk_ms)
LATE = 0.4  # seconds the second chunk comes late (a busy worker, the network)


def test_a_preroll_holds_the_first_audio_until_it_is_buffered(  # type: ignore[no-untyped-def]
        short, tmp_path: Path) -> None:
    dev = paced_device(tmp_path, RATE)
    x = as_samples(short.read_bytes())
    play = {"pcm": str(short), "rate": RATE, "chunk_bytes": CHUNK * 2}
    held, unheld = plays_heard(run_driver(dev.spec(stamp=True, plays=[
        # The fleet's pre-roll, two chunks: nothing can start before the second one, late
        # by LATE from the first (which gives a sink that doesn't hold the time to show it).
        dict(play, preroll=0.15, late=[[1, LATE]]),
        # speaker.preroll_ms alone (60 ms), the first chunk: the second one comes LATE after
        # the first has played, counted from its first audio, so however long the stream
        # takes to start, the first audio comes before it and the device runs dry.
        dict(play, pause={"at": 1, "extra": LATE}),
    ]), dev.env, tmp_path), dev.out.read_bytes(), x)
    # Held: nothing went out before the second chunk was there, and then it played through.
    assert held["error"] is None, held
    assert held["sent_at_first_audio"] >= 2, held["sent_at_first_audio"]
    assert held["stats"]["underruns"] == 0, held["stats"]
    got = held["output"][held["start"]:held["start"] + len(x)]
    assert np.array_equal(got, x), "the held utterance is not played as it was"
    # The first-audio event (what stamps a latency record's first_audio_ms) is when the
    # audio went to the device, not when the first chunk came, nor once it has played. (The
    # device's read and the event's callback on the loop both follow the write, in either
    # order: how soon the loop runs the callback is the host's, not herald's.)
    second_chunk = held["sent_at"][1]
    assert held["first_audio_at"] >= second_chunk
    assert held["first_audio_at"] < held["heard"] + len(x) / RATE / 2, (
        held["heard"], held["first_audio_at"])
    # Without it, the first chunk plays at once and the late second one is a gap.
    assert unheld["error"] is None, unheld
    assert unheld["sent_at_first_audio"] == 1, unheld["sent_at_first_audio"]
    assert unheld["stats"]["underruns"] >= 1, unheld["stats"]
    assert unheld["first_audio_at"] < unheld["sent_at"][1]

"""The speaker's mixer with plain arrays: what the audio callback hands the device, block by
block (no PortAudio, no event loop; tests/test_speaker.py plays it through ALSA)."""

from __future__ import annotations

import numpy as np
import pytest

from daemon.settings import SpeakerSettings
from daemon.sinks.speaker.mixer import VOLUME_RAMP_SECONDS, Mixer, State, Voice

RATE = 16000
BLOCK = 320  # 20 ms


class Recorded(Voice):
    """A voice that notes its hooks."""

    def __init__(self, timings: SpeakerSettings, key: object = None) -> None:
        super().__init__(RATE, RATE, timings, key)
        self.events: list[str] = []

    def first_audio(self) -> None:
        self.events.append("first_audio")

    def heard(self) -> None:
        self.events.append("heard")


def settings(**kw: float) -> SpeakerSettings:
    return SpeakerSettings(**{"preroll_ms": 0.0, **kw})


def ramp_signal(n: int, start: float = 1000.0) -> np.ndarray:
    """Distinct non-zero samples, so a misplaced one shows."""
    return start + np.arange(n, dtype=np.float32)


def voice(samples: np.ndarray, producing: bool = False, **kw: float) -> Recorded:
    v = Recorded(settings(**kw))
    v.push(samples)
    v.producing = producing
    v.state = State.PLAYING  # what starting the stream does
    return v


def play(mixer: Mixer[Recorded], blocks: int) -> tuple[np.ndarray, list[bool]]:
    out, stops = [], []
    for _ in range(blocks):
        block, stop = mixer.render(BLOCK)
        out.append(block)
        stops.append(stop)
    return np.concatenate(out), stops


def test_plays_the_samples_then_completes_the_stream() -> None:
    x = ramp_signal(1000)
    m: Mixer[Recorded] = Mixer(1.0)
    m.current = v = voice(x)
    out, stops = play(m, 4)  # 1280 frames for 1000 samples
    assert np.array_equal(out[:1000], x) and not out[1000:].any()
    assert stops == [False, False, False, True]  # the block with its end completes it
    assert v.state is State.ENDED and v.frames_out == 1000 and v.events == ["first_audio"]


def test_lead_in_is_silence_before_the_audio() -> None:
    x = ramp_signal(500)
    m: Mixer[Recorded] = Mixer(1.0)
    m.current = voice(x, lead_in_ms=25.0)  # 400 frames
    out, _ = play(m, 3)
    assert not out[:400].any() and np.array_equal(out[400:900], x)


def test_volume_scales_and_a_change_ramps_without_a_step() -> None:
    x = np.full(4000, 10000.0, dtype=np.float32)
    m: Mixer[Recorded] = Mixer(0.5)
    m.rate = RATE
    m.current = voice(x)
    out, _ = play(m, 2)
    assert np.allclose(out, 5000.0)  # starts at the volume set, no ramp into it
    m.target = 1.0
    out, _ = play(m, 3)
    step = 10000.0 / (VOLUME_RAMP_SECONDS * RATE)  # per sample, at full scale
    assert np.diff(out).max() <= step * 1.001 and np.diff(out).min() >= 0
    reached = int(0.5 * VOLUME_RAMP_SECONDS * RATE)  # half of full scale to climb
    assert np.allclose(out[reached:], 10000.0) and out[0] < 5100.0


def test_cut_fades_out_linearly_then_silence() -> None:
    x = np.full(RATE, 8000.0, dtype=np.float32)
    m: Mixer[Recorded] = Mixer(1.0)
    m.current = v = voice(x, fade_ms=15.0)  # 240 frames
    play(m, 1)
    v.interrupt()
    assert v.state is State.FADING
    out, stops = play(m, 2)
    fade = out[:240]
    assert fade[0] == 8000.0 and np.all(np.diff(fade) < 0) and fade[-1] < 8000.0 / 200
    assert not out[240:].any() and v.state is State.ENDED and stops[0]
    assert v.buffered == 0  # the rest is dropped


def test_a_cut_before_anything_was_heard_ends_at_once() -> None:
    m: Mixer[Recorded] = Mixer(1.0)
    m.current = v = voice(ramp_signal(1000), lead_in_ms=100.0)
    play(m, 1)  # lead-in only
    v.interrupt()
    assert v.state is State.ENDED and v.buffered == 0
    out, stops = play(m, 1)
    assert not out.any() and stops == [True]


def test_starving_counts_one_underrun_then_parks() -> None:
    x = ramp_signal(400)
    m: Mixer[Recorded] = Mixer(1.0)
    m.current = v = voice(x, producing=True, park_ms=50.0, preroll_ms=10.0)  # park: 800
    out, stops = play(m, 4)
    assert np.array_equal(out[:400], x) and not out[400:].any()
    assert v.underruns == 1
    # 880 frames starved by the 4th block: parked, the stream completes.
    assert v.state is State.PARKED and stops == [False, False, False, True]


def test_the_cue_follows_after_its_pause_in_the_same_block() -> None:
    a, b = ramp_signal(500), ramp_signal(300, start=-5000.0)
    m: Mixer[Recorded] = Mixer(1.0)
    m.drain_frames = 1000  # what the device holds ahead of the block written
    m.current = first = voice(a)
    cue = Recorded(settings(), key="next")
    cue.push(b)
    cue.producing = False
    cue.lead_in = 100  # the pause
    m.cue = cue
    out, stops = play(m, 5)
    assert np.array_equal(out[:500], a)
    assert not out[500:600].any()  # the pause, to the sample
    assert np.array_equal(out[600:900], b) and not out[900:].any()
    assert stops.index(True) == 2  # the cue's end completes the stream
    assert m.current is cue and m.unclaimed is cue and m.cue is None
    # The first counts as heard once the device has played what it held, plus the first's
    # part of the block it ended in: 1000 + 180 frames after that (2nd) block, so in the
    # 4th block after it, not the 3rd.
    assert first.events == ["first_audio"]
    play(m, 1)
    assert first.events == ["first_audio", "heard"] and m.draining == []


def test_a_cut_utterance_does_not_hand_over() -> None:
    m: Mixer[Recorded] = Mixer(1.0)
    m.current = v = voice(np.full(1000, 8000.0, dtype=np.float32), fade_ms=5.0)
    cue = Recorded(settings())
    cue.push(ramp_signal(300))
    cue.producing = False
    m.cue = cue
    play(m, 1)
    v.interrupt()
    out, stops = play(m, 1)
    assert not out[80:].any() and stops == [True]  # faded (80 frames), then the stream ends
    assert m.current is v and m.cue is cue


# -------------------------------------------------------------- a start at a given time

class Offset:
    """A device clock running ``offset`` seconds behind the wall clock."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def to_device(self, wall: float) -> float:
        return wall - self.offset


def timed(samples: np.ndarray, start_at: float) -> Recorded:
    v = voice(samples)
    v.start_at = start_at
    return v


def play_at(mixer: Mixer[Recorded], dacs: list[float]) -> np.ndarray:
    """One block per DAC time (device clock) the device reports."""
    return np.concatenate([mixer.render(BLOCK, dac=d)[0] for d in dacs])


def test_a_start_time_puts_the_first_sample_at_the_frame_that_reaches_the_dac_then() -> None:
    x = ramp_signal(1000)
    m: Mixer[Recorded] = Mixer(1.0)
    m.rate, m.clock = RATE, Offset(1000.0)
    # Wall 1100.05 is device 100.05: in the third block (DAC 100.04 .. 100.06), 10 ms =
    # 160 frames in.
    m.current = v = timed(x, 1100.05)
    out = play_at(m, [100.0, 100.02, 100.04, 100.06, 100.08, 100.1, 100.12])
    at = 2 * BLOCK + 160
    assert not out[:at].any() and np.array_equal(out[at:at + 1000], x)
    assert v.first_dac == pytest.approx(100.05) and v.events == ["first_audio"]


def test_a_start_time_follows_the_dac_times_the_device_reports() -> None:
    # The device reports the second block later than the first one's length would make it
    # (it was slow to start): the start frame moves with it, it is not counted from the first.
    x = ramp_signal(500)
    m: Mixer[Recorded] = Mixer(1.0)
    m.rate, m.clock = RATE, Offset(0.0)
    m.current = v = timed(x, 10.05)
    out = play_at(m, [10.0, 10.03, 10.05, 10.07])
    at = BLOCK + 320  # 20 ms into the block reported at 10.03
    assert not out[:at].any() and np.array_equal(out[at:at + 500], x)
    assert v.first_dac == pytest.approx(10.05)


def test_a_start_time_already_past_starts_at_once_and_says_how_late() -> None:
    x = ramp_signal(500)
    m: Mixer[Recorded] = Mixer(1.0)
    m.rate, m.clock = RATE, Offset(0.0)
    m.current = v = timed(x, 9.9)
    out = play_at(m, [10.0, 10.02])
    assert np.array_equal(out[:500], x)
    assert v.first_dac == pytest.approx(10.0)  # 0.1 s late


def test_without_a_start_time_the_dac_times_change_nothing() -> None:
    x = ramp_signal(500)
    m: Mixer[Recorded] = Mixer(1.0)
    m.rate, m.clock = RATE, Offset(0.0)
    m.current = v = voice(x, lead_in_ms=10.0)
    out = play_at(m, [10.0, 10.02, 10.04])
    assert not out[:160].any() and np.array_equal(out[160:660], x)
    assert v.first_dac == pytest.approx(10.01)

"""The speaker's device clock with the stamps PortAudio gives the callback (plain numbers, no
PortAudio: tests/test_speaker_sync.py plays through ALSA)."""

from __future__ import annotations

import time

import pytest

import daemon.sinks.speaker.clock as clock_module
from daemon.sinks.speaker.clock import START_MARGIN, DeviceClock

RATE = 16000
BLOCK = 320  # 20 ms


class FakeClock:
    """The wall and monotonic clocks the device clock reads, moved only by the test: what it
    learns from two readings cannot then depend on how long the host paused between them."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.wall_offset = 1.8e9  # wall clock minus monotonic clock

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + self.wall_offset


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(clock_module, "time", fake)
    return fake


def test_a_device_that_reports_its_delay_is_taken_at_its_word() -> None:
    c = DeviceClock(0.1, RATE)
    now = time.monotonic()
    # A real device: each block 20 ms after the one before, the buffer (100 ms) ahead.
    got = [c.tick(now + 0.02 * k, now + 0.1 + 0.02 * k, BLOCK) for k in range(5)]
    assert got == pytest.approx([now + 0.1 + 0.02 * k for k in range(5)])
    # It fell behind (an underrun: it played silence meanwhile): later DAC times win.
    assert c.tick(now + 0.2, now + 0.35, BLOCK) == pytest.approx(now + 0.35)


def test_blocks_reported_at_the_same_time_are_played_one_after_the_other() -> None:
    # ALSA's file plugin in front of the null PCM: every host buffer is "at the DAC now",
    # though the one before it is still waiting to be written. A block can't be played
    # before the one before it: the timeline stays continuous.
    c = DeviceClock(0.1, RATE)
    now = time.monotonic()
    reports = [(now, now), (now, now + 0.02), (now + 0.001, now + 0.001),
               (now + 0.001, now + 0.021), (now + 0.08, now + 0.08)]
    got = [c.tick(cur, dac, BLOCK) for cur, dac in reports]
    assert got == pytest.approx([now, now + 0.02, now + 0.04, now + 0.06, now + 0.08])


def test_a_restarted_stream_starts_a_new_timeline() -> None:
    c = DeviceClock(0.1, RATE)
    now = time.monotonic()
    for _ in range(50):  # a second of audio handed over at once: a fast device
        c.tick(now, now, BLOCK)
    c.starting()
    assert c.tick(now + 0.01, now + 0.01, BLOCK) == pytest.approx(now + 0.01)


def test_wall_and_device_clocks_are_converted_both_ways(clock: FakeClock) -> None:
    c = DeviceClock(0.1, RATE)
    now = clock.monotonic()
    c.tick(now, now, BLOCK)
    assert c.offset == pytest.approx(clock.wall_offset)
    assert c.to_wall(c.to_device(1234.5)) == pytest.approx(1234.5)
    # A late sample (the callback ran 30 ms after the device's clock was read) doesn't move
    # the offset.
    offset = c.offset
    clock.now += 0.05
    c.tick(clock.now - 0.03, clock.now - 0.03, BLOCK)
    assert c.offset == pytest.approx(offset)


def test_without_stamps_the_monotonic_clock_and_the_latency_stand_in() -> None:
    c = DeviceClock(0.1, RATE)
    before = time.monotonic()
    dac = c.tick(0.0, 0.0, BLOCK)  # a host API that gives no times
    assert before + 0.1 <= dac <= time.monotonic() + 0.1


def test_it_learns_how_long_the_device_takes_to_start(clock: FakeClock) -> None:
    c = DeviceClock(0.2, RATE)
    start_at = clock.time() + 10
    assert c.wake_in(start_at) == pytest.approx(10 - 0.2 - START_MARGIN)
    for _ in range(20):  # the first blocks reach the DAC 50 ms after each start
        c.starting()
        now = clock.monotonic()
        c.tick(now, now + 0.05, BLOCK)
    # Learnt down slowly from the 0.2 s it assumed: within a millisecond by now.
    assert c.startup == pytest.approx(0.05, abs=0.001)
    assert c.wake_in(start_at, lead_in=0.3) == pytest.approx(
        10 - 0.3 - 0.05 - START_MARGIN, abs=0.001)
    c.starting()  # one slow start: taken at once
    now = clock.monotonic()
    c.tick(now, now + 0.4, BLOCK)
    assert c.startup == pytest.approx(0.4)

"""tts.threads: the intra-op threads wait briefly while other processes use the cores, and
spin long on free ones. Plain numbers and fake CPU counters stand in for the machine; no
timing is measured here."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from tts.threads import CpuSample, OthersLoad, ShortWaits, ThreadGovernor, short_waits


@pytest.mark.parametrize(("others", "now", "expected"), [
    (0.0, False, False),   # idle machine: spin long, the fastest there
    (0.2, False, False),   # a little background work is tolerated
    (0.5, False, True),    # half a core taken: a spinning thread would burn its partner's slice
    (1.0, False, True),    # one busy process on two cores
    (0.15, True, True),    # once short, they stay short until the others are nearly gone ...
    (0.05, True, False),   # ... so that a load around one value does not flap
])
def test_short_waits(others: float, now: bool, expected: bool) -> None:
    assert short_waits(others, now) is expected


class FakeCpu:
    """Counters advanced by hand: wall seconds, everyone's CPU seconds, ours."""

    def __init__(self) -> None:
        self.now = CpuSample(0.0, 0.0, 0.0)

    def advance(self, wall: float, others: float, ours: float) -> None:
        n = self.now
        self.now = CpuSample(n.wall + wall, n.busy + (others + ours) * wall, n.ours + ours * wall)

    def read(self) -> CpuSample:
        return self.now


def test_others_load_counts_what_other_processes_used_not_ours() -> None:
    cpu = FakeCpu()
    load = OthersLoad(cpu.read, smoothing=0.5)
    cpu.advance(5.0, others=1.0, ours=2.0)  # a long span: the average is that span's
    assert load.update() == pytest.approx(1.0, abs=1e-3)
    cpu.advance(5.0, others=0.0, ours=1.0)
    assert load.update() == pytest.approx(0.0, abs=1e-3)


def test_others_load_follows_a_change_over_its_smoothing_time() -> None:
    cpu = FakeCpu()
    load = OthersLoad(cpu.read, smoothing=0.5)
    seen = []
    for _ in range(10):
        cpu.advance(0.1, others=1.0, ours=1.0)
        seen.append(load.update())
    assert seen == sorted(seen)  # rises steadily ...
    assert 0.1 < seen[0] < 0.3 and seen[-1] > 0.8  # ... over about half a second


def test_others_load_adds_too_short_intervals_to_the_next() -> None:
    cpu = FakeCpu()
    load = OthersLoad(cpu.read, smoothing=0.5)
    cpu.advance(0.01, others=2.0, ours=0.0)
    assert load.update() == 0.0  # 10 ms of clock ticks say nothing yet
    cpu.advance(5.0, others=1.0, ours=0.0)
    assert load.update() == pytest.approx((0.02 + 5.0) / 5.01, abs=1e-3)


class StillLoad(OthersLoad):
    def __init__(self, cores: float) -> None:
        self.cores = cores

    def update(self) -> float:
        return self.cores


class Waits(ShortWaits):
    """Records what it was set to instead of starting a thread."""

    def __init__(self) -> None:
        self.seen: list[bool] = []
        self._on = False

    @property
    def on(self) -> bool:
        return self._on

    def set(self, on: bool) -> None:
        self._on = on
        self.seen.append(on)


def computed(governor: ThreadGovernor, loads: list[float], load: StillLoad
             ) -> list[int]:
    """torch's thread count as each chunk is computed; each chunk sets the load the next
    one finds."""

    def chunks() -> Iterator[int]:
        for cores in loads:
            threads = torch.get_num_threads()
            load.cores = cores
            yield threads

    return list(governor.govern(chunks()))


def test_the_governor_sets_the_threads_on_the_thread_computing_the_chunk() -> None:
    load = StillLoad(0.0)
    governor = ThreadGovernor(2, load, Waits())
    torch.set_num_threads(1)
    out: list[int] = []
    worker = threading.Thread(target=lambda: out.extend(computed(governor, [0.0] * 2, load)))
    worker.start()
    worker.join()
    assert out == [2, 2]
    assert computed(ThreadGovernor(1, load, Waits()), [0.0], load) == [1]


def test_the_waits_follow_the_load_from_one_chunk_to_the_next() -> None:
    load, waits = StillLoad(0.0), Waits()
    computed(ThreadGovernor(2, load, waits), [0.0, 1.0, 1.0, 0.0, 0.0], load)
    assert waits.seen == [False, False, True, True, False, False]  # the last: at the end


def test_one_thread_leaves_the_waits_alone() -> None:
    load, waits = StillLoad(1.0), Waits()
    computed(ThreadGovernor(1, load, waits), [1.0, 1.0], load)
    assert waits.seen == []


def test_short_waits_hold_a_team_on_a_thread_of_their_own_until_set_off() -> None:
    waits = ShortWaits(2)
    waits.set(True)
    try:
        holders = [t for t in threading.enumerate() if t.name == "herald-short-waits"]
        assert waits.on and len(holders) == 1
    finally:
        waits.set(False)
    holders[0].join(5)
    assert not waits.on and not holders[0].is_alive()

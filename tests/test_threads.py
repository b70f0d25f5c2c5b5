"""tts.threads: a thread that runs torch computes on itself alone, with subnormal floats
flushed to zero; the settings are the thread's own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

from tts.threads import cores, default_threads, intra_op, intra_op_available, prepare_thread

T = TypeVar("T")

SUBNORMAL = 1e-39  # below float32's smallest normal (1.18e-38)


def on_a_new_thread(prepare: bool) -> tuple[int, float]:
    """(intra-op threads, a subnormal times one) as a fresh thread sees them."""
    seen: list[tuple[int, float]] = []

    def run() -> None:
        torch.set_num_threads(2)  # as a thread may have it before herald prepares it
        if prepare:
            prepare_thread()
        product = torch.tensor([SUBNORMAL], dtype=torch.float32) * 1.0
        seen.append((torch.get_num_threads(), float(product[0])))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen[0]


def test_a_prepared_thread_computes_alone_and_flushes_subnormals() -> None:
    if not torch.set_flush_denormal(True):  # pragma: no cover - a CPU without the flag
        pytest.skip("this CPU cannot flush subnormals")
    torch.set_flush_denormal(False)  # this thread as the others find theirs
    assert on_a_new_thread(prepare=True) == (1, 0.0)


def test_the_settings_belong_to_the_thread() -> None:
    """An unprepared thread keeps torch's own settings: subnormals stay, and its thread
    count is its own (which is why every worker and helper prepares itself)."""
    torch.set_flush_denormal(False)
    threads, product = on_a_new_thread(prepare=False)
    assert product == pytest.approx(SUBNORMAL, rel=1e-3)
    assert threads == 2


def test_one_synthesis_uses_the_cores_up_to_four() -> None:
    assert default_threads() == max(1, min(4, cores()))


def _in_a_thread(fn: Callable[[], T]) -> T:
    got: list[T] = []
    thread = threading.Thread(target=lambda: got.append(fn()))
    thread.start()
    thread.join()
    return got[0]


@pytest.mark.skipif(not intra_op_available(),
                    reason="this torch build has no GNU OpenMP and MKL to set per thread")
def test_intra_op_threads_are_the_calling_threads_alone_and_given_back() -> None:
    """A synthesis on intra-op threads must not spread a worker beside it over the cores:
    ``torch.set_num_threads`` would (MKL's count is the process's)."""
    def run() -> tuple[int, int, int, bool]:
        prepare_thread()
        with intra_op(2) as used:
            inside = torch.get_num_threads()
            beside = _in_a_thread(lambda: (prepare_thread(), torch.get_num_threads())[1])
        return inside, beside, torch.get_num_threads(), used

    def one() -> bool:
        prepare_thread()
        with intra_op(1) as used:
            return used

    assert _in_a_thread(run) == (2, 1, 1, True)
    assert _in_a_thread(one) is False  # one thread: nothing to set


@pytest.mark.skipif(not intra_op_available(),
                    reason="this torch build has no GNU OpenMP and MKL to set per thread")
def test_intra_op_threads_flush_subnormals_like_the_thread_they_serve() -> None:
    """The OpenMP team of a thread is made by the runtime and kept: one made before the
    thread flushed subnormals (as a library may make it) does not flush them, and half of a
    quiet passage would then run at the speed of subnormals."""
    def run() -> int:
        torch.set_flush_denormal(False)
        torch.set_num_threads(2)
        values = torch.full((1 << 20,), SUBNORMAL)
        assert int((values * 1.0).count_nonzero()) > 0  # the team made, not flushing
        torch.set_num_threads(1)
        prepare_thread()
        with intra_op(2):
            return int((values * 1.0).count_nonzero())

    if not torch.set_flush_denormal(True):  # pragma: no cover - a CPU without the flag
        pytest.skip("this CPU cannot flush subnormals")
    assert _in_a_thread(run) == 0

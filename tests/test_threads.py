"""tts.threads: a thread that runs torch computes on itself alone, with subnormal floats
flushed to zero; the settings are the thread's own."""

from __future__ import annotations

import threading

import pytest
import torch

from tts.threads import cores, default_threads, prepare_thread

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

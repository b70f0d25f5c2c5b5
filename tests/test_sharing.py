"""The text encoder shared with a second thread (``tts.sharing``): the phases' rules (every
task once, a phase only after the one before, failures raised), a task begun there while the
caller goes on, the encoder's result and a long sentence's prior independent of who ran
which part, and the lanes lending the thread only to a sentence begun with nothing at the
helpers."""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import pytest
import torch
from busy_process import busy_process
from fresh_python import run_python
from inline_helpers import Inline
from sentences import LONG_SENTENCE
from waiting import until_now

import tts.lanes as lanes_module
import tts.sharing as sharing_module
import tts.vits.enc_p as enc_p_module
from tts import SynthesisOptions
from tts.sharing import Phases, SharingThread, in_order, sharing_thread
from tts.vits.enc_p import SHARED_IDS, column_blocks


@pytest.fixture(autouse=True)
def _a_free_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """Share as on an idle machine, whatever else runs beside the tests: the rules of
    sharing are what is tested here (``test_a_busy_machine_shares_nothing`` has the
    other side). The lanes ask too, through their own name for it."""
    monkeypatch.setattr(sharing_module, "core_free", lambda: True)
    monkeypatch.setattr(lanes_module, "core_free", lambda: True)


def _phases(log: list[tuple[int, int, str]], phases: int, tasks: int,
            seconds: float) -> list[list[Callable[[], None]]]:
    def task(k: int, i: int) -> None:
        time.sleep(seconds)  # sleeping lets the other thread take its share
        log.append((k, i, threading.current_thread().name))

    return [[partial(task, k, i) for i in range(tasks)] for k in range(phases)]


def _meeting(log: list[tuple[int, int, str]]) -> list[Callable[[], None]]:
    """A phase (logged as -1) of two tasks that wait for each other: one thread cannot run
    both, so the second thread takes part however late the host schedules it."""
    arrived = [threading.Event(), threading.Event()]

    def task(i: int) -> None:
        arrived[i].set()
        assert arrived[1 - i].wait(60), "the other thread never took a task"
        log.append((-1, i, threading.current_thread().name))

    return [partial(task, 0), partial(task, 1)]


def test_every_task_runs_once_and_a_phase_only_after_the_one_before() -> None:
    sharing = SharingThread()
    log: list[tuple[int, int, str]] = []
    sharing.run([_meeting(log), *_phases(log, 6, 2, 0.01)])
    assert sorted((k, i) for k, i, _ in log) == [(k, i) for k in range(-1, 6) for i in range(2)]
    assert [k for k, _, _ in log] == sorted(k for k, _, _ in log)  # phase by phase
    by = {name for _, _, name in log}
    assert by == {threading.current_thread().name, "herald-sharing"}
    assert sharing.shared == sum(1 for _, _, name in log if name == "herald-sharing")


def test_a_failing_task_is_raised_and_the_thread_serves_the_next_call() -> None:
    sharing = SharingThread()
    for fail_in in (0, 1):  # the calling thread takes task 0 first, the second thread task 1
        log: list[tuple[int, int, str]] = []
        phases = _phases(log, 3, 2, 0.02)

        def broken() -> None:
            time.sleep(0.02)
            raise ValueError("broken task")

        phases[1][fail_in] = broken
        with pytest.raises(ValueError, match="broken task"):
            sharing.run(phases)
        assert all(k <= 1 for k, _, _ in log)  # nothing after the failed phase began
        log.clear()
        sharing.run(_phases(log, 2, 2, 0.0))
        assert len(log) == 4


def test_a_call_that_finds_no_core_free_runs_on_its_own_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    readings: list[bool] = []
    monkeypatch.setattr(sharing_module, "core_free", lambda: readings.append(False) or False)
    sharing = SharingThread()
    log: list[tuple[int, int, str]] = []
    sharing.run(_phases(log, 4, 2, 0.001))
    assert readings == [False]
    assert {name for _, _, name in log} == {threading.current_thread().name}
    assert len(log) == 8 and sharing.shared == 0


def _in_use(sharing: SharingThread) -> threading.Thread:
    """Another thread's call, running on ``sharing`` for 0.2 s from the return on."""
    started = threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.2)

    other = threading.Thread(target=lambda: sharing.run([[slow]]), name="other")
    other.start()
    started.wait()
    return other


def test_a_call_while_the_thread_is_in_use_runs_on_its_own_thread() -> None:
    sharing = SharingThread()
    inner: list[tuple[int, int, str]] = []
    outer: list[tuple[int, int, str]] = []
    other = _in_use(sharing)
    sharing.run(_phases(inner, 2, 2, 0.0))
    other.join()
    assert {name for _, _, name in inner} == {threading.current_thread().name}
    sharing.run([_meeting(outer), *_phases(outer, 2, 2, 0.05)])
    assert "herald-sharing" in {name for _, _, name in outer}


def test_a_begun_task_runs_on_the_second_thread_while_the_caller_goes_on() -> None:
    sharing = SharingThread()
    started, go_on = threading.Event(), threading.Event()
    ran: list[str] = []

    def task() -> None:
        started.set()
        assert go_on.wait(60), "the caller never went on"
        ran.append(threading.current_thread().name)

    wait = sharing.begin(task)
    # The task waits for the caller: had begin run it here, this would never be reached.
    assert started.wait(60), "the second thread never took the task"
    go_on.set()
    wait()
    assert ran == ["herald-sharing"] and sharing.shared == 1


def test_a_begun_task_the_thread_cannot_take_is_run_by_the_wait() -> None:
    sharing = SharingThread()
    ran: list[str] = []
    other = _in_use(sharing)
    wait = sharing.begin(lambda: ran.append(threading.current_thread().name))
    assert ran == []  # nothing began: the thread is in use
    wait()
    other.join()
    assert ran == [threading.current_thread().name]


def test_a_begun_task_that_fails_raises_in_the_wait_and_frees_the_thread() -> None:
    sharing = SharingThread()
    started = threading.Event()

    def broken() -> None:
        started.set()
        raise ValueError("broken task")

    wait = sharing.begin(broken)
    assert started.wait(60)
    with pytest.raises(ValueError, match="broken task"):
        wait()
    log: list[tuple[int, int, str]] = []
    sharing.run([_meeting(log)])  # needs the second thread: it is free again
    assert "herald-sharing" in {name for _, _, name in log}


def test_a_begun_task_nobody_waits_for_frees_the_thread_when_it_ends() -> None:
    """A synthesis abandoned after its first window never takes the part begun for it."""
    sharing = SharingThread()
    done = threading.Event()
    sharing.begin(done.set)
    assert done.wait(60)
    log: list[tuple[int, int, str]] = []
    sharing.run([_meeting(log)])  # the second thread must take part: it was let go
    assert "herald-sharing" in {name for _, _, name in log}


def test_the_interpreter_exits_cleanly_while_a_begun_task_runs() -> None:
    """A daemon thread inside a torch operation when the interpreter finalizes aborts the
    process ("terminate called without an active exception"): herald stopped right after
    a client hung up would die with a core dump instead of exiting."""
    code = (
        "import threading, time, torch\n"
        "import tts.sharing as sharing\n"
        "sharing.core_free = lambda: True\n"
        "running, leaving = threading.Event(), threading.Event()\n"
        "def task():\n"
        "    x = torch.ones(64)\n"
        "    running.set()\n"
        "    while not leaving.is_set():\n"
        "        x = x + 1  # each operation lets go of the interpreter's lock\n"
        "    until = time.monotonic() + 0.5  # on into the interpreter's exit\n"
        "    while time.monotonic() < until:\n"
        "        x = x + 1\n"
        "    print('task ended', flush=True)\n"
        "sharing.SharingThread().begin(task)\n"
        "assert running.wait(60), 'the second thread never took the task'\n"
        "print('exiting', flush=True)\n"
        "leaving.set()\n")
    assert run_python(code).stdout.split() == ["exiting", "task", "ended"]  # the exit waited for it


def test_a_long_sentences_next_prior_part_begun_elsewhere_is_the_same(synth) -> None:  # type: ignore[no-untyped-def]
    """Begun on the second thread while the first window would be decoded, the rest of the
    prior draws its noise in the same order: the parts are those computed in turn."""
    ids = torch.tensor([synth.sentences(LONG_SENTENCE)[0]])
    sharing = SharingThread()
    begun: list[str] = []

    def begin(task: Callable[[], None]) -> Callable[[], None]:
        def named() -> None:
            begun.append(threading.current_thread().name)
            task()
        return sharing.begin(named)

    def parts(ahead: bool) -> list[torch.Tensor]:
        with torch.inference_mode():
            prior = synth.model.prior_parts(ids, None, 0.667, 1.0, 0.8,
                                            torch.Generator().manual_seed(3))
            out = [next(prior)]
            if ahead:
                prior.begin_next(begin)
            return out + list(prior)

    plain, ahead = parts(False), parts(True)
    assert len(plain) == len(ahead) == 2  # a head and the rest
    assert all(torch.equal(a, b) for a, b in zip(plain, ahead))
    assert len(begun) == 1


def test_the_blocks_depend_on_the_length_alone() -> None:
    assert column_blocks(192, SHARED_IDS - 1) == [slice(None)]
    assert column_blocks(192, SHARED_IDS) == [slice(0, 96), slice(96, 192)]
    assert column_blocks(768, 399) == [slice(0, 384), slice(384, 768)]
    assert column_blocks(5, 399) == [slice(0, 3), slice(3, 5)]


def test_the_encoder_gives_the_same_rows_whoever_runs_its_blocks(synth) -> None:  # type: ignore[no-untyped-def]
    ids = torch.tensor(synth.sentences(LONG_SENTENCE)[0])
    assert len(column_blocks(192, len(ids))) == 2
    sharing = SharingThread()
    runs, give_up = 0, time.monotonic() + 60  # until the second thread ran a block
    with torch.inference_mode():
        alone = synth.model.enc_p(ids)
        while runs < 3 or (sharing.shared == 0 and time.monotonic() < give_up):
            shared = synth.model.enc_p(ids, sharing.run)
            runs += 1
            for a, b in zip(alone, shared):
                assert torch.equal(a, b)
    assert sharing.shared > 0  # the second thread did run blocks


def test_the_encoder_cut_by_columns_computes_it_whole(synth,  # type: ignore[no-untyped-def]
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut into a head a task and halves of the products' columns, the encoder computes what
    it does whole (another grouping of the same sums)."""
    ids = torch.tensor(synth.sentences(LONG_SENTENCE)[0])
    with torch.inference_mode():
        cut = synth.model.enc_p(ids)
        monkeypatch.setattr(enc_p_module, "SHARED_IDS", len(ids) + 1)
        assert column_blocks(192, len(ids)) == [slice(None)]
        whole = synth.model.enc_p(ids)
    for a, b in zip(cut, whole):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_lanes_lend_the_thread_to_a_sentence_begun_with_nothing_at_the_helpers(  # type: ignore[no-untyped-def]
        synth, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = SynthesisOptions(seed=7)
    text = LONG_SENTENCE + " " + LONG_SENTENCE
    sharing = sharing_thread()
    lent: list[int] = []  # the phases of each encoder run the lanes lent the thread to

    begun: list[int] = []  # the prior parts begun on it

    class Counted:
        def run(self, phases: Phases) -> None:
            lent.append(len(phases))
            sharing.run(phases)

        def begin(self, task: Callable[[], None]) -> Callable[[], None]:
            begun.append(1)
            return sharing.begin(task)

    monkeypatch.setattr(lanes_module, "sharing_thread", Counted)

    def audio(lanes: int | None) -> tuple[np.ndarray, list[int], int]:
        lent.clear()
        begun.clear()
        helpers = None if lanes is None else Inline(lanes)
        chunks = [c.samples for c in synth.stream(text, opts, helpers=helpers)]
        return np.concatenate(chunks), list(lent), len(begun)

    plain, none_lent, none_begun = audio(None)
    one_lane, one_lent, one_begun = audio(1)
    helped, two_lent, two_begun = audio(2)
    assert none_lent == one_lent == [] and none_begun == one_begun == 0
    # The rest of its prior too, while its first window is decoded.
    assert two_begun == 1
    # The first sentence's encoder only (all its phases, four a layer); the second is
    # handed out while a helper decodes. That the second thread then takes blocks is the
    # encoder test's.
    assert two_lent == [4 * len(synth.model.enc_p.encoder.attn_layers)]
    # Windows follow the clock, so these join within float rounding, not bit for bit; the
    # encoder's rows are the same bit for bit (above), so every duration is too.
    assert len(plain) == len(one_lane) == len(helped)
    assert np.abs(one_lane - plain).max() < 1e-4 and np.abs(helped - plain).max() < 1e-4
    assert np.abs(plain).max() > 0.1


def test_a_synthesis_leaves_no_tensor_to_the_cyclic_collector(synth) -> None:  # type: ignore[no-untyped-def]
    """Tensors in a reference cycle live until the collector next runs: a long sentence's
    prior and decoding state held that way kept the process tens of megabytes larger
    after it spoke."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for helpers in (None, Inline(2)):
            for _ in synth.stream(LONG_SENTENCE, SynthesisOptions(seed=1), helpers=helpers):
                pass
        # Abandoned after its first chunk, with the rest of its prior begun meanwhile.
        abandoned = synth.stream(LONG_SENTENCE, SynthesisOptions(seed=1), helpers=Inline(2))
        next(abandoned)
        abandoned.close()
        del abandoned
        gc.collect()
        tensors = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not tensors, [tuple(t.shape) for t in tensors[:5]]


def test_in_order_runs_everything_on_the_calling_thread() -> None:
    log: list[tuple[int, int, str]] = []
    in_order(_phases(log, 2, 3, 0.0))
    assert [(k, i) for k, i, _ in log] == [(k, i) for k in range(2) for i in range(3)]
    assert {name for _, _, name in log} == {threading.current_thread().name}


def test_a_busy_machine_shares_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that keeps a core busy is runnable all the time and, once it has used CPU
    time for a while, no core is free beside it, however idle the rest of the machine is."""
    monkeypatch.undo()
    with busy_process():
        # until it has used CPU time (``tts.neighbours``)
        until_now(lambda: not sharing_module.core_free(), "no core free beside it")
        sharing = SharingThread()
        log: list[tuple[int, int, str]] = []
        sharing.run(_phases(log, 3, 2, 0.01))
        assert {name for _, _, name in log} == {threading.current_thread().name}
        assert sharing.shared == 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to keep apart")
@pytest.mark.skipif(not sharing_module._set_affinity(0, os.sched_getaffinity(0)),
                    reason="sched_setaffinity refused here")
def test_the_two_threads_run_on_separate_cores_and_the_caller_gets_its_affinity_back() -> None:
    sharing = SharingThread()
    before = os.sched_getaffinity(0)
    getcpu = ctypes.CDLL(None).sched_getcpu
    seen: dict[str, set[int]] = {}

    def task() -> None:
        for _ in range(20):
            time.sleep(0.001)  # each wake could land the thread on another core
            seen.setdefault(threading.current_thread().name, set()).add(getcpu())

    def meet_then_task(meet: Callable[[], None]) -> None:
        meet()
        task()

    for _ in range(3):
        seen.clear()
        # Both threads meet in the first phase and record their cores there, so each run
        # has something of the second thread's to compare.
        sharing.run([[partial(meet_then_task, meet) for meet in _meeting([])],
                     *([task, task] for _ in range(4))])
        assert os.sched_getaffinity(0) == before
        mine, second = seen[threading.current_thread().name], seen["herald-sharing"]
        assert len(mine) == 1 and not mine & second, seen
    assert sharing.shared > 0

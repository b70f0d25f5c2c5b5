"""daemon.synthesis.helpers: real helper processes, forked from this one, decode pieces of the
sentences; the audio is the same as the playing lane's alone, a helper that dies leaves it
whole, and a helper keeps nothing of herald's but its connection."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from audio_checks import assert_pcm_close, assert_speech, pcm16
from sentences import LONG_SENTENCE

import tts.lanes as lanes_module
from daemon.synthesis import deadlines, workers
from daemon.synthesis.engine import Engine, EngineSettings
from daemon.synthesis.helpers import WINDOW, HelperPool, Lent
from tts import SynthesisOptions, to_pcm16
from tts.pieces import Helping, PieceJob
from tts.threads import intra_op_available

PARAGRAPH = ("The kitchen lights are on. The front door is locked. It will rain after six. "
             "Your parcel arrives tomorrow morning.")


def spoken(synth, text: str, helpers: HelperPool | None, seed: int = 4) -> bytes:  # type: ignore[no-untyped-def]
    return b"".join(to_pcm16(c.samples)
                    for c in synth.stream(text, SynthesisOptions(seed=seed), helpers))


@pytest.fixture
def pool(catalog, synth):  # type: ignore[no-untyped-def]
    """One helper, forked once the voice is loaded (as herald forks them)."""
    helpers = HelperPool(catalog, 1)
    assert helpers.lanes == 2
    yield helpers
    helpers.close()


@pytest.mark.parametrize("text", [LONG_SENTENCE, PARAGRAPH])
def test_pieces_decoded_by_a_helper_process_are_the_same_audio(synth, pool, text: str) -> None:  # type: ignore[no-untyped-def]
    alone = spoken(synth, text, None)
    shared = spoken(synth, text, pool)
    assert pool.decoded >= 1  # the helper made some of it
    assert_pcm_close(shared, alone)
    assert_speech(pcm16(shared), synth.sample_rate, min_seconds=5)


def test_a_short_command_made_whole_reaches_the_helper_through_the_flow(  # type: ignore[no-untyped-def]
        synth, pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Audio nobody plays before it is all made (an HTTP WAV): beside a busy process, the
    short command's flow runs once, here, and the helper process gets the frames after it,
    generator only; with the helper's core free, the command is made here on two intra-op
    threads and the helper gets nothing. The audio is the playing lane's alone."""
    text = "Turn on the kitchen lights."
    handed: list[PieceJob] = []
    decode = pool.decode

    def recorded(model, job: PieceJob) -> Helping:  # type: ignore[no-untyped-def]
        handed.append(job)
        return decode(model, job)

    monkeypatch.setattr(pool, "decode", recorded)

    def made(helpers: HelperPool | None) -> bytes:
        return b"".join(to_pcm16(c.samples) for c in synth.stream(
            text, SynthesisOptions(seed=4), helpers, whole=True))

    alone = made(None)
    monkeypatch.setattr(lanes_module, "core_free", lambda: False)
    shared = made(pool)
    assert [job.flowed for job in handed] == [True]
    assert pool.decoded == 1
    assert_pcm_close(shared, alone)
    assert_speech(pcm16(shared), synth.sample_rate, min_seconds=1)
    if intra_op_available():
        monkeypatch.setattr(lanes_module, "core_free", lambda: True)
        threaded = made(pool)
        assert len(handed) == 1 and pool.decoded == 1  # nothing more went to the helper
        assert_pcm_close(threaded, alone)


def test_a_helper_killed_midway_leaves_the_audio_whole(synth, pool, caplog) -> None:  # type: ignore[no-untyped-def]
    """The helper is killed as soon as the first audio is out, while it holds pieces of the
    first sentence and the next ones: the playing lane decodes them itself, from where the
    helper had got, and later syntheses use one core."""
    alone = spoken(synth, PARAGRAPH, None)
    chunks = synth.stream(PARAGRAPH, SynthesisOptions(seed=4), pool)
    with caplog.at_level(logging.WARNING, logger="daemon.synthesis.helpers"):
        first = next(chunks)
        os.kill(pool.pids[0], signal.SIGKILL)
        rest = [c.samples for c in chunks]
        deadline = time.monotonic() + 5
        while pool.lanes > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert_pcm_close(to_pcm16(first.samples) + b"".join(to_pcm16(s) for s in rest), alone)
    assert pool.lanes == 1
    assert "decoded by the lanes that play them" in caplog.text
    assert_pcm_close(spoken(synth, PARAGRAPH, pool), alone)  # no helper left: all here


def test_a_helper_keeps_no_descriptor_of_herald(synth, pool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Whatever herald had open when it forked (here a file this test opens first) is not
    the helper's: only standard input, output, error and its connection. The descriptors
    are read once the helper has decoded a piece, so after it has dropped what it must not
    keep (right after the fork it still holds everything)."""
    with open(tmp_path / "held", "w"):
        fresh = HelperPool(pool.catalog, 1)
        try:
            spoken(synth, LONG_SENTENCE, fresh)
            assert fresh.decoded >= 1
            pid = fresh.pids[0]
            fds = os.listdir(f"/proc/{pid}/fd")
        finally:
            fresh.close()
    assert sorted(int(fd) for fd in fds if int(fd) > 2) == [max(int(fd) for fd in fds)]
    assert len(fds) == 4


def test_handing_pieces_to_a_busy_helper_does_not_wait_for_it(synth, pool) -> None:  # type: ignore[no-untyped-def]
    """A helper reads its messages only between pieces. Pieces handed to it meanwhile, more
    than its connection's buffer holds (here the helper is stopped outright), must not hold
    the lane that hands them out; once the helper goes on, it decodes every one of them,
    the same audio as the lane would."""
    model = synth.model
    torch.manual_seed(3)
    jobs = [PieceJob(torch.randn(1, model.config.inter_channels, 400), 0, None, None, 1.0)
            for _ in range(4)]  # 300 KB of frames each
    pid = pool.pids[0]
    handed: list[Helping] = []
    os.kill(pid, signal.SIGSTOP)
    try:
        hand_out = threading.Thread(
            target=lambda: handed.extend(pool.decode(model, job) for job in jobs), daemon=True)
        hand_out.start()
        hand_out.join(timeout=30)
        held = hand_out.is_alive()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert not held, "handing pieces to a helper busy elsewhere waited for it to read them"
    for job, helping in zip(jobs, handed, strict=True):
        got = []
        while not got or not got[-1][1]:
            got += helping.take(wait=True)
        here = np.concatenate([samples for samples, _ in job.decode(model, WINDOW)])
        assert np.abs(np.concatenate([samples for samples, _ in got]) - here).max() < 1e-6
    assert pool.decoded == len(jobs)


def test_a_synthesis_lent_no_lanes_hands_nothing_out(synth, pool) -> None:  # type: ignore[no-untyped-def]
    """Lent beside other syntheses: every piece is decoded by the playing lane."""
    beside_others = Lent(pool, alone=lambda: False)
    assert beside_others.lanes == 1
    # (windows follow the pace of the moment, so equal to within rounding, not bit for bit)
    assert_pcm_close(spoken(synth, PARAGRAPH, beside_others), spoken(synth, PARAGRAPH, None))
    assert pool.handed == 0 and pool.decoded == 0


def test_lanes_lent_midway_are_used_from_then_on(synth, pool) -> None:  # type: ignore[no-untyped-def]
    """The others end while a synthesis runs: its later sentences go to the helpers, and
    the audio is still the same."""
    others = [True]
    lent = Lent(pool, alone=lambda: not others[0])
    chunks = synth.stream(PARAGRAPH, SynthesisOptions(seed=4), lent)
    audio = [to_pcm16(next(chunks).samples)]
    assert pool.handed == 0
    others[0] = False
    audio += [to_pcm16(c.samples) for c in chunks]
    assert pool.handed >= 1
    assert_pcm_close(b"".join(audio), spoken(synth, PARAGRAPH, None))


async def test_beside_another_synthesis_the_engine_hands_nothing_out(  # type: ignore[no-untyped-def]
        catalog, synth, monkeypatch: pytest.MonkeyPatch) -> None:
    """A synthesis waiting on a helper holds the worker that every other synthesis needs,
    so helpers go only to a synthesis that runs alone (``daemon.synthesis.helpers.Lent``).

    The second stream must run beside the first, which is left open and unread. Admission
    (``deadlines.admitted``, tested with given needs in test_deadlines) would keep it waiting
    for the first to end wherever the first's measured need is high, as on a loaded host:
    here every stream is admitted, so the verdict is the lending rule's alone."""
    monkeypatch.setattr(workers, "admitted", lambda *_args, **_kw: True)
    monkeypatch.setattr(deadlines, "admitted", lambda *_args, **_kw: True)
    engine = Engine(catalog, EngineSettings(threads=2, workers=1, queue_chunks=1))
    engine.start_helpers()
    try:
        first = engine.stream(LONG_SENTENCE, options=SynthesisOptions(seed=4))
        async for _ in first:  # alone: once its first window is out, the rest is shared
            if engine.pieces_handed:
                break
        assert engine.pieces_handed == 1  # one sentence, one piece for the one helper
        beside = b"".join([to_pcm16(c.samples) async for c in engine.stream(
            LONG_SENTENCE, options=SynthesisOptions(seed=5))])  # while the first is open
        assert engine.pieces_handed == 1
        assert_pcm_close(beside, spoken(synth, LONG_SENTENCE, None, seed=5))
        await first.aclose()
        async for _ in engine.stream(LONG_SENTENCE, options=SynthesisOptions(seed=6)):
            pass
        assert engine.pieces_handed == 2  # alone again: shared again
    finally:
        engine.close()


def test_closing_ends_the_helpers(catalog, synth) -> None:  # type: ignore[no-untyped-def]
    helpers = HelperPool(catalog, 2)
    pids = helpers.pids
    assert len(pids) == 2 and helpers.lanes == 3
    helpers.close()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"helper {pid} is still there"

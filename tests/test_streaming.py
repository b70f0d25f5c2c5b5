"""Streamed audio equals one-shot audio: for every voice variant, and for the real voice
with sampling noise on (same seed)."""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from audio_checks import assert_speech
from inline_helpers import Done, Inline
from sentences import LONG_SENTENCE
from synthetic_voice import VARIANTS, random_model

import tts.lanes as lanes_module
import tts.pieces as pieces_module
import tts.sharing as sharing_module
import tts.threads as threads_module
from tts import SynthesisOptions
from tts.lanes import SHORT_CONTEXTS, Prior, decode_sentences
from tts.pace import CROWDED, Pace, next_end
from tts.pieces import HelperFailed, Helping, Latents, PieceJob
from tts.sharing import Phases, in_order
from tts.stream import MIN_PIECE, decode_windows
from tts.vits import Vits, nhwc
from tts.vits.model import PriorParts


class NotBegun(Done):
    def claim(self) -> bool:
        return True

    def queued(self) -> bool:
        return True


class Never(Inline):
    """Helpers that never begin what they are handed: the playing lane does it all."""

    def decode(self, model: Vits, job: PieceJob) -> Helping:
        self.handed.append(job)
        return NotBegun([])


class Queued:
    """A piece waiting for, or on, the helper thread."""

    def __init__(self, model: Vits, job: PieceJob) -> None:
        self.model, self.job = model, job
        self.lock = threading.Condition()
        self.begun = self.claimed = False
        self.audio: list[tuple[np.ndarray, bool]] = []

    def claim(self) -> bool:
        with self.lock:
            self.claimed = not self.begun
            return self.claimed

    def queued(self) -> bool:
        return not self.begun

    def take(self, wait: bool) -> list[tuple[np.ndarray, bool]]:
        with self.lock:
            while wait and not self.audio:
                self.lock.wait()
            got, self.audio = self.audio, []
            return got

    def cancel(self) -> None:
        with self.lock:
            self.claimed = True

    def run(self) -> None:
        with self.lock:
            if self.claimed:
                return
            self.begun = True
        for item in self.job.decode(self.model, 32):
            with self.lock:
                self.audio.append(item)
                self.lock.notify_all()


class Threaded(Inline):
    """A real helper thread, decoding the pieces handed to it in turn."""

    def __init__(self, lanes: int) -> None:
        super().__init__(lanes)
        self.jobs: queue.Queue[Queued | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def decode(self, model: Vits, job: PieceJob) -> Helping:
        self.handed.append(job)
        queued = Queued(model, job)
        self.jobs.put(queued)
        return queued

    def _run(self) -> None:
        torch.set_num_threads(1)
        while (job := self.jobs.get()) is not None:
            job.run()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


def _each_sentence_is_one_shot(model: Vits, zs: list[torch.Tensor],
                               chunks: list[tuple[np.ndarray, int, bool]]) -> None:
    """The chunks of each sentence join into the one-shot audio of its prior."""
    with torch.inference_mode():
        for k, z in enumerate(zs):
            got = np.concatenate([c for c, s, _ in chunks if s == k])
            assert np.abs(got - model.decode(z, None)[0, 0].numpy()).max() < 1e-4, k


def one_shot_audio(model: Vits, z_p: torch.Tensor, g: torch.Tensor | None = None) -> np.ndarray:
    """``model.decode`` of a prior, clipped as the streamed chunks are: what they must join
    into."""
    with torch.inference_mode():
        audio: np.ndarray = np.clip(model.decode(z_p, g)[0, 0].numpy(), -1, 1)
    return audio


HELPERS = {"none": lambda: None, "never": lambda: Never(2), "inline": lambda: Inline(3),
           "threaded": lambda: Threaded(2)}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("frames", [5, 37, 300])
@pytest.mark.parametrize("helping", sorted(HELPERS))
def test_windows_equal_one_shot(variant: str, frames: int, helping: str) -> None:
    """Whoever decodes the pieces (nobody but the playing lane, helpers that never come,
    helpers that do it all at once, a helper thread beside it), the chunks join into the
    one-shot audio."""
    model = random_model(VARIANTS[variant])
    torch.manual_seed(1)
    z_p = torch.randn(1, model.config.inter_channels, frames)
    g = model.speaker_embedding(2)
    with torch.inference_mode():
        whole = model.decode(z_p, g)[0, 0].numpy()
    helpers = HELPERS[helping]()
    chunks = [c for c, _ in decode_windows(model, z_p, g, helpers=helpers)]
    if isinstance(helpers, Threaded):
        helpers.close()
    streamed = np.concatenate(chunks)
    assert len(streamed) == len(whole) == frames * model.config.hop_length
    assert np.abs(streamed - np.clip(whole, -1, 1)).max() < 1e-4
    assert np.abs(whole).max() > 1e-3  # the comparison is not between two silences
    if frames >= 37:
        assert len(chunks) > 1
    if helpers is not None and frames == 300:
        assert helpers.offered == helpers.lanes - 1  # the rest was cut, one piece a helper


def test_a_piece_cut_anywhere_joins_exactly() -> None:
    """The pieces' own rule, at cuts near the sentence's start (less context before it than
    the receptive fields), in the middle and near its end."""
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(2)
    z_p = torch.randn(1, model.config.inter_channels, 120)
    whole = one_shot_audio(model, z_p)
    hop = model.config.hop_length
    from tts.pieces import Latents, Piece

    for cut in (1, 20, 60, 119):
        latents = Latents([z_p])
        a = Piece(model, latents, None, 1.0, 0, cut)
        b = Piece(model, latents, None, 1.0, cut)
        for piece in (b, a):  # the later piece first: they do not depend on each other
            while not piece.finished:
                piece.step(piece.reached + 16)
        left, right = np.concatenate(list(a.take())), np.concatenate(list(b.take()))
        assert len(left) == cut * hop and len(right) == (120 - cut) * hop
        assert np.abs(np.concatenate([left, right]) - whole).max() < 1e-4, cut


def _flow_pushes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The frames of every ``StreamingFlow.push`` from now on, in order (the real push runs)."""
    from tts import flow_stream

    pushes: list[int] = []
    push = flow_stream.StreamingFlow.push

    def counted(self: flow_stream.StreamingFlow, x: torch.Tensor,
                final: bool = False) -> torch.Tensor:
        pushes.append(x.shape[-1])
        return push(self, x, final)

    monkeypatch.setattr(flow_stream.StreamingFlow, "push", counted)
    return pushes


def test_a_piece_that_ends_inside_the_sentence_leaves_no_flow_sliver(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The playing lane's share of a short sentence at two lanes ends inside it. When its
    flow runs ahead to within half that run of the last prior frame the piece reads (its
    end's look-ahead through the generator and the flow), the flow takes those frames too
    rather than leave them a push of their own, whose sixteen products read every weight
    again for a few frames. The audio still joins the one-shot audio."""
    from tts.pieces import Latents, Piece

    model = random_model(VARIANTS["medium"])
    torch.manual_seed(3)
    z_p = torch.randn(1, model.config.inter_channels, 128)
    whole = one_shot_audio(model, z_p)
    pushes = _flow_pushes(monkeypatch)
    dc, fc, end = model.dec.receptive_field, model.flow.receptive_field, 64
    stop = end + dc + fc  # the last prior frame the piece reads, short of the sentence's
    piece = Piece(model, Latents([z_p]), None, 1.0, 0, end)
    piece.step(8)  # the first window: no run-ahead
    assert sum(pushes) == 8 + dc + fc
    # The second window's flow may run 28 frames past what it needs: 12 would be left,
    # fewer than half of 28, so it takes them.
    ahead = 28
    needed = 24 + dc + fc
    assert 0 < stop - (needed + ahead) <= ahead // 2
    piece.step(24, ahead)
    assert sum(pushes) == stop and len(pushes) == 2, pushes
    while not piece.finished:
        piece.step(piece.reached + 16, ahead)
    assert len(pushes) == 2, pushes  # no push of its own for the sliver
    left = np.concatenate(list(piece.take()))
    assert len(left) == end * model.config.hop_length
    assert np.abs(left - whole[: len(left)]).max() < 1e-4


def test_the_rest_is_cut_into_pieces_no_shorter_than_the_minimum() -> None:
    """A sentence whose prior is whole from the start (a short one's) is shared out among
    the lanes at once, as long as each piece keeps ``MIN_PIECE`` frames; one too short for
    two is the playing lane's."""
    model = random_model(VARIANTS["medium"])
    for frames, lanes, pieces in ((300, 2, 2), (300, 4, 4), (2 * MIN_PIECE, 2, 2),
                                  (2 * MIN_PIECE - 1, 2, 1), (300, 1, 1)):
        helpers = Never(lanes)
        list(decode_windows(model, torch.randn(1, 192, frames), None, helpers=helpers))
        assert helpers.offered == pieces - 1, (frames, lanes)


def test_a_long_sentence_is_shared_after_its_first_window() -> None:
    """A prior in parts (a long sentence's head first): the first window is decoded from
    the head alone, and what is left after it is shared out."""
    model = random_model(VARIANTS["medium"])
    z = torch.randn(1, 192, 300)
    helpers = Never(2)
    pulled: list[int] = []

    def parts() -> Iterator[torch.Tensor]:
        for part in (z[..., :60], z[..., 60:]):
            pulled.append(part.shape[-1])
            yield part

    chunks = decode_windows(model, parts(), None, helpers=helpers)
    next(chunks)
    assert pulled == [60] and helpers.offered == 0
    list(chunks)
    assert pulled == [60, 240] and helpers.offered == 1


class StepClock:
    """Advances only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_window_grows_to_what_the_buffered_audio_pays_for() -> None:
    """10 ms of audio a frame; the last window cost 1 ms a frame; 50 ms kept in hand."""
    clock = StepClock()
    pace = Pace(0.01, clock=clock, margin=0.05)
    assert pace.size(planned=8, largest=500, asked=None) == 8  # nothing out yet: the plan
    pace.ran(frames=8, seconds=0.008)
    pace.out(8 * 160, sample_rate=16000)  # 0.08 s handed out at t = 0
    assert pace.size(16, 500, None) == 30  # (0.08 - 0.05) / 0.001
    clock.now = 0.05
    assert pace.size(16, 500, None) == 16  # less is buffered: never under the plan
    pace.out(100 * 160, 16000)  # 1.08 s out, 1.03 s of it still to play
    assert pace.size(16, 500, None) == 500  # capped at the largest
    assert pace.size(16, 500, asked=40) == 40  # others wait: what they ask, no more
    pace.ran(frames=10, seconds=1.0)  # the machine got slow: 0.1 s a frame
    assert pace.size(16, 500, None) == 16 and pace.affordable() == 9


def test_a_sentences_last_frames_are_folded_into_the_window_the_buffer_pays_for() -> None:
    """10 ms of audio a frame, 1 ms a frame to make it, 0.08 s handed out: a window of 30
    frames may take on 50 more and still be done before the listener runs dry; a tail of
    51 is a window of its own. Before any audio is out, only a sliver is folded."""
    clock = StepClock()
    pace = Pace(0.01, clock=clock, margin=0.05)
    assert pace.foldable(8) == 0
    pace.ran(frames=8, seconds=0.008)
    pace.out(8 * 160, sample_rate=16000)
    assert pace.size(16, 500, None) == 30 and pace.foldable(30) == 50
    assert next_end(0, 30, pace.foldable(30), 80, complete=True) == 80
    assert next_end(0, 30, pace.foldable(30), 81, complete=True) == 30
    assert next_end(0, 30, pace.foldable(30), 80, complete=False) == 30  # length unknown
    clock.now = 0.05  # 0.03 s left to play: 30 frames' worth
    assert pace.foldable(16) == 14


def test_the_flow_runs_ahead_with_half_of_what_is_buffered() -> None:
    """10 ms of audio a frame; windows cost 1 ms a frame, the flow 0.5 ms; 0.3 s handed out,
    0.25 s of it spare: the flow runs ahead with half the spare, whatever the window."""
    clock = StepClock()
    pace = Pace(0.01, clock=clock, margin=0.05)
    flow_ran = (10, 0.005)
    pace.ran(frames=8, seconds=0.008)
    assert pace.flow_ahead(1000, flow_ran, window=30, planned=16) == 0  # nothing out yet
    pace.out(30 * 160, sample_rate=16000)
    assert pace.flow_ahead(1000, flow_ran, window=30, planned=16) == 250  # 0.125 s
    assert pace.flow_ahead(100, flow_ran, window=30, planned=16) == 100
    assert pace.flow_ahead(1000, flow_ran, window=200, planned=16) == 250
    assert pace.flow_ahead(1000, None, window=30, planned=16) == 0  # no flow measured yet


def test_after_a_crowded_hand_out_windows_are_reckoned_slower_and_leave_the_flow_the_rest(
        ) -> None:
    """The same pace, after work was handed out beside a busy process (``Pace.crowd``): the
    next window is reckoned at ``CROWDED`` times the last one's pace, in what it may grow
    to, fold in and let the flow run ahead; the window after it at the pace it was
    measured at. From then on the flow runs ahead beside a window the buffer grew past the
    plan (16 frames) only with what that window leaves, so that together they stay within
    the spare; beside a window of the plan, with half the spare as before."""
    clock = StepClock()
    pace = Pace(0.01, clock=clock, margin=0.05)
    pace.ran(frames=8, seconds=0.008)
    pace.out(30 * 160, sample_rate=16000)  # 0.25 s spare, 1 ms a frame
    flow_ran = (10, 0.005)
    calm = (pace.affordable(), pace.foldable(16), pace.flow_ahead(1000, flow_ran, 30, 16))
    assert calm == (250, 284, 250)
    pace.crowd()
    assert pace.affordable() == int(0.25 / (CROWDED * 0.001))
    assert pace.foldable(16) == int(0.3 / (CROWDED * 0.001)) - 16
    assert pace.flow_ahead(1000, flow_ran, 16, 16) == int(0.125 / (CROWDED * 0.0005))
    assert pace.size(16, 500, None) < calm[0]
    pace.ran(frames=16, seconds=0.016)  # measured: 1 ms a frame again
    assert pace.affordable() == calm[0]
    assert pace.flow_ahead(1000, flow_ran, window=30, planned=16) == 250  # 0.125 s
    assert 99 <= pace.flow_ahead(1000, flow_ran, window=200, planned=16) <= 100  # 0.05 s
    assert pace.flow_ahead(1000, flow_ran, window=300, planned=16) == 0  # all taken
    assert pace.flow_ahead(1000, flow_ran, window=300, planned=300) == 250  # the plan's


class _Begins:
    """The sharing thread, recording ``moment()`` each time a task is begun on it: that the
    lanes ask for it, whatever a busy host then makes of the second thread (a task it has
    not taken is run by whoever waits for it, ``SharingThread.begin``)."""

    def __init__(self, moment: Callable[[], int]) -> None:
        self.thread = sharing_module.sharing_thread()
        self.moment = moment
        self.at: list[int] = []

    def begin(self, task: Callable[[], None]) -> Callable[[], None]:
        self.at.append(self.moment())
        return self.thread.begin(task)

    def run(self, phases: Phases) -> None:
        self.thread.run(phases)


def _begins(monkeypatch: pytest.MonkeyPatch, moment: Callable[[], int]) -> _Begins:
    begins = _Begins(moment)
    monkeypatch.setattr(lanes_module, "sharing_thread", lambda: begins)
    return begins


@pytest.mark.parametrize("free", [False, True])
def test_the_next_sentence_is_not_computed_here_before_the_first_audio(
        monkeypatch: pytest.MonkeyPatch, free: bool) -> None:
    """A first sentence whose prior is whole at once is cut for the helpers before its
    first window. The next sentence's prior, which handing it out needs, is computed on
    the sharing thread once that window is made when a core is free; else here, after
    the first audio (and after the second window, ``_Lanes._may_hand_out``). Either way,
    not on this thread before the first audio."""
    monkeypatch.setattr(sharing_module, "core_free", lambda: free)
    monkeypatch.setattr(lanes_module, "core_free", lambda: free)
    monkeypatch.setattr(lanes_module, "crowded", lambda: not free)
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(8)
    chunks_out: list[int] = []
    taken: list[tuple[int, str, int]] = []  # sentence, thread, chunks out by then

    def priors() -> Iterator[Prior]:
        for k, frames in enumerate((400, 80)):  # the playing lane's half: three windows
            taken.append((k, threading.current_thread().name, len(chunks_out)))
            yield torch.randn(1, model.config.inter_channels, frames), None

    begins = _begins(monkeypatch, lambda: len(chunks_out))
    helpers = Inline(2)
    for _chunk in decode_sentences(model, priors(), helpers=helpers):
        chunks_out.append(1)
    main = threading.current_thread().name
    assert [k for k, _, _ in taken] == [0, 1] and helpers.offered >= 2
    _, thread, out_by_then = taken[1]
    assert begins.at[:1] == [0], begins.at  # asked of the sharing thread before the first chunk
    if free:
        # there, or here once the first audio is out if the second thread was slow to take
        # it (a busy host)
        assert thread != main or out_by_then >= 1, taken
    else:
        assert thread == main and out_by_then >= 1, taken


def test_a_played_sentences_next_prior_is_begun_once_its_first_window_is_made(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a listener waits for the first chunk, the next sentence's prior is computed on
    the sharing thread after the first window, not beside it, where the two threads would
    take turns on the interpreter's lock while the listener waits."""
    monkeypatch.setattr(sharing_module, "core_free", lambda: True)
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(18)
    windows: list[int] = []
    step = pieces_module.Piece.step

    def counted(self: pieces_module.Piece, upto: int, ahead: int = 0) -> None:
        step(self, upto, ahead)
        windows.append(upto)

    monkeypatch.setattr(pieces_module.Piece, "step", counted)
    taken: list[int] = []  # windows made when each prior was taken

    def priors() -> Iterator[Prior]:
        for frames in (40, 80):  # the first too short to cut: the helper's core is idle
            taken.append(len(windows))
            yield torch.randn(1, model.config.inter_channels, frames), None

    begins = _begins(monkeypatch, lambda: len(windows))
    list(decode_sentences(model, priors(), helpers=Inline(2)))
    # begun on the sharing thread after one window (and, if that prior was not done by the
    # end of the first sentence, the look for a third once the second's first window is made)
    assert begins.at[:1] == [1], begins.at
    assert taken[0] == 0 and taken[1] >= 1, taken


def test_the_next_sentence_is_handed_out_once_its_prior_is_done_not_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The next sentence's prior, computed on the sharing thread, may take longer than the
    first window (a long sentence's on a slow CPU). The playing lane does not wait for it
    to hand that sentence out: it goes on with this sentence's windows, and hands it out
    once it is done. (Waiting stood between the first chunk and the second: a gap.)"""
    monkeypatch.setattr(sharing_module, "core_free", lambda: True)
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(11)
    zs = [torch.randn(1, model.config.inter_channels, frames) for frames in (60, 120)]
    second_chunk = threading.Event()
    waited: list[bool] = []

    def priors() -> Iterator[Prior]:
        yield zs[0], None
        # Until this sentence's second chunk is out: the lane did not wait for this prior.
        waited.append(second_chunk.wait(30))
        yield zs[1], None

    helpers = Inline(2)
    chunks: list[tuple[np.ndarray, int]] = []
    for samples, sentence, _ in decode_sentences(model, priors(), helpers=helpers):
        chunks.append((samples, sentence))
        if sum(1 for _, k in chunks if k == 0) == 2:
            second_chunk.set()
    assert waited == [True]
    with torch.inference_mode():
        for k, z in enumerate(zs):
            got = np.concatenate([c for c, s in chunks if s == k])
            assert np.abs(got - model.decode(z, None)[0, 0].numpy()).max() < 1e-4, k


class Stalled(Inline):
    """One helper, busy with the first piece it is handed until the playing lane waits for
    that piece; the pieces handed after it wait in its queue, where the playing lane may take
    them back."""

    def decode(self, model: Vits, job: PieceJob) -> Helping:
        self.handed.append(job)
        return StalledPiece(model, job, begun=self.offered == 1)


class StalledPiece:
    def __init__(self, model: Vits, job: PieceJob, begun: bool) -> None:
        self.model, self.job, self.begun = model, job, begun

    def claim(self) -> bool:
        return not self.begun

    def queued(self) -> bool:
        return not self.begun

    def take(self, wait: bool) -> list[tuple[np.ndarray, bool]]:
        assert self.begun, "a piece taken back is not asked for its audio"
        return list(self.job.decode(self.model, 32)) if wait else []

    def cancel(self) -> None:
        pass


@pytest.mark.parametrize("free", [True, False])
def test_beside_a_busy_process_the_helpers_get_work_from_the_second_window_on(
        monkeypatch: pytest.MonkeyPatch, free: bool) -> None:
    """The next sentence goes to the helpers once the playing lane's first window is out
    when a core is free; beside a busy process (``tts.neighbours.crowded``), once its second
    is, and the window after each hand-out is reckoned at a crowded pace (``Pace.crowd``).
    The audio is the same."""
    monkeypatch.setattr(sharing_module, "core_free", lambda: free)
    monkeypatch.setattr(lanes_module, "core_free", lambda: free)
    monkeypatch.setattr(lanes_module, "crowded", lambda: not free)
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(14)
    zs = [torch.randn(1, model.config.inter_channels, frames) for frames in (400, 80)]
    windows: list[bool] = []  # windows done, whether playing
    handed: list[tuple[int, int]] = []  # (the piece's first frame, playing windows by then)
    crowded: list[int] = []
    window, crowd = lanes_module._Lanes._window, Pace.crowd

    def observed(self: lanes_module._Lanes, span: lanes_module._Span, playing: bool) -> None:
        window(self, span, playing)
        windows.append(playing)

    def noted(self: Pace) -> None:
        crowded.append(sum(windows))
        crowd(self)

    class Noted(Inline):
        def decode(self, model: Vits, job: PieceJob) -> Helping:
            handed.append((job.start, sum(windows)))
            return super().decode(model, job)

    monkeypatch.setattr(lanes_module._Lanes, "_window", observed)
    monkeypatch.setattr(Pace, "crowd", noted)
    chunks = list(decode_sentences(model, ((z, None) for z in zs), helpers=Noted(2)))
    # The first sentence's second half before any window; then the second sentence whole,
    # with a core free once its prior is done on the sharing thread (after one window or
    # more), with none computed here after the second.
    assert [by for _, by in handed][:1] == [0] and len(handed) == 2, handed
    assert handed[1][1] >= 1 if free else handed[1][1] == 2, handed
    assert crowded == ([] if free else [0, 2]), crowded
    _each_sentence_is_one_shot(model, zs, chunks)


def test_beside_a_busy_process_a_sentence_cut_before_its_first_window_begins_larger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sentence whose prior is whole at once is cut for the helpers before its first
    window; beside a busy process that helper shares the cores with this lane from the
    start, so the first window is twice the plan and more audio is in hand when the
    crowded windows come. The audio is the same."""
    monkeypatch.setattr(sharing_module, "core_free", lambda: False)
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(15)
    z = torch.randn(1, model.config.inter_channels, 150)
    firsts = []
    for busy in (False, True):
        monkeypatch.setattr(lanes_module, "crowded", lambda busy=busy: busy)
        helpers = Inline(2)
        chunks = list(decode_sentences(model, [(z, None)], helpers=helpers))
        assert helpers.offered == 1  # cut before the first window either way
        firsts.append(len(chunks[0][0]))
        with torch.inference_mode():
            got = np.concatenate([c for c, _, _ in chunks])
            assert np.abs(got - model.decode(z, None)[0, 0].numpy()).max() < 1e-4, busy
    assert firsts[1] - firsts[0] == 8 * model.config.hop_length, firsts  # 16 frames, not 8


def test_whether_a_hand_out_is_crowded_is_read_before_it(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Whether the helpers' work will share the cores with a busy process is read before
    it is handed to them: read after, the helper's own thread that took it, asleep again,
    still counted as runnable on Linux's run queue for some milliseconds, and an idle
    machine read as crowded. Here ``crowded`` answers as that run queue would, busy once
    work has been handed out: the reading that decides the cut is made before it, the pace
    is not crowded, and the first window is the one of a machine that is idle throughout."""
    monkeypatch.setattr(sharing_module, "core_free", lambda: False)
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(15)
    z = torch.randn(1, model.config.inter_channels, 150)
    crowd = Pace.crowd
    crowds: list[bool] = []

    def counted(pace: Pace) -> None:
        crowds.append(True)
        crowd(pace)

    monkeypatch.setattr(Pace, "crowd", counted)
    firsts = []
    for idle_throughout in (True, False):
        helpers = Inline(2)
        offered_at: list[int] = []  # work handed out when each reading was made

        def reading(h: Inline = helpers, idle: bool = idle_throughout,
                    at: list[int] = offered_at) -> bool:
            at.append(h.offered)
            return not idle and h.offered > 0

        monkeypatch.setattr(lanes_module, "crowded", reading)
        chunks = list(decode_sentences(model, [(z, None)], helpers=helpers))
        assert helpers.offered == 1
        assert offered_at[:1] == [0], offered_at  # the cut's decision
        firsts.append(len(chunks[0][0]))
        _each_sentence_is_one_shot(model, [z], chunks)
    assert crowds == [] and firsts[0] == firsts[1], (crowds, firsts)


@pytest.mark.parametrize("busy", [False, True])
def test_beside_a_busy_process_a_sentence_handed_out_keeps_its_head_here(
        monkeypatch: pytest.MonkeyPatch, busy: bool) -> None:
    """The sentence after a short one goes to the helper whole on an idle machine (a
    sentence follows it); beside a busy process only its second half does, the first is
    decoded here, where it can be audio as soon as the short sentence ends. The audio is the
    one-shot audio either way."""
    monkeypatch.setattr(sharing_module, "core_free", lambda: False)
    monkeypatch.setattr(lanes_module, "crowded", lambda: busy)
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(16)
    zs = [torch.randn(1, model.config.inter_channels, frames) for frames in (40, 200, 20)]
    helpers = Inline(2)
    # windows of at most 16 frames: the next sentence is handed out during the first one
    # (beside a busy process, from its second window on)
    chunks = list(decode_sentences(model, [(z, None) for z in zs], largest=16,
                                   helpers=helpers))
    _each_sentence_is_one_shot(model, zs, chunks)
    job = helpers.handed[0]  # the short first sentence is not cut
    frames = job.z.shape[-1] - job.start  # what it decodes: from its start to the end
    assert frames == (100 if busy else 200), (busy, frames)


@pytest.mark.parametrize("frames", [200, 80])
def test_the_last_sentence_handed_out_is_cut_where_both_lanes_end_together(
        monkeypatch: pytest.MonkeyPatch, frames: int) -> None:
    """Handed out whole, a text's last sentence would leave the playing lane idle once it is
    through its own frames, until the helper is done. So the playing lane keeps its head,
    as long as its own frames left and the head come to the helper's tail; a sentence whose
    head would be shorter than a piece goes whole. The audio is the one-shot audio."""
    monkeypatch.setattr(sharing_module, "core_free", lambda: False)
    monkeypatch.setattr(lanes_module, "crowded", lambda: False)
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(17)
    zs = [torch.randn(1, model.config.inter_channels, n) for n in (40, frames)]
    helpers = Inline(2)
    # Handed out after the first sentence's first window of 8 frames: 32 frames left here.
    chunks = list(decode_sentences(model, [(z, None) for z in zs], largest=16,
                                   helpers=helpers))
    _each_sentence_is_one_shot(model, zs, chunks)
    [job] = helpers.handed
    tail = job.z.shape[-1] - job.start  # what the helper decodes: from its start to the end
    if frames == 80:
        assert tail == 80  # a head of 24 frames: not worth a cut
    else:
        head = frames - tail
        assert head >= lanes_module.MIN_PIECE and abs(32 + head - tail) <= 1, (head, tail)


def test_without_helpers_nothing_is_read_and_nothing_is_crowded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether other processes are runnable reads ``/proc``; without helpers to hand work to
    nothing depends on it."""
    readings: list[bool] = []
    monkeypatch.setattr(lanes_module, "crowded", lambda: readings.append(True) or True)
    model = random_model(VARIANTS["medium"])
    alone = lanes_module._Lanes(model, [], 1.0, 8, 96, Pace(0.01), None, None, False)
    assert not alone._crowded() and readings == []
    helped = lanes_module._Lanes(model, [], 1.0, 8, 96, Pace(0.01), None, Inline(2), False)
    assert helped._crowded() and readings == [True]


def test_a_sentence_taken_back_before_any_helper_began_it_is_cut_for_them_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sentence handed out whole that the playing lane gets to before a helper has begun
    it is taken back, and its second half handed to the helpers before its first window
    (not after it, which left them idle for that window), the audio the same."""
    monkeypatch.setattr(sharing_module, "core_free", lambda: False)
    # Sentences handed out whole: the last one keeps no head here
    # (``test_the_last_sentence_handed_out_is_cut_where_both_lanes_end_together``).
    monkeypatch.setattr(lanes_module._Lanes, "_head_of_last", lambda self, frames: 0)
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(12)
    zs = [torch.randn(1, model.config.inter_channels, frames) for frames in (120, 120)]
    events: list[str] = []
    window = lanes_module._Lanes._window

    def observed(self: lanes_module._Lanes, span: lanes_module._Span, playing: bool) -> None:
        first = span.piece is None and span.start == 0
        window(self, span, playing)
        if first:
            events.append(f"first window {span.sentence}")

    class Noted(Stalled):
        def decode(self, model: Vits, job: PieceJob) -> Helping:
            events.append(f"hand {self.offered + 1}")
            return super().decode(model, job)

    monkeypatch.setattr(lanes_module._Lanes, "_window", observed)
    helpers = Noted(2)
    chunks = list(decode_sentences(model, ((z, None) for z in zs), helpers=helpers))
    # The first sentence's second half (begun by the helper), the second sentence whole
    # (left in its queue), then the second half of that one, taken back.
    assert helpers.offered == 3, events
    assert events.index("hand 2") < events.index("hand 3") < events.index("first window 1")
    _each_sentence_is_one_shot(model, zs, chunks)


def test_a_sentence_taken_back_from_the_helpers_queue_lets_the_next_be_handed_out_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While its helper makes the rest of the first sentence, the playing lane takes the
    second back from the helper's queue; the third is handed out before it decodes the
    second, so the helper has it to begin as soon as it is free, and the audio is the same."""
    from tts import lanes

    # Sentences handed out whole: the last one keeps no head here
    # (``test_the_last_sentence_handed_out_is_cut_where_both_lanes_end_together``).
    monkeypatch.setattr(lanes._Lanes, "_head_of_last", lambda self, frames: 0)
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(9)
    zs = [torch.randn(1, model.config.inter_channels, frames) for frames in (200, 120, 120)]
    events: list[str] = []

    def priors() -> Iterator[Prior]:
        for k, z in enumerate(zs):
            events.append(f"prior {k}")
            yield z, None

    window = lanes._Lanes._window

    def observed(self: lanes._Lanes, span: lanes._Span, playing: bool) -> None:
        events.append(f"window {span.sentence}")
        window(self, span, playing)

    monkeypatch.setattr(lanes._Lanes, "_window", observed)
    helpers = Stalled(2)
    chunks = list(decode_sentences(model, priors(), helpers=helpers))
    # The first sentence's rest, the next two whole, and the second half of each of those
    # when it was taken back (``test_a_sentence_taken_back_before_any_helper_began_it...``).
    assert helpers.offered == 5, events
    assert events.index("prior 2") < events.index("window 1"), events
    _each_sentence_is_one_shot(model, zs, chunks)


def test_a_sentence_is_known_whole_once_its_last_part_is_joined() -> None:
    """The prior's parts say which is the last: the sentence's length is known as soon as
    it is joined, without asking for one more (which, after the head, would compute the
    rest at once)."""
    model = random_model(VARIANTS["medium"])
    ids = torch.randint(1, model.config.n_vocab, (1, 260),
                        generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        parts = model.prior_parts(ids, None, 0.667, 1.0, 0.8, head=16)
        latents = Latents(parts)
        head = latents.fill(1)
        assert not latents.complete and not parts.done
        total = latents.fill(head + 1)
        assert latents.complete and parts.done and total > head
        listed = Latents([torch.zeros(1, 192, 5), torch.zeros(1, 192, 7)])
        assert listed.fill(1) == 5 and not listed.complete
        assert listed.fill(6) == 12 and listed.complete


def test_the_flow_runs_ahead_in_large_pushes_once_the_sentence_is_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A long sentence's prior comes in two parts; once the second is joined, the flow is
    pushed far ahead of the generator's windows (fewer, larger matrix products) while the
    audio out pays for it, and the chunks still join into the one-shot audio."""

    model = random_model(VARIANTS["medium"])
    torch.manual_seed(6)
    z_p = torch.randn(1, model.config.inter_channels, 400)
    whole = one_shot_audio(model, z_p)
    pushes = _flow_pushes(monkeypatch)
    parts = PriorParts(lambda run: iter([(z_p[..., :100], False), (z_p[..., 100:], True)]))
    chunks = [c for c, _, _ in decode_sentences(
        model, [(parts, None)], largest=32, pace=Pace(256 / 22050, clock=lambda: 0.0))]
    assert np.abs(np.concatenate(chunks) - whole).max() < 1e-4
    assert len(chunks) >= 400 // 32 and len(pushes) <= len(chunks) // 2, (pushes, len(chunks))
    assert max(pushes) > 32


def test_the_flow_pushed_in_any_sizes_equals_its_one_shot_reverse() -> None:
    """Pushes larger than the flow's own piece (which it cuts up), smaller ones, and one of
    everything, with a speaker's conditioning: the latent frames join into the one-shot
    flow's."""
    from tts.flow_stream import StreamingFlow

    model = random_model(VARIANTS["multi_speaker"])
    torch.manual_seed(8)
    frames = 700
    z_p = torch.randn(1, model.config.inter_channels, frames)
    g = model.speaker_embedding(1)
    with torch.inference_mode():
        whole = model.flow.reverse(z_p, torch.ones_like(z_p[:, :1]), g)
        for sizes in ([frames], [5, 300, 395], [600, 1, 99]):
            flow = StreamingFlow(model.flow, g)
            assert flow.piece < max(sizes), "a push the flow cuts into pieces"
            ends = np.cumsum(sizes)
            out = torch.cat([flow.push(nhwc(z_p[..., e - n : e]), final=e == frames)
                             for n, e in zip(sizes, ends)], dim=-1)
            assert out.shape[-1] == frames
            assert (out[:, :, 0] - whole).abs().max() < 1e-4, sizes
    assert whole.abs().max() > 1e-2  # not two silences


def _concurrently_backwards(phases: Phases) -> None:
    """Each phase's tasks at once on threads of their own, begun last first, as the sharing
    thread runs them (under ``inference_mode``): the tasks of a phase must not depend on one
    another, or on their order."""

    def run(task: Callable[[], None]) -> None:
        with torch.inference_mode():
            task()

    for phase in phases:
        threads = [threading.Thread(target=run, args=(task,)) for task in reversed(phase)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_flow_shared_out_by_columns_equals_its_one_shot_reverse(variant: str) -> None:
    """``reverse_shared`` over a whole sentence, its phases run on one thread or their
    tasks on several at once, with a speaker's conditioning where the voice has speakers:
    the latent frames are the one-shot flow's, and the prior is left as it was."""
    from tts.flow_shared import reverse_shared

    model = random_model(VARIANTS[variant])
    torch.manual_seed(9)
    g = model.speaker_embedding(1)
    with torch.inference_mode():
        for frames in (1, 5, 37, 300):
            z_p = torch.randn(1, model.config.inter_channels, frames)
            whole = model.flow.reverse(z_p, torch.ones_like(z_p[:, :1]), g)
            z = nhwc(z_p)
            for run in (in_order, _concurrently_backwards):
                out = reverse_shared(model.flow, z, g, run)
                assert out.shape == z.shape, (frames, run)
                assert out.is_contiguous(memory_format=torch.channels_last)
                assert (out[:, :, 0] - whole).abs().max() < 1e-5, (frames, run)
            assert torch.equal(z[:, :, 0], z_p)
            assert whole.abs().max() > 1e-2  # not two silences


def _decoded_by_two_lanes(model: Vits, g: torch.Tensor | None, frames: int, whole: bool) -> Inline:
    """A random prior of ``frames`` (seeded by them) decoded at two lanes, ``whole`` or
    played, checked to be the one-shot audio (and not silence); the helpers it went to."""
    torch.manual_seed(frames)
    z_p = torch.randn(1, model.config.inter_channels, frames)
    one_shot = one_shot_audio(model, z_p, g)
    helpers = Inline(2)
    audio = np.concatenate([c for c, _ in decode_windows(
        model, z_p, g, largest=96, helpers=helpers, whole=whole)])
    assert np.abs(audio - one_shot).max() < 1e-4, (frames, whole)
    assert np.abs(one_shot).max() > 1e-3
    return helpers


def test_a_short_sentence_made_whole_is_flowed_once_and_its_pieces_run_the_generator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Audio nobody plays before it is all made (``whole``), with no core free
    for intra-op threads (beside a busy process): a short sentence goes through the flow
    once, before it is cut, and the helper's piece reads only the generator's context;
    played as it comes, or longer than ``SHORT_CONTEXTS`` times the context a cut computes
    again, each piece runs the flow itself (the first audio does not wait for the whole
    flow; the helper does not idle while a long one's flow is made). Either way the audio
    is the one-shot audio."""
    monkeypatch.setattr(lanes_module, "core_free", lambda: False)
    model = random_model(VARIANTS["multi_speaker"])
    g = model.speaker_embedding(2)
    dc, fc = model.dec.receptive_field, model.flow.receptive_field
    bound = SHORT_CONTEXTS * (dc + fc)
    assert 120 <= bound
    for frames, made_whole, flowed in ((120, True, True), (120, False, False),
                                       (bound + 8, True, False)):
        [job] = _decoded_by_two_lanes(model, g, frames, made_whole).handed
        assert job.flowed is flowed, (frames, made_whole)
        assert job.start == dc + (0 if flowed else fc)  # the context it reads before its start
        assert job.z.shape[-1] == frames - frames // 2 + job.start


@pytest.fixture
def stepped(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The intra-op threads of each window decoded on this thread, the helper's core taken
    to be free, and this thread on one intra-op thread, as a worker is."""
    if not threads_module.intra_op_available():
        pytest.skip("this torch build has no GNU OpenMP and MKL to set per thread")
    monkeypatch.setattr(lanes_module, "core_free", lambda: True)
    threads_module.prepare_thread()
    threads: list[int] = []
    step = pieces_module.Piece.step

    def counted(piece: pieces_module.Piece, upto: int, ahead: int = 0) -> None:
        threads.append(torch.get_num_threads())
        step(piece, upto, ahead)

    monkeypatch.setattr(pieces_module.Piece, "step", counted)
    return threads


def test_a_short_sentence_made_whole_with_a_core_free_is_made_on_intra_op_threads(
        stepped: list[int]) -> None:
    """With the helper's core free, a short sentence nobody plays before it is all made is
    not cut: it is made here on two intra-op threads, the helper's core one of them, and
    is the one-shot audio. Played as it comes, or longer than ``SHORT_CONTEXTS`` times the
    context a cut computes again, it is cut for the helper on one thread as before."""
    model = random_model(VARIANTS["multi_speaker"])
    g = model.speaker_embedding(2)
    bound = SHORT_CONTEXTS * (model.dec.receptive_field + model.flow.receptive_field)
    for frames, made_whole, cut in ((120, True, False), (120, False, True),
                                    (bound + 8, True, True)):
        stepped.clear()
        helpers = _decoded_by_two_lanes(model, g, frames, made_whole)
        assert len(helpers.handed) == (1 if cut else 0), (frames, made_whole)
        assert set(stepped) == ({1} if cut else {2}), (frames, made_whole)
        assert torch.get_num_threads() == 1  # given back


def test_a_paced_stream_makes_fewer_windows_and_the_same_audio(synth) -> None:  # type: ignore[no-untyped-def]
    """The real voice, a clock that never moves (all audio handed out stays buffered, and
    each window costs nothing): windows grow to the largest at once, the audio is the
    same."""
    opts = SynthesisOptions(seed=5).with_defaults(synth.voice)
    z_p, g = synth.prior(synth.sentences(LONG_SENTENCE)[0], opts)
    plain = [c for c, _ in decode_windows(synth.model, z_p, g, largest=256)]
    paced = [c for c, _ in decode_windows(synth.model, z_p, g, largest=256,
                                          pace=Pace(256 / 22050, clock=lambda: 0.0))]
    frames = z_p.shape[-1]
    ends = np.round(np.cumsum([len(c) for c in paced]) / 256).astype(int).tolist()
    # (a chunk's samples need not end on a frame boundary: within one frame of it)
    assert abs(ends[0] - 8) <= 1 and abs(ends[1] - (8 + 256)) <= 1 and ends[-1] == frames
    assert np.diff(ends).max() <= 256 + 8  # the largest, or it with a tail folded in
    plain_ends = np.round(np.cumsum([len(c) for c in plain]) / 256).astype(int).tolist()
    assert np.abs(np.array(plain_ends[:5]) - [8, 24, 56, 120, 248]).max() <= 1
    assert np.abs(np.concatenate(paced) - np.concatenate(plain)).max() < 1e-4


@pytest.mark.parametrize("variant", ["medium", "multi_speaker", "plain_dp"])
def test_the_prior_in_parts_keeps_the_whole_sentences_durations(variant: str) -> None:
    """Split at the head, the parts join into the latent of the unsplit prior: same frames,
    same expanded means (no sampling noise), nothing dropped or repeated at the cut. That
    each part's log-durations are the whole sentence's is
    ``test_log_durations_of_a_part_are_the_whole_sentences``; rounded up to whole frames,
    durations hide differences that small."""
    model = random_model(VARIANTS[variant])
    ids = torch.randint(1, model.config.n_vocab, (1, 260),
                        generator=torch.Generator().manual_seed(4))
    g = model.speaker_embedding(1)

    def parts(head: int) -> list[torch.Tensor]:
        noise = torch.Generator().manual_seed(3)
        with torch.inference_mode():
            return list(model.prior_parts(ids, g, 0.0, 0.5, 0.8, noise, head=head))

    split, whole = parts(head=16), parts(head=10_000)
    assert len(split) == 2 and len(whole) == 1
    joined = torch.cat(split, dim=-1)
    assert joined.shape == whole[0].shape and split[0].shape[-1] > 0
    assert torch.allclose(joined, whole[0], atol=1e-5)


@pytest.mark.parametrize("predictor", ["stochastic", "plain"])
def test_log_durations_of_a_part_are_the_whole_sentences(
        synth, predictor: str) -> None:  # type: ignore[no-untyped-def]
    """What ``prior_parts`` relies on: the predictor over a part of the sentence and its
    ``radius`` gives the log-durations it gives over the whole sentence."""
    model = synth.model if predictor == "stochastic" else random_model(VARIANTS["plain_dp"])
    ids = torch.tensor(synth.sentences(LONG_SENTENCE)[0]) % model.config.n_vocab
    n, r = len(ids), model.dp.radius
    with torch.inference_mode():
        x, _, _ = model.enc_p(ids)
        noise = torch.randn(n, 2, generator=torch.Generator().manual_seed(7)) * 0.8
        whole = model.dp(x, noise, None)
        for cut in (100, 250):
            for a, b in ((0, cut), (cut, n), (cut - 40, cut + 40)):
                part = model.log_durations(x, noise, None, a, b)
                # float rounding only: products over other row offsets may round differently
                assert torch.allclose(part, whole[a:b], rtol=0, atol=1e-6), (a, b)
            # without the radius past it, the part's last ids would be wrong
            cropped = model.dp(x[:cut], noise[:cut], None)
            assert not torch.allclose(cropped[cut - r :], whole[cut - r : cut], rtol=0, atol=1e-6)


@pytest.mark.parametrize("length_scale", [1.0, 0.3])
def test_the_first_chunk_needs_only_the_head_of_the_prior(  # type: ignore[no-untyped-def]
        synth, length_scale: float) -> None:
    """A long sentence's first audio waits for the durations of its first ids only; the
    rest of the prior is computed after that audio is out. Also when spoken fast (fewer
    frames an id, so the head takes more ids)."""
    opts = SynthesisOptions(seed=2, length_scale=length_scale)
    parts, g = synth.prior_parts(synth.sentences(LONG_SENTENCE)[0], opts)
    pulled: list[int] = []

    def watched():  # type: ignore[no-untyped-def]
        for part in parts:
            pulled.append(part.shape[-1])
            yield part

    chunks = decode_windows(synth.model, watched(), g)
    next(chunks)
    assert len(pulled) == 1
    rest = list(chunks)
    assert len(pulled) == 2 and rest[-1][1]  # the rest followed, through the sentence's end
    assert pulled[0] < pulled[1]  # the head is the smaller part


def window_ends(frames: int, first: int, largest: int) -> list[int]:
    """Where ``decode_windows`` ends its windows over ``frames`` latent frames (a chunk's
    samples need not fall on a frame boundary: the nearest)."""
    model = random_model(VARIANTS[sorted(VARIANTS)[0]])
    hop = model.config.hop_length
    z_p = torch.randn(1, model.config.inter_channels, frames)
    ends, samples = [], 0
    for chunk, _ in decode_windows(model, z_p, None, first=first, largest=largest):
        samples += len(chunk)
        ends.append(round(samples / hop))
    return ends


def test_windows_double_up_to_the_largest() -> None:
    """``first`` frames, then doubling up to ``largest``; a tail shorter than ``first`` is
    folded into the window before it."""
    assert window_ends(300, 8, 128) == [8, 24, 56, 120, 248, 300]
    assert window_ends(10, 8, 128) == [10]  # a tail shorter than 8 is folded in
    assert window_ends(0, 8, 128) == []


def test_real_voice_streams_exactly_with_noise(synth) -> None:  # type: ignore[no-untyped-def]
    opts = SynthesisOptions(seed=42)
    streamed = list(synth.stream(LONG_SENTENCE, opts))
    one_shot = synth.synthesize(LONG_SENTENCE, opts)
    audio = np.concatenate([c.samples for c in streamed])
    assert len(audio) == len(one_shot)
    assert np.abs(audio - one_shot).max() < 1e-4
    assert len(streamed) >= 5  # audio arrives within the sentence, not after it
    assert streamed[-1].last_in_sentence and not streamed[0].last_in_sentence
    assert_speech(audio, synth.sample_rate, min_seconds=6)


def test_audio_wanted_whole_is_made_in_the_largest_windows(synth) -> None:  # type: ignore[no-untyped-def]
    """Nobody plays it before the end: no small first window, a short command in one
    window, and the same audio as one-shot decoding."""
    opts = SynthesisOptions(seed=42)
    short = "Turn on the kitchen lights."
    whole = [c.samples for c in synth.stream(short, opts, whole=True) if len(c.samples)]
    assert len(whole) == 1  # under the largest window (96 frames, 1.1 s) and its fold-in
    assert np.abs(whole[0] - synth.synthesize(short, opts)).max() < 1e-4
    played = [c.samples for c in synth.stream(short, opts) if len(c.samples)]
    # Played as it comes: a small first window. How large the next ones grow depends on how
    # fast this host made the first (``tts.pace``).
    assert len(played) >= 2 and len(played[0]) < len(whole[0]) // 3
    chunks = [c.samples for c in synth.stream(LONG_SENTENCE, opts, whole=True)]
    sizes = [len(c) for c in chunks if len(c)]
    assert min(sizes[:-1]) >= 96 * 256 - 256  # every window but the last is the largest
    assert np.abs(np.concatenate(chunks) - synth.synthesize(LONG_SENTENCE, opts)).max() < 1e-4


def test_a_text_made_whole_hands_its_next_sentence_out_early_and_draws_noise_in_order(  # type: ignore[no-untyped-def]
        synth, stepped: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Audio nobody plays before it is all made, of several sentences, with the helper's
    core free: a short sentence with another after it is not made on intra-op threads (the
    helper would have nothing to do), but begun in a small window, after which the helper
    gets the next sentence, whole: the sentences are decoded side by side. Looking for the
    next sentence does not change the noise a seed draws: the audio is the one-shot audio."""
    text = "Good morning. Turn on the kitchen lights."
    opts = SynthesisOptions(seed=7, sentence_silence=0.0)
    one_shot = synth.synthesize(text, opts)
    hop = synth.model.config.hop_length
    # The next sentence's prior computed at its hand-out, here (no core free for the sharing
    # thread): it is handed out right after the first window. Computed on the sharing
    # thread, it is handed out when done, or made here if this sentence is out first: when
    # is the host's, and only the noise it draws is checked.
    for sharing in (False, True):
        monkeypatch.setattr(sharing_module, "core_free", lambda free=sharing: free)
        helpers = Inline(2)
        stepped.clear()
        chunks = [c.samples for c in synth.stream(text, opts, helpers, whole=True)]
        assert len(chunks[0]) <= (synth.first_window + 1) * hop, sharing  # a small window
        audio = np.concatenate(chunks)
        assert len(audio) == len(one_shot) and np.abs(audio - one_shot).max() < 1e-4, sharing
        if not sharing:
            assert [(job.start, job.end) for job in helpers.handed] == [(0, None)]
            assert not helpers.handed[0].flowed
            assert set(stepped) == {1}
    assert_speech(audio, synth.sample_rate, min_seconds=1.5)


def test_sentences_follow_each_other(synth) -> None:  # type: ignore[no-untyped-def]
    opts = SynthesisOptions(seed=1, sentence_silence=0.2)
    chunks = list(synth.stream("First sentence. Second one!", opts))
    assert sorted({c.sentence for c in chunks}) == [0, 1]
    audio = np.concatenate([c.samples for c in chunks])
    plain = synth.synthesize("First sentence. Second one!", SynthesisOptions(seed=1))
    assert len(audio) == len(plain) + 2 * int(0.2 * synth.sample_rate)


def test_speaker_and_gain(synth) -> None:  # type: ignore[no-untyped-def]
    quiet = synth.synthesize("Hello.", SynthesisOptions(seed=3, gain=0.5))
    loud = synth.synthesize("Hello.", SynthesisOptions(seed=3))
    assert np.allclose(quiet, loud * 0.5, atol=1e-6)
    from tts import VoiceError

    with pytest.raises(VoiceError, match="single speaker"):
        synth.synthesize("Hello.", SynthesisOptions(speaker="bob"))


@pytest.mark.parametrize("field, value", [("length_scale", 0.0), ("length_scale", -1.0),
                                          ("length_scale", math.nan), ("noise_w", math.inf),
                                          ("noise_scale", -0.1), ("gain", 0.0)])
def test_options_refuse_values_the_model_cannot_use(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"SynthesisOptions.{field} must be a finite number"):
        SynthesisOptions(**{field: value})


def test_options_take_zero_noise_and_unset_values() -> None:
    opts = SynthesisOptions(noise_scale=0.0, noise_w=0.0, sentence_silence=0.0)
    assert (opts.noise_scale, opts.noise_w, opts.length_scale) == (0.0, 0.0, None)


def test_windows_are_as_long_as_the_demand_asks_and_still_join_exactly() -> None:
    """A demand asks for 40 frames at the first window and the third, nothing otherwise:
    those windows hold 40 frames, the others follow the doubling plan from there, and the
    chunks join into the one-shot audio. While a demand is made, a window is never larger
    than the plan or the demand, whatever the buffered audio would pay for."""
    model = random_model(VARIANTS[sorted(VARIANTS)[0]])
    hop = model.config.hop_length
    torch.manual_seed(3)
    z_p = torch.randn(1, model.config.inter_channels, 300)
    asks = iter([40, 0, 40, 0, 0])
    generous = Pace(256 / 16000, clock=lambda: 0.0)  # would pay for any window
    chunks = [c for c, _ in decode_windows(model, z_p, None, pace=generous,
                                           wanted=lambda: next(asks, 0))]
    # 40, then doubling (80), asked 40 but planned 160 -> the largest, 96; the rest
    assert [round(len(c) / hop) for c in chunks] == [40, 80, 96, 84]
    assert np.abs(np.concatenate(chunks) - one_shot_audio(model, z_p)).max() < 1e-4


def test_a_played_sentences_first_window_is_larger_when_no_helper_shares_the_text(
        synth) -> None:  # type: ignore[no-untyped-def]
    """With helpers a played sentence begins in the synthesizer's small first window; with
    none, every later window is the playing lane's too, and it begins in the larger one
    (``Synthesizer.lone_first_window``). The audio is the same either way."""
    text = "Turn on the kitchen lights."
    opts = SynthesisOptions(seed=3, sentence_silence=0.0)
    hop = synth.model.config.hop_length
    assert synth.lone_first_window > synth.first_window
    firsts, audio = {}, {}
    for name, helpers in (("alone", None), ("one lane", Inline(1)), ("helped", Inline(2))):
        chunks = [c.samples for c in synth.stream(text, opts, helpers)]
        firsts[name] = len(chunks[0]) / hop
        audio[name] = np.concatenate(chunks)
    # The first chunk is the window's frames and the generator's few leading samples.
    assert synth.lone_first_window < firsts["alone"] < synth.lone_first_window + 1, firsts
    assert firsts["one lane"] == firsts["alone"], firsts
    assert synth.first_window < firsts["helped"] < synth.first_window + 1, firsts
    assert np.abs(audio["alone"] - audio["helped"]).max() < 1e-4


def _conv_pre_reads(monkeypatch: pytest.MonkeyPatch, model: Vits) -> list[list[int]]:
    """What the generator's first convolution reads, push by push, one list per streamed
    generator made from here on."""
    from tts import generator_stream
    from tts.vits.layers import Conv

    pre = model.dec.conv_pre
    reads: list[list[int]] = []
    init, valid = generator_stream.StreamingGenerator.__init__, Conv.valid

    def begun(self: generator_stream.StreamingGenerator, *args: object,
              **kwargs: object) -> None:
        reads.append([])
        init(self, *args, **kwargs)  # type: ignore[arg-type]

    def read(self: Conv, x: torch.Tensor, pad: int = 0) -> torch.Tensor:
        if self is pre:
            reads[-1].append(x.shape[-1])
        return valid(self, x, pad)

    monkeypatch.setattr(generator_stream.StreamingGenerator, "__init__", begun)
    monkeypatch.setattr(Conv, "valid", read)
    return reads


def test_only_a_first_window_a_listener_waits_for_is_computed_at_its_own_length(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sentences, the second begun with the first one's audio in hand. The generator's
    first convolution reads the first sentence's first window at its own length (the plan's
    window, its look-ahead and the one-shot padding): the first audio waits for no padding.
    Every other push it reads, the second sentence's first among them, is rounded to whole
    quanta of frames, so that its lengths recur and the kernel cache holds them
    (``StreamConv``)."""
    from tts.generator_stream import FRAMES_QUANTUM

    model = random_model(VARIANTS["medium"])
    pre, dc, first = model.dec.conv_pre, model.dec.receptive_field, 5
    reads = _conv_pre_reads(monkeypatch, model)
    torch.manual_seed(5)
    priors = [torch.randn(1, model.config.inter_channels, n) for n in (150, 200)]
    in_hand = Pace(256 / 16000, clock=lambda: 0.0)  # what is handed out stays to be played
    chunks = list(decode_sentences(model, [(z, None) for z in priors], first=first,
                                   pace=in_hand))
    context = 2 * pre.radius
    assert len(reads) == 2 and len(reads[0]) > 2 and len(reads[1]) > 1, reads
    assert (reads[0][0] - context) % FRAMES_QUANTUM != 0
    assert reads[0][0] == pre.radius + first + dc, reads  # the padding, the window, no more
    rest = reads[0][1:-1] + reads[1][:-1]  # the last push of each: the sentence's end
    assert all((n - context) % FRAMES_QUANTUM == 0 for n in rest), reads
    for k, z in enumerate(priors):
        audio = np.concatenate([c for c, sentence, _ in chunks if sentence == k])
        assert np.abs(audio - one_shot_audio(model, z)).max() < 1e-4


def test_a_first_window_a_demand_makes_larger_than_the_plan_is_rounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside other syntheses a demand sizes the windows (``Demand``), and the first one a
    listener waits for is then as long as the moment asks: at its own length, every new
    length would build the generator's convolutions anew and keep them in the kernel cache,
    about twenty kernels a length, for as long as the cache takes them in. So only a first
    window the plan fixes is computed at its own length; one a demand makes larger is
    rounded like the windows after it. The audio is the one-shot audio either way."""
    from tts.generator_stream import FRAMES_QUANTUM

    model = random_model(VARIANTS["medium"])
    pre, dc, first = model.dec.conv_pre, model.dec.receptive_field, 5
    reads = _conv_pre_reads(monkeypatch, model)
    torch.manual_seed(6)
    z = torch.randn(1, model.config.inter_channels, 150)
    context = 2 * pre.radius
    for asked, exact in ((None, True), (0, True), (first, True), (37, False)):
        reads.clear()
        chunks = [c for c, _ in decode_windows(model, z, None, first=first,
                                               wanted=lambda a=asked: a)]
        n = reads[0][0]
        if exact:
            assert n == pre.radius + first + dc, (asked, reads)
        else:  # the demand's 37 frames and the look-ahead, rounded
            assert n >= pre.radius + 37 + dc and (n - context) % FRAMES_QUANTUM == 0, reads
        assert np.abs(np.concatenate(chunks) - one_shot_audio(model, z)).max() < 1e-4


def test_a_first_window_that_ends_where_its_piece_does_is_rounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A short sentence made whole at two lanes with no core free for intra-op threads is
    cut in two, and the playing lane's half is then one window to the cut (the largest
    window, the tail folded in). Its length is the half's, which each sentence's length
    (drawn durations) sets anew, not the plan's: at its own length it would build the
    generator's convolutions anew each time. So it is rounded like the windows after a
    first one; every push the generator's first convolution reads holds whole quanta of
    frames. The audio is the one-shot audio."""
    from tts.generator_stream import FRAMES_QUANTUM

    monkeypatch.setattr(lanes_module, "core_free", lambda: False)
    model = random_model(VARIANTS["medium"])
    pre = model.dec.conv_pre
    reads = _conv_pre_reads(monkeypatch, model)
    torch.manual_seed(7)
    z = torch.randn(1, model.config.inter_channels, 150)
    helpers = Inline(2)
    chunks = [c for c, _ in decode_windows(model, z, None, first=5, helpers=helpers,
                                           whole=True)]
    assert helpers.offered == 1, "the sentence was cut for the helper"
    context = 2 * pre.radius
    assert reads and all((n - context) % FRAMES_QUANTUM == 0 for r in reads for n in r), reads
    assert np.abs(np.concatenate(chunks) - one_shot_audio(model, z)).max() < 1e-4


def test_windows_after_the_first_hold_whole_quanta_of_the_generators_frames() -> None:
    """A pace that pays for 37 frames a window. The generator computes every push past a
    piece's first over a whole number of ``FRAMES_QUANTUM`` frames (16), so a 37-frame
    window would cost what a 48-frame one does and make audio of 37: past the first, the
    windows hold 48. The chunks still join into the one-shot audio."""
    from tts.generator_stream import FRAMES_QUANTUM

    class Steady(Pace):
        def size(self, planned: int, largest: int, asked: int | None) -> int:
            return 37

    model = random_model(VARIANTS[sorted(VARIANTS)[0]])
    hop = model.config.hop_length
    torch.manual_seed(4)
    z_p = torch.randn(1, model.config.inter_channels, 300)
    chunks = [c for c, _ in decode_windows(model, z_p, None,
                                           pace=Steady(256 / 16000, clock=lambda: 0.0))]
    frames = [round(len(c) / hop) for c in chunks]
    assert FRAMES_QUANTUM == 16 and frames[0] == 37, frames
    assert frames[1:-1] == [48] * (len(frames) - 2) and len(frames) > 3, frames
    assert np.abs(np.concatenate(chunks) - one_shot_audio(model, z_p)).max() < 1e-4


class FailsAfterOne(Done):
    """A helper that sends the first window of its piece, then dies."""

    def __init__(self, audio: list[tuple[np.ndarray, bool]]) -> None:
        super().__init__(audio[:1])

    def take(self, wait: bool) -> list[tuple[np.ndarray, bool]]:
        if not self.audio:
            raise HelperFailed("the helper died")
        return super().take(wait)


class DiesMidway(Inline):
    def decode(self, model: Vits, job: PieceJob) -> Helping:
        self.handed.append(job)
        return FailsAfterOne(list(job.decode(model, 32)))


@pytest.mark.parametrize("helping", ["inline", "never", "threaded", "dies midway"])
def test_sentences_shared_with_helpers_are_each_the_one_shot_audio(helping: str) -> None:
    """Four sentences of different lengths, their priors taken in order as they are needed:
    whether the helpers decode the later sentences and pieces, never begin them, or die
    after sending part of one, every sentence's chunks join into its one-shot audio, in
    order, and the last chunk of each says so."""
    model = random_model(VARIANTS["medium"])
    torch.manual_seed(5)
    priors = [torch.randn(1, model.config.inter_channels, n) for n in (300, 30, 160, 90)]
    wholes = [one_shot_audio(model, z) for z in priors]
    helpers = {"inline": Inline(2), "never": Never(3), "threaded": Threaded(2),
               "dies midway": DiesMidway(2)}[helping]
    taken: list[int] = []

    def lazily() -> Iterator[Prior]:
        for k, z in enumerate(priors):
            taken.append(k)
            yield z, None

    chunks = list(decode_sentences(model, lazily(), helpers=helpers))
    if isinstance(helpers, Threaded):
        helpers.close()
    assert taken == [0, 1, 2, 3]
    for k, whole in enumerate(wholes):
        mine = [(c, last) for c, s, last in chunks if s == k]
        assert [last for _, last in mine].count(True) == 1 and mine[-1][1]
        audio = np.concatenate([c for c, _ in mine])
        assert len(audio) == len(whole)
        assert np.abs(audio - whole).max() < 1e-4, k
    assert [s for _, s, _ in chunks] == sorted(s for _, s, _ in chunks)  # in order
    assert helpers.offered >= 3  # a piece of the first sentence, and later sentences


NARROW = 16  # the generator's widths divided by this where only its lengths matter


@pytest.mark.parametrize("variant", ["medium", "high"])
def test_the_generators_convolutions_meet_a_set_of_lengths_the_kernel_cache_holds(
        variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN builds a convolution for every input length it meets, and keeps a bounded
    number (``tts.memory``). Whatever the sentences' lengths, the windows after the first,
    and the first windows of pieces nobody waits for (a helper's, one sized by the audio in
    hand), the streamed generator's convolutions must meet few enough lengths for that
    cache to hold them with room to spare: else windows evict one another's and every one
    is built again, and a long text leaves the process holding kernels it met once. Only a
    first window a listener waits for is computed at its own length, which the plan fixes.

    The lengths follow from the voice's structure and from ``PIECE`` over each stage's
    width, not from the arithmetic: the thirty sentences go through the variant with its
    widths and ``PIECE`` both divided by NARROW (a high voice's generator at full width
    took two minutes of a slow host), after one sentence has shown that both meet the
    same lengths."""
    from tts import generator_stream
    from tts.generator_stream import StreamingGenerator
    from tts.memory import ONEDNN_CACHE_CAPACITY
    from tts.vits.dec import Upsample
    from tts.vits.layers import Conv

    shapes: list[tuple[object, ...]] = []
    conv_valid, polyphase = Conv.valid, Upsample.polyphase

    def valid(self: Conv, x: torch.Tensor, pad: int = 0) -> torch.Tensor:
        shapes.append((self.in_channels, self.out_channels, self.kernel_size, self.dilation,
                       x.shape[-1]))
        return conv_valid(self, x, pad)

    def phases(self: Upsample, x: torch.Tensor, pad: int = 0) -> torch.Tensor:
        shapes.append((self.in_channels, self.out_channels, self.kernel_size, x.shape[-1]))
        return polyphase(self, x, pad)

    monkeypatch.setattr(Conv, "valid", valid)
    monkeypatch.setattr(Upsample, "polyphase", phases)
    config = VARIANTS[variant]
    narrow = dataclasses.replace(
        config, upsample_initial_channel=config.upsample_initial_channel // NARROW)

    def sentence(model: Vits, frames: int, windows: Iterator[int], waited: bool = True) -> int:
        z = torch.randn(1, model.config.inter_channels, frames)
        gen, at, calls = StreamingGenerator(model.dec, None, exact_start=waited), 0, 0
        with torch.inference_mode():
            while at < frames:
                # The first, waited for: the plan's first window and the generator's
                # look-ahead; else any.
                n = 8 + model.dec.receptive_field if waited and not at else next(windows)
                gen.push(nhwc(z[..., at : at + n]), final=at + n >= frames)
                at, calls = at + n, calls + 1
        return calls

    guard = (16, 37, 96, 150)  # windows after the first of a 250-frame sentence
    sentence(random_model(config), 250, iter(guard))
    full = [shape[-1] for shape in shapes]
    shapes.clear()
    monkeypatch.setattr(generator_stream, "PIECE", generator_stream.PIECE // NARROW)
    model = random_model(narrow)
    sentence(model, 250, iter(guard))
    assert [shape[-1] for shape in shapes] == full
    shapes.clear()

    rng = np.random.default_rng(3)

    def windows() -> Iterator[int]:  # as the pace makes them, and any others
        while True:
            yield int(rng.choice([8, 16, 32, 64, 96, int(rng.integers(1, 200))]))

    calls = sum(sentence(model, int(rng.integers(1, 300)), windows(), waited=k % 2 == 0)
                for k in range(30))
    assert calls > 100
    assert len(set(shapes)) <= ONEDNN_CACHE_CAPACITY * 3 // 4, len(set(shapes))

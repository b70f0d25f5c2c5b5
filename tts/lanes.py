"""The order a text's audio is made in: by the lane that plays it, and by helpers meanwhile.

A text's sentences are decoded in order by the lane whose chunks the listener gets (the
playing lane), window by window (``tts.pace``). With helpers (``tts.pieces.Helpers``) the
work is shared out:

* after a sentence's first window, what is left of it is cut into pieces (``tts.pieces``)
  and all but the first go to the helpers;
* the sentences after it go to them too, whole, while they have room: their priors (the
  text encoder, the durations and the sampling, which draw the sampling noise in order) are
  computed here, their audio there; but the text's last sentence keeps a head here, so
  that the lanes end together rather than this one waiting for the helpers;
* beside a busy process (``tts.neighbours.crowded``) both wait for the playing lane's second
  window: a helper at work then shares the cores with that process and this lane, whose
  next window runs several times slower (``tts.pace.Pace.crowd``), and the priors are
  computed here between two chunks; and a sentence handed out keeps its head here, so
  that a helper slowed by that process is not all that stands between two sentences;
* a sentence the playing lane begins with nothing at the helpers (a text's first) has its
  text encoder shared with a second thread of this process (``tts.sharing``): the core
  its helper will decode on is free until the sentence's first window is out. A short
  sentence nobody plays before it is all made, the last of its text, is then not cut at
  all while that core is free: it is made here on intra-op threads
  (``tts.threads.intra_op``); beside a busy process it is cut, and its flow is made whole
  first, shared with the second thread (``tts.flow_shared``);
* a text nobody plays before it is all made is otherwise decoded as if it were played:
  each sentence but its last is begun in a small window, after which the helpers get the
  next sentence, so that whole sentences are decoded side by side, which costs less than
  any one sentence shared out over every core;
* when the playing lane gets to a span a helper has not begun, it takes it back and decodes
  it itself; of one a helper has begun it takes the audio as it comes, and while none has
  come it decodes a later span no helper has begun, or hands out the next sentence.

Every span joins exactly, so the audio is the same whoever made which span, and a seed
gives the same audio with helpers or without.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .flow_shared import reverse_shared
from .generator_stream import FRAMES_QUANTUM
from .incremental import rounded
from .neighbours import core_free, crowded
from .pace import Pace, next_end
from .pieces import HelperFailed, Helpers, Helping, Latents, Piece, PieceJob
from .sharing import sharing_thread
from .threads import intra_op, intra_op_available
from .vits import Vits
from .vits.model import PriorParts

# Frames: a sentence is cut for helpers only into pieces at least this long (the context a
# piece reads around it, 43 frames for a medium voice: 11 through the generator and 32
# through the flow behind them, is paid again for every cut).
MIN_PIECE = 48
FLOW_AHEAD = 256  # frames the flow may run ahead of the generator at most
# The last sentence of a text nobody plays before it is all made is short while it is at
# most this many times the context a cut computes again (``dc + fc``, 43 frames for a medium
# voice: 172 frames, 2 s of speech). Begun with the helpers idle, it is computed on intra-op
# threads rather than cut for a helper: two threads within each operation gain ~1.6x over
# one, two pieces 2x less the context, which the longer sentence pays for. Cut (no core was
# free), its flow is made whole first (``_flowed``). A longer one's pieces each run the flow
# over their own frames: the flow shared over two threads gained only 0.9-1.3x over one at
# 208-543 frames (AVX2), less than a cut's 43 frames of context cost, and the helper would
# idle until it was done.
SHORT_CONTEXTS = 4

Prior = tuple[Tensor | Iterable[Tensor], Tensor | None]
"""A sentence's prior latent, whole or in parts along time, and its speaker conditioning."""

_Whole = tuple[Latents, Tensor | None]
"""A sentence's prior, computed whole, and its speaker conditioning."""

Chunk = tuple[np.ndarray, int, bool]
"""Samples, the index of their sentence, and whether they are its last."""


@dataclass(eq=False)
class _Span:
    """Frames ``[start, end)`` of one sentence (``end`` None: to its end), in the order the
    audio is heard: decoded here (``piece``) or by a helper (``helping``)."""

    sentence: int
    latents: Latents
    g: Tensor | None
    start: int
    end: int | None
    helping: Helping | None = None
    asked: bool = False  # the helper was asked for it back (``claim``)
    piece: Piece | None = None
    ready: deque[tuple[np.ndarray, bool]] = field(default_factory=deque)  # made, not handed
    received: int = 0  # samples received from the helper
    skip: int = 0  # samples a local decode drops (its helper failed after sending them)
    finished: bool = False  # all of its audio made
    shared: bool = False  # what it left of its sentence went to the helpers (if any)
    intra: int = 0  # made here in one window on this many intra-op threads (``_start_playing``)

    @property
    def ends_sentence(self) -> bool:
        return self.end is None


class _Lanes:
    """One text's decoding (``decode_sentences``)."""

    def __init__(self, model: Vits, priors: Iterable[Prior], gain: float, first: int,
                 largest: int, pace: Pace, wanted: Callable[[], int | None] | None,
                 helpers: Helpers | None, whole: bool) -> None:
        self.model = model
        self.whole = whole
        self.priors = iter(priors)
        self.pulled: Prior | None = None  # taken from ``priors`` to see whether one follows
        self.gain, self.first, self.largest = gain, first, largest
        self.pace = pace
        self.wanted = wanted
        self.helpers = helpers  # asked for its lanes each time: they may come and go
        self.spans: deque[_Span] = deque()
        self.sentences = 0  # priors taken
        self.more = True  # priors may be left
        self.planned = first  # the playing lane's next planned window
        self.hand_out_later = False  # a sentence is to be handed out after this first window
        # The next sentence's prior, begun on the sharing thread (``_begin_next_prior``): what
        # waits for it, and where it lands (None: there was no next sentence).
        self.prior_ahead: tuple[Callable[[], None], list[_Whole | None]] | None = None
        self.prior_after_window = False  # ... to be begun once the next window is made
        self.sample_rate = max(1, round(model.config.hop_length / pace.frame_seconds))

    # --- the playing lane -----------------------------------------------------------------

    def chunks(self) -> Iterator[Chunk]:
        try:
            while self.spans or self._start_playing():
                span = self.spans[0]
                if span.ready:
                    samples, last = span.ready.popleft()
                    if last:
                        self.spans.popleft()
                    self.pace.out(len(samples), self.sample_rate)
                    yield samples, span.sentence, last and span.ends_sentence
                elif span.helping is None:
                    self._window(span, playing=True)
                else:
                    self._from_helper(span)
        finally:
            for span in self.spans:
                if span.helping is not None:
                    span.helping.cancel()

    def _start_playing(self) -> bool:
        """The next sentence, to be played from its first frame (no helper has it); False if
        there is none. Called only once every span is out, so nothing of this text is with
        the helpers: with two lanes or more, the core a helper would use is free."""
        lend = self.helpers is not None and self.helpers.lanes >= 2
        taken = self._take_prior(lend=lend)
        if taken is None:
            return False
        k, latents, g = taken
        dc, fc = self.model.dec.receptive_field, self.model.flow.receptive_field
        with torch.inference_mode():
            # Enough for the first window, its look-ahead and a window after it: then the
            # sentence is known to go on past what the first window reads.
            latents.fill(2 * (self.largest if self.whole else self.first) + dc + fc + 1)
        if self.whole and latents.complete:
            # Its noise is all drawn: the next sentence may be looked for without changing
            # what it draws (and a whole text is all known: looking waits for nothing).
            self._look_ahead()
        if lend and not latents.complete:
            # The rest of a long sentence's prior (its durations: tens of milliseconds) is
            # computed on the helper's idle core while the first window is decoded here.
            # The cut after that window needs it: computed then, it stands between the
            # first chunk and the second, where a slow CPU has too little audio in hand to
            # cover it (bench/README.md, "Measurements behind the defaults").
            latents.begin_next(sharing_thread().begin)
        if latents.complete and latents.frames == 0:
            return self._start_playing()  # a sentence of no frames: the next one
        span = _Span(k, latents, g, 0, None)
        self.spans.append(span)
        if (lend and self._alone(k) and self._short(latents) and intra_op_available()
                and core_free()):
            # A short sentence nobody plays before it is all made, the last of its text,
            # begun with the helpers idle: made here in one window on their cores as
            # intra-op threads. Cut for a helper, each half computes the model's context at
            # the cut again, and the flow made whole before the cut gains little on two
            # threads of the interpreter (bench/README.md, "Measurements behind the
            # defaults").
            assert self.helpers is not None
            span.intra, span.shared = self.helpers.lanes, True
        elif latents.complete:  # a short sentence's prior is whole already: share it now
            self._share_before_first_window(span)
            if lend and self.whole:
                self._begin_next_prior()
            elif lend:
                self.prior_after_window = True
        return True

    def _share_before_first_window(self, span: _Span) -> None:
        """Cut a whole sentence for the helpers before its first window; the next sentence
        is handed out once that window is out (handing it out computes its prior)."""
        self._share(span, hand_out=False)
        self.hand_out_later = True

    def _begin_next_prior(self) -> None:
        """Compute the next sentence's prior on the sharing thread, the helpers' idle core,
        while this lane decodes this one. Handing that sentence out after this one's first
        window needs it: computed then, here, it stands between the first chunk and the
        second (tens of milliseconds for a sentence of a few seconds, hundreds for a long one
        on a slow CPU, against a first chunk of a tenth of a second of audio: a gap). Its
        noise is drawn in order all the same: nothing else of this text draws any meanwhile
        (this sentence's prior is whole).

        Where a listener waits for the first chunk, it is begun once the first window is
        made (``prior_after_window``), not before: the two threads take turns on the
        interpreter's lock, and computed beside the first window it put Wyoming's paragraph's
        first audio 55 ms after the call rather than 43 (bench/README.md, "Measurements
        behind the defaults")."""
        if not self.more or self.prior_ahead is not None:
            return
        priors = self.priors  # not ``self``: an abandoned text leaves no reference cycle
        pulled, self.pulled = self.pulled, None
        got: list[_Whole | None] = []

        def whole() -> None:
            prior = pulled if pulled is not None else next(priors, None)
            if prior is None:
                got.append(None)
                return
            parts, g = prior
            with torch.inference_mode():
                latents = Latents(parts)
                latents.fill(sys.maxsize)
            got.append((latents, g))

        wait = sharing_thread().begin(whole)
        if wait is not whole:
            self.prior_ahead = (wait, got)
        else:  # not begun (no core free): computed when handed out
            self.pulled = pulled

    def _short(self, latents: Latents) -> bool:
        """A whole sentence at most ``SHORT_CONTEXTS`` times a cut's context long."""
        context = self.model.dec.receptive_field + self.model.flow.receptive_field
        return latents.complete and latents.frames <= SHORT_CONTEXTS * context

    def _alone(self, sentence: int) -> bool:
        """Nobody plays the text before it is all made, and nothing of it follows this
        sentence: nothing else of the text can run beside it."""
        return self.whole and not self.more and sentence == self.sentences - 1

    def _first_window(self, span: _Span) -> int:
        """The first window of a sentence the playing lane begins: small where a listener may
        be waiting for it, or where the helpers get work after it (the rest of the sentence,
        or the next one); otherwise, audio nobody plays before it is all made, the
        largest. A played sentence already cut for a helper beside a busy process
        (``Pace.crowd``) begins with twice the plan: that helper shares the cores with this
        lane from the start, and with a first window of the plan the short command's
        second chunk came late in a quarter of the runs (bench/README.md, "Measurements
        behind the defaults")."""
        if not self.whole:
            helping = span.end is not None and self.pace.crowded
            return 2 * self.first if helping else self.first
        helped = self.helpers is not None and self.helpers.lanes >= 2
        work_after = not span.shared or (self.hand_out_later and self.more)
        return self.first if helped and work_after else self.largest

    def _prior_pending(self) -> bool:
        """The next sentence's prior is being computed on the sharing thread. Handing that
        sentence out waits until it is done: waited for, a long sentence's prior (a quarter
        of a second on a slow CPU) would stand between this sentence's chunks."""
        return self.prior_ahead is not None and not self.prior_ahead[1]

    def _window(self, span: _Span, playing: bool) -> None:
        """Decode ``span``'s next window here: sized for the listener if ``playing``, else the
        largest (it is being made ahead of its turn)."""
        if (span.piece is None and span.start == 0 and span.end is None and not span.shared
                and span.latents.complete):
            # A sentence handed out whole and taken back before any helper began it (they
            # are busy, or this lane got to it first): the helpers get their pieces of it
            # now, not after its first window, which would leave them idle meanwhile (in a
            # text made whole, for every such sentence).
            self._share_before_first_window(span)
        piece = span.piece
        asked: int | None = None
        if piece is None:
            if playing and span.start == 0:
                self.planned = self._first_window(span)
        else:
            cut = span.start == 0 and not span.shared  # the rest of the sentence is wanted
            later = self.hand_out_later and not self._prior_pending()
            if cut or later:
                busy = self._crowded()
                if self._may_hand_out(piece, busy):
                    if cut:
                        self._share(span, busy)
                    else:
                        self.hand_out_later = False
                        self._hand_out(busy)
        if playing and self.wanted is not None:
            asked = self.wanted()
        size = self.pace.size(self.planned, self.largest, asked) if playing else self.largest
        if piece is not None:
            # Past its first window a piece's pushes are its windows, and the generator
            # computes each over whole quanta of frames (``StreamConv``): a window of the
            # rounded length costs what this one would (a demand's too, but for the flow's
            # few frames more), and makes audio of the padding.
            size = min(self.largest, rounded(size, FRAMES_QUANTUM))
        latents = span.latents
        reached = span.start if piece is None else piece.reached
        stop = span.end if piece is None else piece.end
        limit = latents.frames if stop is None else stop
        # The tail folded in: what the buffered audio pays for, up to the largest window,
        # while nothing else waits (a window the others were not told of would delay them);
        # else less than a first one.
        fold = (min(self.pace.foldable(size), self.largest - size)
                if playing and asked is None else 0)
        least = (self.largest if self._alone(span.sentence) else self.first) - 1
        end = next_end(reached, size, max(least, fold), limit,
                       latents.complete or stop is not None)
        if piece is None:
            # A sentence's first window that a listener waits for (no audio in hand) is
            # computed at its own length where that is the plan's. Any other is rounded
            # (``StreamConv``): one sized by what is buffered or by a demand, or made longer
            # or shorter than the plan by the tail folded in or by the end of a piece of the
            # sentence, whose lengths vary with the moment and the sentence and would each
            # build kernels met once, for as long as the kernel cache takes them in.
            waited = (playing and span.start == 0 and self.pace.spare() <= 0
                      and size == self.planned and end - span.start == size)
            piece = span.piece = Piece(self.model, span.latents, span.g, self.gain,
                                       span.start, span.end, self.pace.clock,
                                       exact_start=waited)
        before, started = piece.reached, self.pace.clock()
        ahead = (0 if asked is not None else
                 self.pace.flow_ahead(FLOW_AHEAD, piece.flow_ran, end - reached, self.planned))
        with intra_op(span.intra if playing else 1):
            piece.step(end, ahead)
        self.pace.ran(piece.reached - before, self.pace.clock() - started)
        if self.prior_after_window:
            self.prior_after_window = False
            self._begin_next_prior()
        if playing:
            self.planned = self.largest if self.whole else min(self.largest, 2 * size)
        chunks = list(piece.take())
        if span.skip:
            chunks = _dropped(chunks, span)
        span.finished = piece.finished
        if span.finished and not chunks:
            chunks = [np.zeros(0, np.float32)]
        for k, samples in enumerate(chunks):
            span.ready.append((samples, span.finished and k == len(chunks) - 1))

    def _from_helper(self, span: _Span) -> None:
        """Take what a helper has made of ``span``; while nothing has come, work on."""
        assert span.helping is not None
        if not span.asked:
            span.asked = True
            if span.helping.claim():
                span.helping = None  # never begun: decoded here, as it is needed
                return
        try:
            got = span.helping.take(wait=False)
            if not got and not self._meanwhile(span):
                got = span.helping.take(wait=True)
        except HelperFailed:
            span.helping, span.skip = None, span.received  # decoded here from where it was
            return
        for samples, last in got:
            span.ready.append((samples, last))
            span.received += len(samples)
        span.finished = bool(got) and got[-1][1]

    def _meanwhile(self, waiting: _Span) -> bool:
        """Something useful while ``waiting``'s helper has sent nothing: hand out the next
        sentence if the helpers have room, else decode a window of a later span no helper
        has begun. False if there is nothing to do but wait.

        A span taken back from a helper's queue is decoded only on the next call: the queue
        it leaves may take the next sentence first. Decoded at once, the helper would run
        dry while this lane makes a large window, and the text's last sentence would be
        handed out only after it, with this lane then idle while a helper makes all of it.
        """
        if self._hand_out():
            return True
        for span in list(self.spans)[1:]:
            if span.helping is not None and not span.asked:
                span.asked = True
                if span.helping.claim():
                    span.helping = None
                    return True
            if span.helping is None and not span.finished:
                self._window(span, playing=False)
                return True
        return False

    # --- what the helpers get -------------------------------------------------------------

    def _crowded(self) -> bool:
        """``tts.neighbours.crowded`` where there are helpers to hand work to: it reads
        ``/proc``, and without helpers nothing depends on it."""
        return self.helpers is not None and self.helpers.lanes >= 2 and crowded()

    def _may_hand_out(self, piece: Piece, busy: bool) -> bool:
        """Whether the helpers may get work after this window of the playing sentence: at
        once, unless another process keeps a core busy (``tts.neighbours.crowded``); then
        only from its second window on. Beside a busy process, the cut and handing out a
        sentence compute priors here (nothing shares them then), and the helper's start
        slows this lane's next window several times (``tts.pace.CROWDED``): after the
        first window, with a tenth of a second of audio in hand, the second chunk came
        late (bench/README.md, "Measurements behind the defaults"). ``busy``: ``_crowded``,
        read before any of that work is handed out."""
        return piece.steps >= 2 or not busy

    def _handed_out(self, busy: bool) -> None:
        """Work was just handed to the helpers: beside a busy process (``busy``: read with
        ``crowded`` before the hand-out), this lane's next window shares the cores with it
        and with them (``Pace.crowd``). One reading, made before the first of the hand-outs
        that follow it, serves them all: the question is whether another process competes
        for the cores the work will run on, and a reading right after a hand-out would
        find the helper's thread that took it just gone back to sleep, which Linux may
        count as runnable a while (``tts.neighbours``)."""
        if busy:
            self.pace.crowd()

    def _share(self, span: _Span, busy: bool | None = None, hand_out: bool = True) -> None:
        """Once a sentence's prior is whole (at once for a short one, after the first
        window for a long one): hand what the playing lane has not decoded of it to the
        helpers in pieces (``span`` keeps the first), and (``hand_out``) the next sentence
        while they have room. Handing out a sentence computes its prior here: before a
        sentence's first window, that would delay its first audio. ``busy``: the caller's
        reading of ``crowded`` (``_handed_out``), else read here."""
        span.shared = True
        if self.helpers is None or self.helpers.lanes < 2 or span.end is not None:
            return  # none to share with: decoded as if there were no helpers at all
        if busy is None:
            busy = self._crowded()
        with torch.inference_mode():
            span.latents.fill(sys.maxsize)
        start, frames = (0 if span.piece is None else span.piece.reached), span.latents.frames
        k = min(self.helpers.lanes, (frames - start) // MIN_PIECE)
        if k >= 2:
            if span.piece is None and self._alone(span.sentence) and self._short(span.latents):
                span.latents = self._flowed(span.latents, span.g)
            bounds = [start + round(i * (frames - start) / k) for i in range(k)] + [frames]
            span.end = bounds[1]
            if span.piece is not None:
                span.piece.end = bounds[1]
            at = self.spans.index(span) + 1
            for i in range(1, k):
                piece = self._handed(span.sentence, span.latents, span.g, bounds[i],
                                     None if i == k - 1 else bounds[i + 1])
                self.spans.insert(at + i - 1, piece)
            self._handed_out(busy)
        if hand_out:
            self._hand_out(busy)

    def _flowed(self, latents: Latents, g: Tensor | None) -> Latents:
        """A short sentence's prior through the flow at once, on this thread and the sharing
        one (``tts.flow_shared``), for the last sentence of audio nobody plays before it is
        all made that is cut for the helpers because no core was free for intra-op threads
        (``SHORT_CONTEXTS``): its pieces then run the generator alone, and none runs the
        flow over its context again. Not for audio played as it comes: the whole flow
        before the first window puts a short command's first audio ~25 ms later, for ~15 ms
        less in all."""
        with torch.inference_mode():
            assert latents.z is not None
            z = reverse_shared(self.model.flow, latents.z, g, sharing_thread().run)
        return Latents(z[:, :, 0], flowed=True)

    def _hand_out(self, busy: bool | None = None) -> bool:
        """Hand the next sentence to the helpers, whole (in pieces if they are several),
        while fewer spans wait for them than there are helpers (so none goes idle). False
        if none was. ``busy``: the caller's reading of ``crowded`` (``_handed_out``), else
        read here.

        Beside a busy process (``tts.neighbours.crowded``) a sentence long enough to cut keeps
        its head here, the rest going to the helpers: a helper then shares two cores with
        that process and this lane, and a whole sentence of a few seconds handed out after
        one of under a second ("Good morning. It is seven o'clock and ...") can come after
        the audio before it has run out (in 11 of 284 paragraphs measured, by up to 0.2 s).
        Its head, decoded here while the helper makes the rest, is audio as soon as the
        sentence before it ends (bench/README.md, "Measurements behind the defaults")."""
        if self.helpers is None or not self.more:
            return False
        waiting = sum(1 for s in self.spans
                      if s.helping is not None and not s.asked and s.helping.queued())
        if waiting >= self.helpers.lanes - 1:
            return False
        if busy is None:
            busy = self._crowded()
        taken = self._take_prior()
        if taken is None:
            return False
        k, latents, g = taken
        with torch.inference_mode():
            latents.fill(sys.maxsize)
        frames = latents.frames
        # Beside a busy process a helper's whole sentence can come after the audio before it
        # has run out; its head is kept here, to be decoded as the audio before it ends.
        keep = busy and frames >= 2 * MIN_PIECE
        head = 0 if keep else self._head_of_last(frames)
        if head:  # the text's last: this lane's head, the rest in pieces for the helpers
            rest = min(self.helpers.lanes - 1, (frames - head) // MIN_PIECE)
            bounds = [0] + [head + round(i * (frames - head) / rest) for i in range(rest)]
        else:
            n = (min(self.helpers.lanes, frames // MIN_PIECE) if keep
                 else max(1, min(self.helpers.lanes - 1, frames // MIN_PIECE)))
            bounds = [round(i * frames / n) for i in range(n)]
        bounds.append(frames)
        keep = keep or head > 0
        n = len(bounds) - 1
        for i in range(n if frames else 0):
            end = None if i == n - 1 else bounds[i + 1]
            self.spans.append(_Span(k, latents, g, 0, end, shared=True) if keep and i == 0
                              else self._handed(k, latents, g, bounds[i], end))
        self._handed_out(busy)
        return True

    def _head_of_last(self, frames: int) -> int:
        """Frames of the head this lane keeps of a sentence of ``frames`` being handed out,
        if it is the text's last: 0 to hand it out whole.

        Handed out whole, the last sentence is all the helper has left to do, and this lane,
        once through what it holds, waits for it: "Good morning. It is seven o'clock and
        the coffee is ready." left this lane idle for the second sentence's 130 ms. So the
        last sentence is cut where the lanes end together, each with its share of what is
        left (this lane's own spans, the helpers' unfinished ones and this sentence), this
        lane taking the head: it plays the head next, and the helpers begin the rest at
        once. A cut costs each side the model's context at it, so a head under
        ``MIN_PIECE`` is not worth one. Whether the sentence is the last is looked for among
        the priors (``_look_ahead``), which wait for nothing: of a text still arriving
        (``tts.compose.StepFeed``) they hold what has come, and a sentence that comes later
        is rendered after this one."""
        if self.helpers is None or self._look_ahead():
            return 0
        here = helpers = 0
        hop = self.model.config.hop_length
        for span in self.spans:
            limit = span.latents.frames if span.end is None else span.end
            if span.helping is not None:
                helpers += max(0, limit - span.start - span.received // hop)
            elif not span.finished:
                here += max(0, limit - (span.start if span.piece is None else span.piece.reached))
        share = (here + helpers + frames) / self.helpers.lanes
        head = round(share - here)
        return head if head >= MIN_PIECE and frames - head >= MIN_PIECE else 0

    def _look_ahead(self) -> bool:
        """Whether a sentence follows those taken: its prior is pulled (``pulled``, which
        ``_take_prior`` takes next) if it has not been, and computes nothing until its parts
        are taken. Call once the sentences taken have drawn all their noise."""
        if self.more and self.pulled is None:
            self.pulled = next(self.priors, None)
            self.more = self.pulled is not None
        return self.more

    def _handed(self, sentence: int, latents: Latents, g: Tensor | None, start: int,
                end: int | None) -> _Span:
        assert self.helpers is not None
        job = PieceJob.cut(self.model, latents, start, end, g, self.gain)
        return _Span(sentence, latents, g, start, end, self.helpers.decode(self.model, job))

    def _take_prior(self, lend: bool = False) -> tuple[int, Latents, Tensor | None] | None:
        """The next sentence's prior. ``lend``: a helper's core is free (``_start_playing``),
        so the sentence's text encoder shares its phases with this process's second thread
        (``tts.sharing``)."""
        if not self.more:
            return None
        if self.prior_ahead is not None:
            wait, got = self.prior_ahead
            self.prior_ahead = None
            wait()
            if got[0] is None:
                self.more = False
                return None
            self.sentences += 1
            return self.sentences - 1, *got[0]
        prior = self.pulled if self.pulled is not None else next(self.priors, None)
        self.pulled = None
        if prior is None:
            self.more = False
            return None
        parts, g = prior
        if lend and isinstance(parts, PriorParts):
            parts.run = sharing_thread().run
        self.sentences += 1
        with torch.inference_mode():
            return self.sentences - 1, Latents(parts), g


def _dropped(chunks: list[np.ndarray], span: _Span) -> list[np.ndarray]:
    """``chunks`` without the ``span.skip`` samples at their start (counted down)."""
    out = []
    for samples in chunks:
        cut = min(span.skip, len(samples))
        span.skip -= cut
        if cut < len(samples):
            out.append(samples[cut:])
    return out


def decode_sentences(model: Vits, priors: Iterable[Prior], gain: float = 1.0,
                     first: int = 8, largest: int = 96, pace: Pace | None = None,
                     wanted: Callable[[], int | None] | None = None,
                     helpers: Helpers | None = None, whole: bool = False) -> Iterator[Chunk]:
    """Flow + generator over the sentences' priors, in order; each sentence's chunks join
    into exactly ``model.decode`` of its prior.

    ``whole``: nobody plays the audio before it is all made, and ``priors`` is the whole
    text (the next sentence is looked for once a sentence's prior is drawn: a text still
    arriving would be waited for). Windows are then small only where the helpers get work
    after them; the last sentence has every core to itself.

    The playing lane's windows: ``first`` frames, then at least doubling, as ``pace`` lets
    them grow (without one, exactly doubling), never over ``largest``; a tail shorter than
    ``first`` folded into the window before it. With ``wanted`` (a ``Demand`` in frames), a
    window is made as long as it asks where that is longer, up to ``largest``. ``priors`` is
    taken lazily, in order: a sentence's prior is computed when it is about to be needed or
    handed out.
    """
    lanes = _Lanes(model, priors, gain, first, largest, pace or Pace.plan_only(), wanted,
                   helpers, whole)
    yield from lanes.chunks()

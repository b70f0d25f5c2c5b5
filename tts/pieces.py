"""A sentence's audio made in pieces that can be decoded at the same time, and still join into
exactly the one-shot audio.

The flow and the generator run over a sentence's latent frames incrementally
(``StreamingFlow``, ``StreamingGenerator``): each frame goes through them once, in order. That
order is what a listener needs first, but it keeps a sentence on one core. A ``Piece`` is a
span of frames decoded by a flow and a generator of its own. One that starts inside the
sentence first runs them over the frames before it that its first samples depend on (the
generator's receptive field, and the flow's behind that: 43 frames for a medium voice) and
drops what they make of those: from its first frame on, its audio is the one-shot audio. A
piece that ends inside the sentence reads the frames after it that its last samples depend
on and stops its audio at its end. So a sentence cut into pieces decoded on several cores,
joined in order, is the same audio, for the cost of decoding those context frames twice.
Pieces of a sentence already through the flow (``Latents.flowed``) run the generator alone,
and read only its context.

A piece is stepped a window at a time (``step``). The lane that plays the sentence steps its
own; a later piece can be handed to a helper (``Helpers``) as a ``PieceJob``: the prior frames
it reads and where it starts and ends in them, which is all another process needs besides
the model. The helper sends back its audio, or, if it has not begun when the playing lane
gets there, the playing lane takes the piece back and decodes it itself.
"""

from __future__ import annotations

import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from .flow_stream import StreamingFlow
from .generator_stream import StreamingGenerator
from .sharing import Task
from .vits import Vits, nhwc


class Latents:
    """A sentence's prior latent ``z_p``, channels-last ``[1, c, 1, frames]``, joined from its
    parts (``Vits.prior_parts``) as pieces need them. The parts draw their sampling noise in
    order, whichever lane asks first. ``flowed``: whole, and through the flow already
    (``flow_shared.reverse_shared``), so pieces run the generator alone."""

    def __init__(self, parts: Iterable[Tensor] | Tensor, flowed: bool = False) -> None:
        whole = parts if isinstance(parts, Tensor) else None
        assert whole is not None or not flowed
        self.flowed = flowed
        self._parts: Iterator[Tensor] = iter(parts if whole is None else [whole])
        self._lock = threading.Lock()
        self.z: Tensor | None = None
        self.complete = False  # every part joined: the sentence's length is known
        if whole is not None:
            with torch.inference_mode():
                self.fill(whole.shape[-1] + 1)  # one part: it is all there is

    def fill(self, frames: int) -> int:
        """Joins parts until ``frames`` are here or there are no more; returns how many are.
        Call under ``torch.inference_mode``. Complete as soon as the last part is joined,
        where the parts say which is the last (``PriorParts``, a list)."""
        with self._lock:
            while not self.complete and self.frames < frames:
                part = next(self._parts, None)
                if part is None:
                    self.complete = True
                    break
                part = nhwc(part)  # the layout both halves work in: every window is contiguous
                self.z = part if self.z is None else torch.cat([self.z, part], dim=-1)
                self.complete = operator.length_hint(self._parts, -1) == 0
            return self.frames

    def begin_next(self, begin: Callable[[Task], Callable[[], None]]) -> None:
        """Have the next part computed by ``begin`` meanwhile, if the parts can
        (``PriorParts.begin_next``); joining it then waits for it."""
        ahead = getattr(self._parts, "begin_next", None)
        if ahead is not None and not self.complete:
            ahead(begin)

    @property
    def frames(self) -> int:
        return 0 if self.z is None else self.z.shape[-1]


def apply_gain(samples: np.ndarray, gain: float) -> np.ndarray:
    if gain != 1.0:
        samples = samples * gain
    clipped: np.ndarray = np.clip(samples, -1.0, 1.0).astype(np.float32, copy=False)
    return clipped


class Piece:
    """Frames ``[start, end)`` of one sentence (``end`` None: to the sentence's end), decoded
    by a flow and a generator of its own. ``exact_start``: its first window is one a
    listener waits for (``StreamingGenerator``)."""

    def __init__(self, model: Vits, latents: Latents, g: Tensor | None, gain: float,
                 start: int = 0, end: int | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 exact_start: bool = False) -> None:
        self.latents = latents
        self.clock = clock
        self.flow_ran: tuple[int, float] | None = None  # the last flow push: frames, seconds
        self.gain = gain
        self.start, self.end = start, end
        self.hop = model.config.hop_length
        self.dc = model.dec.receptive_field
        self.fc = 0 if latents.flowed else model.flow.receptive_field
        with torch.inference_mode():
            self._flow = None if latents.flowed else StreamingFlow(model.flow, g)
            self._gen = StreamingGenerator(model.dec, g, exact_start)
        # Frames the generator's first samples depend on, and the flow's first latent
        # frames: at the sentence's start, only what its padding stands for.
        self._pushed = max(0, start - self.dc)  # next latent frame for the generator
        self._fed = max(0, self._pushed - self.fc)  # next prior frame for the flow
        self._drop_latent = self._pushed - self._fed  # flow output before _pushed: context
        self._drop_audio = (start - self._pushed) * self.hop  # generator output before start
        self._latent: list[Tensor] = []  # flow output not yet given to the generator
        self.reached = start  # frames whose audio has been made
        self.finished = False  # all of its audio made (``out`` may still hold some)
        self.out: deque[np.ndarray] = deque()  # audio made, not yet taken
        self._emitted = 0  # samples made, from the piece's start
        self._final = False  # the generator has had the sentence's last frame
        self._flow_final = False  # ... and the flow its last prior frame
        self.steps = 0

    @property
    def sentence_end(self) -> bool:
        """Whether this piece runs to the end of the sentence."""
        return self.end is None

    def step(self, upto: int, ahead: int = 0) -> None:
        """Decode through frame ``upto`` (or the piece's end, whichever comes first), running
        the flow ``ahead`` frames further than that needs. Appends the audio to ``out``."""
        latents = self.latents
        with torch.inference_mode():
            end = self.end
            if end is not None:
                upto = min(upto, end)
            frames = latents.fill(upto + self.dc + self.fc + 1)
            if latents.complete and (end is None or end >= frames):
                end, upto = None, min(upto, frames)  # it runs to the sentence's end
            need = min(frames, upto + self.dc)  # the audio through `upto` needs this look-ahead
            final = latents.complete and need == frames  # the sentence's last latent frame
            if frames and (need > self._pushed or (final and not self._final)):
                self.out.append(self._decode(need, frames, final, end, ahead))
                self._final = final
        self.steps += 1
        self.reached = upto
        self.finished = upto >= (frames if end is None else end) and (
            end is not None or latents.complete)

    def _decode(self, need: int, frames: int, last: bool, end: int | None, ahead: int
                ) -> np.ndarray:
        """Latent frames through ``need`` into the generator (the flow pushed as far as
        they need, and ``ahead``), its new samples out."""
        latents = self.latents
        target = min(frames, need + self.fc)
        flush = latents.complete and target == frames and not self._flow_final
        if target > self._fed or flush:
            if ahead and latents.complete:
                # The last prior frame this piece reads: the sentence's, or its end's
                # look-ahead through the generator and the flow.
                stop = frames if end is None else min(frames, end + self.dc + self.fc)
                target = min(stop, target + max(0, ahead))
                if stop - target <= ahead // 2:  # no sliver left for a push of its own
                    target = stop
            assert latents.z is not None
            started = self.clock()
            self._flow_final = latents.complete and target == frames
            out = latents.z[..., self._fed:target]
            if self._flow is not None:
                out = self._flow.push(out, final=self._flow_final)
                self.flow_ran = (target - self._fed, self.clock() - started)
            self._fed = target
            if self._drop_latent:
                cut = min(self._drop_latent, out.shape[-1])
                out, self._drop_latent = out[..., cut:], self._drop_latent - cut
            self._latent.append(out)
        z = torch.cat(self._latent, dim=-1) if len(self._latent) > 1 else self._latent[0]
        take = need - self._pushed
        self._latent = [z[..., take:]]
        audio = self._gen.push(z[..., :take], final=last)
        self._pushed = need
        if self._drop_audio:
            cut = min(self._drop_audio, audio.shape[0])
            audio, self._drop_audio = audio[cut:], self._drop_audio - cut
        samples = apply_gain(audio.numpy(), self.gain)
        if end is not None:  # the samples past the end are the next piece's
            samples = samples[: max(0, (end - self.start) * self.hop - self._emitted)]
        self._emitted += len(samples)
        return samples

    def take(self) -> Iterator[np.ndarray]:
        """The audio made and not yet taken, in order."""
        while self.out:
            yield self.out.popleft()


@dataclass(frozen=True)
class PieceJob:
    """A piece for a helper: the prior frames it reads, ``[1, c, n]`` (its own and the
    context around it), where it starts and ends in them (``end`` None: at their
    end, which is the sentence's), the speaker conditioning, the gain, and whether the
    frames are through the flow already (``Latents.flowed``)."""

    z: Tensor
    start: int
    end: int | None
    g: Tensor | None
    gain: float
    flowed: bool = False

    @classmethod
    def cut(cls, model: Vits, latents: Latents, start: int, end: int | None,
            g: Tensor | None, gain: float) -> PieceJob:
        """Frames ``[start, end)`` of a sentence whose prior is complete in ``latents``."""
        assert latents.complete and latents.z is not None
        reach = model.dec.receptive_field + (0 if latents.flowed else model.flow.receptive_field)
        lo = max(0, start - reach)
        hi = latents.frames if end is None else min(latents.frames, end + reach)
        return cls(latents.z[:, :, 0, lo:hi].contiguous(), start - lo,
                   None if end is None else end - lo, g, gain, latents.flowed)

    def decode(self, model: Vits, window: int) -> Iterator[tuple[np.ndarray, bool]]:
        """Its audio, a window of ``window`` frames at a time (the flow as far ahead), each
        with whether it is the last."""
        piece = Piece(model, Latents(self.z, self.flowed), self.g, self.gain, self.start,
                      self.end)
        while not piece.finished:
            piece.step(piece.reached + window, window)
            chunks = list(piece.take())
            for k, samples in enumerate(chunks):
                yield samples, piece.finished and k == len(chunks) - 1
            if piece.finished and not chunks:
                yield np.zeros(0, np.float32), True


class HelperFailed(Exception):
    """A helper could not finish a piece it had begun (it died, or its decoding failed)."""


class Helping(Protocol):
    """A piece handed to a helper."""

    def claim(self) -> bool:
        """The playing lane wants the piece: True if the helper had not begun it (it never
        will; the caller decodes it), False if its audio is coming (``take``)."""
        ...

    def queued(self) -> bool:
        """Whether the helper has yet to begin it."""
        ...

    def take(self, wait: bool) -> list[tuple[np.ndarray, bool]]:
        """The audio that has arrived since the last call, in order, each chunk with whether
        it is the piece's last; with ``wait``, after waiting for some if none has. Raises
        ``HelperFailed``."""
        ...

    def cancel(self) -> None:
        """Nobody wants the piece any more."""
        ...


class Helpers(Protocol):
    """Lanes that decode pieces of sentences while the lane that plays them decodes others
    (``tts.lanes``). ``lanes``: how many a synthesis may use now, the playing lane's own
    included; it may change from one call to the next (1: hand out nothing now)."""

    @property
    def lanes(self) -> int: ...

    def decode(self, model: Vits, job: PieceJob) -> Helping: ...

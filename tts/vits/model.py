"""The whole voice model (``Vits``): the four parts in the paper's order, the speaker
embedding ``emb_g``, sampling the prior, and one-shot decoding."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from ..sharing import Phases, Task, in_order
from .config import VitsConfig
from .dec import Generator
from .dp import DurationPredictor, StochasticDurationPredictor
from .enc_p import TextEncoder
from .flow import ResidualCouplingBlock

# Ids whose durations a long sentence's first part of the prior covers (``prior_parts``):
# about 100 latent frames at length scale 1 (more ids when faster), enough for the first
# window and its look-ahead (60 frames for a medium voice).
PRIOR_HEAD = 48


class PriorParts(Iterator[Tensor]):
    """A sentence's prior latent in parts along time (``Vits.prior_parts``), each computed
    when it is taken.

    ``len_hint`` says 0 once the last part has been taken: whoever joins them then knows the
    sentence's whole length, without asking for a part that is not there (asked after the
    head, that would compute all the rest at once). Knowing it, the flow may run ahead of
    the generator in large pushes (``tts.pieces.Piece``).

    ``run`` runs the text encoder's phases, which the first part computes: on this thread
    alone unless whoever takes that part has a second core to lend (``tts.lanes``). With
    that core, the next part may be computed on it meanwhile (``begin_next``).
    """

    def __init__(self, parts: Callable[[Callable[[Phases], None]],
                                       Iterator[tuple[Tensor, bool]]]) -> None:
        self._make: Callable[..., Iterator[tuple[Tensor, bool]]] | None = parts
        self._parts: Iterator[tuple[Tensor, bool]] = iter(())
        self.done = False  # the last part has been taken
        self.run: Callable[[Phases], None] = in_order
        self._ahead: tuple[Callable[[], None], list[tuple[Tensor, bool]]] | None = None

    def begin_next(self, begin: Callable[[Task], Callable[[], None]]) -> None:
        """Begin computing the next part with ``begin`` (``tts.sharing.SharingThread.begin``:
        on a second thread while this one goes on); taking the part waits for it. After
        the first part only: the parts draw their noise in order, and nothing else of this
        sentence's does meanwhile."""
        if self.done or self._make is not None or self._ahead is not None:
            return
        got: list[tuple[Tensor, bool]] = []
        parts = self._parts  # not ``self``: an abandoned sentence leaves no reference cycle
        self._ahead = (begin(lambda: got.append(next(parts))), got)

    def __iter__(self) -> PriorParts:
        return self

    def __next__(self) -> Tensor:
        if self.done:
            raise StopIteration
        if self._make is not None:  # made now, with the ``run`` set by then
            self._parts, self._make = self._make(self.run), None
        if self._ahead is not None:
            wait, got = self._ahead
            self._ahead = None
            wait()
            part, self.done = got[0]
        else:
            part, self.done = next(self._parts)
        return part

    def __length_hint__(self) -> int:
        return 0 if self.done else 1


class Vits(nn.Module):
    """Everything a Piper voice holds. ``tts.stream`` drives the halves separately."""

    def __init__(self, c: VitsConfig) -> None:
        super().__init__()
        self.config = c
        self.enc_p = TextEncoder(c)
        self.dp: StochasticDurationPredictor | DurationPredictor = (
            StochasticDurationPredictor(c) if c.use_sdp else DurationPredictor(c))
        self.flow = ResidualCouplingBlock(c)
        self.dec = Generator(c)
        if c.n_speakers > 1:
            self.emb_g = nn.Embedding(c.n_speakers, c.gin_channels)

    def speaker_embedding(self, speaker_id: int | None) -> Tensor | None:
        if self.config.n_speakers <= 1:
            return None
        sid = torch.tensor([speaker_id or 0], dtype=torch.long)
        emb: Tensor = self.emb_g(sid)
        return emb.unsqueeze(-1)  # [1, gin, 1]

    def prior(self, ids: Tensor, g: Tensor | None, noise_scale: float, length_scale: float,
              noise_w: float, generator: torch.Generator | None = None,
              head: int = PRIOR_HEAD) -> Tensor:
        """Phoneme ids ``[1, t]`` -> sampled prior latent ``z_p`` ``[1, inter, frames]``."""
        return torch.cat(list(self.prior_parts(ids, g, noise_scale, length_scale, noise_w,
                                               generator, head)), dim=-1)

    def prior_parts(self, ids: Tensor, g: Tensor | None, noise_scale: float,
                    length_scale: float, noise_w: float,
                    generator: torch.Generator | None = None, head: int = PRIOR_HEAD
                    ) -> PriorParts:
        """``prior``'s latent in parts along time, the later ones computed when asked for.

        The text encoder attends over the whole sentence, but a log-duration depends only on
        the ids within the duration predictor's ``radius``. So for a long sentence the
        durations, expansion and noise of its first ``head`` ids come first (from the
        predictor run over ``head + radius`` ids), which is all its first audio needs, and
        the rest follows. Each part draws its own noise: the parts joined are what
        ``prior`` returns, whether or not anything ran in between.
        """
        return PriorParts(lambda run: self._prior_parts(
            ids, g, noise_scale, length_scale, noise_w, generator, head, run))

    def _prior_parts(self, ids: Tensor, g: Tensor | None, noise_scale: float,
                     length_scale: float, noise_w: float, generator: torch.Generator | None,
                     head: int, run: Callable[[Phases], None]
                     ) -> Iterator[tuple[Tensor, bool]]:
        """The parts of ``prior_parts``, each with whether it is the last."""
        x, m_p, logs_p = self.enc_p(ids[0], run)
        n = x.shape[0]
        noise = (torch.randn(1, 2, n, generator=generator) * noise_w)[0].t()
        head = math.ceil(head / min(1.0, length_scale))  # faster speech: fewer frames an id
        # Split where the head's predictor run (head + radius ids) is short of the whole
        # sentence by at least another radius; below that it saves next to nothing.
        cuts = [0, head, n] if n >= head + 2 * self.dp.radius else [0, n]
        frames = 0
        for a, b in zip(cuts, cuts[1:]):
            logw = self.log_durations(x, noise, g, a, b)
            durations = torch.ceil(torch.exp(logw) * length_scale).long()
            frames += int(durations.sum())
            if b == n and frames < 1:
                durations[-1] = 1
            # The monotonic path of one sequence is a repeat of each phoneme's statistics.
            m = torch.repeat_interleave(m_p[a:b], durations, dim=0).t()[None]
            logs = torch.repeat_interleave(logs_p[a:b], durations, dim=0).t()[None]
            eps = torch.randn(m.shape, generator=generator)
            yield (m + eps * torch.exp(logs) * noise_scale).contiguous(), b == n

    def log_durations(self, x: Tensor, noise: Tensor, g: Tensor | None, a: int, b: int
                      ) -> Tensor:
        """Log-durations of ids ``a:b`` given the whole sentence's hidden rows ``x`` and
        noise rows: the predictor over those ids and its ``radius`` each side, which gives
        what it gives over the whole sentence there (up to float rounding)."""
        r = self.dp.radius
        lo, hi = max(0, a - r), min(x.shape[0], b + r)
        logw: Tensor = self.dp(x[lo:hi], noise[lo:hi], g)
        return logw[a - lo : b - lo]

    def decode(self, z_p: Tensor, g: Tensor | None) -> Tensor:
        """Prior latent -> waveform ``[1, 1, frames * hop]`` (one shot)."""
        mask = torch.ones_like(z_p[:, :1])
        z = self.flow.reverse(z_p, mask, g)
        wav: Tensor = self.dec(z, g)
        return wav

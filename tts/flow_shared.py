"""The flow run backwards over a whole short sentence at once, its matrix products shared
out by columns between two threads (``tts.sharing``).

At two lanes a short sentence is cut in two: the playing lane decodes the first half and a
helper the second. Each half through a flow of its own (``tts.pieces.Piece``) reads the
frames beyond its cut that its outputs depend on, the flow's and the generator's reach (43
frames for a medium voice, in a short command of ~120), and runs the flow over them again:
1.8 times the flow's work in all, and the helper, last to finish, carries most of it. Run
once over the whole sentence here, the flow costs its own work; both halves then run the
generator alone (``Latents.flowed``).

Over ~120 frames the flow's products are bound by reading their weights (a 192 -> 384
convolution of five taps is 1.5 MB, read whole for every product), so the products are cut
by output columns, not by frames: each thread reads half the weights over all the rows, and
the sums are those of the one-shot model, column for column. Each coupling layer is a chain
of phases (``tts.sharing.Phases``): its WaveNet layers' gated convolutions and their
residual and skip products, each in two tasks a channel block apiece; the layer's input and
output products, small, in one.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from .sharing import Phases, Task
from .vits import WN, Conv, ResidualCouplingBlock, ResidualCouplingLayer, tanh
from .vits.layers import tap_products

BLOCKS = 2  # channel blocks a product is cut into: one per thread


class _CouplingRows:
    """One coupling layer run backwards over all frames, as time-major rows ``[t, c]``."""

    def __init__(self, layer: ResidualCouplingLayer, g: Tensor | None, frames: int) -> None:
        wn: WN = layer.enc
        self.layer, self.wn = layer, wn
        self.half, self.h, self.t = layer.half_channels, wn.hidden, frames
        self.pad = _weights(wn.in_layers[0])[0].shape[-1] // 2
        # The WaveNet's input, zero rows either side: the padding of its convolutions.
        self.hp = torch.zeros(frames + 2 * self.pad, self.h)
        self.acts = torch.empty(frames, self.h)
        self.skip = torch.zeros(frames, self.h)
        self.cond = None if g is None else wn.cond_layer(g).reshape(1, -1)
        self.blocks = [(round(i * self.h / BLOCKS), round((i + 1) * self.h / BLOCKS))
                       for i in range(BLOCKS)]

    def phases(self, x: list[Tensor], flip: bool) -> list[list[Task]]:
        """The layer's phases over ``x[0]`` (flipped first), which the last one replaces
        with the layer's output."""
        out: list[list[Task]] = [[partial(self._pre, x, flip)]]
        for i in range(self.wn.n_layers):
            out.append([partial(self._gate, i, a, b) for a, b in self.blocks])
            out.append([partial(self._res_skip, i, a, b) for a, b in self.blocks])
        out.append([partial(self._post, x)])
        return out

    def _pre(self, x: list[Tensor], flip: bool) -> None:
        if flip:
            x[0] = torch.flip(x[0], [1])
        w, bias = _weights(self.layer.pre)
        torch.addmm(bias, x[0][:, : self.half], w[:, :, 0].t(),
                    out=self.hp[self.pad : self.pad + self.t])

    def _gate(self, i: int, a: int, b: int) -> None:
        w, biases = _weights(self.wn.in_layers[i])
        h = self.h
        halves = []
        for lo in (a, h + a):  # the block's tanh columns, then its sigmoid columns
            hi = lo + b - a
            bias = biases[lo:hi]
            if self.cond is not None:
                bias = bias + self.cond[0, i * 2 * h + lo : i * 2 * h + hi]
            halves.append(tap_products(self.hp, w[lo:hi], bias, 1))
        torch.mul(tanh(halves[0]), torch.sigmoid(halves[1]), out=self.acts[:, a:b])

    def _res_skip(self, i: int, a: int, b: int) -> None:
        w3, bias = _weights(self.wn.res_skip_layers[i])
        w, h = w3[:, :, 0], self.h
        if i < self.wn.n_layers - 1:
            rows = self.hp[self.pad : self.pad + self.t]
            rows[:, a:b].add_(torch.addmm(bias[a:b], self.acts, w[a:b].t()))
            self.skip[:, a:b].add_(torch.addmm(bias[h + a : h + b], self.acts,
                                               w[h + a : h + b].t()))
        else:
            self.skip[:, a:b].add_(torch.addmm(bias[a:b], self.acts, w[a:b].t()))

    def _post(self, x: list[Tensor]) -> None:
        w, bias = _weights(self.layer.post)
        m = torch.addmm(bias, self.skip, w[:, :, 0].t())
        y = x[0].clone()
        y[:, self.half :].sub_(m)
        x[0] = y


def reverse_shared(flow: ResidualCouplingBlock, z: Tensor, g: Tensor | None,
                   run: Callable[[Phases], None]) -> Tensor:
    """Prior frames, channels-last ``[1, c, 1, t]``, through ``flow.reverse`` -> the latent,
    the same layout; ``run`` runs the phases (``tts.sharing``)."""
    t = z.shape[-1]
    x = [z.permute(0, 2, 3, 1).reshape(t, -1)]  # time-major rows: a view of channels-last
    phases: list[list[Task]] = []
    flip = False
    for step in reversed(flow.flows):
        if isinstance(step, ResidualCouplingLayer):
            phases += _CouplingRows(step, g, t).phases(x, flip)
            flip = False
        else:
            flip = not flip
    run(phases)
    rows = torch.flip(x[0], [1]) if flip else x[0]
    return rows.t().reshape(1, -1, 1, t)


def _weights(conv: object) -> tuple[Tensor, Tensor]:
    """A flow convolution's weight ``[out, in, k]`` (stored ``[out][k][in]``) and bias."""
    assert isinstance(conv, Conv), f"expected vits.Conv, got {type(conv).__name__}"
    assert conv.bias is not None  # every convolution of the flow has one
    return conv.weight.detach(), conv.bias.detach()

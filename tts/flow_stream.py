"""The flow run backwards incrementally: prior frames in, latent frames out, each computed once.

Like ``generator_stream`` for the generator: every convolution keeps the input tail its next
outputs need, and whatever runs beside a convolution (the WaveNet's residual path, its skip
outputs of different depths, a coupling layer's own input) waits in a FIFO until the
convolution has caught up. A coupling layer's outputs therefore lag its inputs by its reach
(4 WaveNet layers x 2 frames), the whole flow by ``receptive_field`` (32 frames), and what
comes out equals ``ResidualCouplingBlock.reverse`` over the whole sentence.

Tensors here are plain ``[1, c, t]``: at the flow's frame rate they are small.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .vits import WN, ResidualCouplingBlock, ResidualCouplingLayer


def _join(a: Tensor | None, b: Tensor) -> Tensor:
    return b if a is None or a.shape[-1] == 0 else torch.cat([a, b], dim=2)


class _Conv:
    """A 'same' 1-D convolution fed piece by piece; outputs lag inputs by its radius."""

    def __init__(self, conv: nn.Module) -> None:
        assert isinstance(conv, nn.Conv1d)
        self.weight, self.bias = conv.weight, conv.bias
        self.dilation = int(conv.dilation[0])
        pad = conv.padding
        self.r = int(pad[0]) if isinstance(pad, tuple) else 0
        self.tail: Tensor | None = None

    def push(self, x: Tensor, final: bool) -> Tensor:
        r = self.r
        if r == 0:
            return F.conv1d(x, self.weight, self.bias)
        parts = [] if self.tail is not None else [x.new_zeros(x.shape[0], x.shape[1], r)]
        if self.tail is not None:
            parts.append(self.tail)
        parts.append(x)
        if final:
            parts.append(x.new_zeros(x.shape[0], x.shape[1], r))
        buf = torch.cat(parts, dim=2) if len(parts) > 1 else x
        if buf.shape[-1] <= 2 * r:
            self.tail = buf
            return buf[..., :0]
        self.tail = buf[..., buf.shape[-1] - 2 * r :].clone()
        return F.conv1d(buf, self.weight, self.bias, dilation=self.dilation)


class _Fifo:
    """Delays a stream: ``push(x, n)`` returns the oldest ``n`` samples held or given."""

    def __init__(self) -> None:
        self.held: Tensor | None = None

    def push(self, x: Tensor, n: int) -> Tensor:
        buf = _join(self.held, x)
        self.held = buf[..., n:].clone()
        return buf[..., :n]


class _WN:
    def __init__(self, wn: WN, g: Tensor | None) -> None:
        self.h = wn.hidden
        self.n = wn.n_layers
        self.convs = [_Conv(c) for c in wn.in_layers]
        self.res_skip = [_Conv(c) for c in wn.res_skip_layers]
        self.residual = [_Fifo() for _ in range(self.n - 1)]
        self.skips = [_Fifo() for _ in range(self.n - 1)]
        self.cond = wn.cond_layer(g) if g is not None else None

    def push(self, x: Tensor, final: bool) -> Tensor:
        h = self.h
        skips: list[Tensor] = []
        for i in range(self.n):
            a = self.convs[i].push(x, final)
            if self.cond is not None:
                a = a + self.cond[:, i * 2 * h : (i + 1) * 2 * h]
            rs = self.res_skip[i].push(torch.tanh(a[:, :h]) * torch.sigmoid(a[:, h:]), final)
            if i < self.n - 1:
                x = self.residual[i].push(x, rs.shape[-1]) + rs[:, :h]
                skips.append(rs[:, h:])
            else:
                skips.append(rs)
        # The deepest output lags most; the others wait for it. Summed in the one-shot order.
        n = skips[-1].shape[-1]
        out = self.skips[0].push(skips[0], n) if self.n > 1 else skips[0]
        for i in range(1, self.n):
            out = out + (self.skips[i].push(skips[i], n) if i < self.n - 1 else skips[i])
        return out


class _Coupling:
    def __init__(self, layer: ResidualCouplingLayer, g: Tensor | None) -> None:
        self.half = layer.half_channels
        self.pre = _Conv(layer.pre)
        self.enc = _WN(layer.enc, g)
        self.post = _Conv(layer.post)
        self.inputs = _Fifo()

    def push(self, x: Tensor, final: bool) -> Tensor:
        m = self.post.push(self.enc.push(self.pre.push(x[:, : self.half], final), final), final)
        x = self.inputs.push(x, m.shape[-1])
        x0, x1 = x[:, : self.half], x[:, self.half :]
        return torch.cat([x0, x1 - m], dim=1)


class StreamingFlow:
    """One sentence's prior frames through ``flow.reverse`` in pieces. One per sentence."""

    def __init__(self, flow: ResidualCouplingBlock, g: Tensor | None) -> None:
        self.steps: list[_Coupling | None] = [
            _Coupling(f, g) if isinstance(f, ResidualCouplingLayer) else None
            for f in reversed(flow.flows)
        ]

    def push(self, z_p: Tensor, final: bool = False) -> Tensor:
        """Prior frames ``[1, c, t]`` -> the latent frames now exact."""
        x = z_p
        for step in self.steps:
            x = torch.flip(x, [1]) if step is None else step.push(x, final)
        return x

"""The flow run backwards incrementally: prior frames in, latent frames out, each computed once.

Like ``generator_stream`` for the generator, built from ``tts.incremental``: every
convolution keeps the input tail its next outputs need, and whatever runs beside a
convolution (the WaveNet's residual path, its skip outputs of different depths, a coupling
layer's own input) waits in a ``Delay`` until the convolution has caught up. A coupling
layer's outputs therefore lag its inputs by its reach (4 WaveNet layers x 2 frames), the
whole flow by ``receptive_field`` (32 frames), and what comes out equals
``ResidualCouplingBlock.reverse`` over the whole sentence.

Tensors here are channels-last ``[1, c, 1, t]`` as in the generator, which in memory are
time-major rows, so the flow's convolutions run as plain matrix products over them
(``vits.tap_products``). As 1-D convolutions, oneDNN re-laid out the input and the weights
(1.5 MB for each of the sixteen 192 -> 384 ones) at every call: the flow's larger pushes
now measure 8-16% faster, the first one the same.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .incremental import Delay, StreamConv
from .memory import MMAP_THRESHOLD
from .vits import WN, Conv, ResidualCouplingBlock, ResidualCouplingLayer, nhwc, tanh


def _conv(conv: nn.Module) -> StreamConv:
    assert isinstance(conv, Conv), f"expected vits.Conv, got {type(conv).__name__}"
    return StreamConv.same(conv)


class _WN:
    def __init__(self, wn: WN, g: Tensor | None) -> None:
        self.h = wn.hidden
        self.n = wn.n_layers
        self.convs = [_conv(c) for c in wn.in_layers]
        self.res_skip = [_conv(c) for c in wn.res_skip_layers]
        self.residual = [Delay() for _ in range(self.n - 1)]
        self.skips = [Delay() for _ in range(self.n - 1)]
        self.cond = wn.cond_layer(nhwc(g)) if g is not None else None

    def push(self, x: Tensor, final: bool) -> Tensor:
        h = self.h
        skips: list[Tensor] = []
        for i in range(self.n):
            a = self.convs[i].push(x, final)
            if self.cond is not None:
                a = a + self.cond[:, i * 2 * h : (i + 1) * 2 * h]
            rs = self.res_skip[i].push(tanh(a[:, :h]) * torch.sigmoid(a[:, h:]), final)
            if i < self.n - 1:
                x = self.residual[i].write_into(rs[:, :h], x)  # the residual path, aligned
                skips.append(rs[:, h:])
            else:
                skips.append(rs)
        # The deepest output lags most; the others wait for it. Summed in the one-shot order.
        out = skips[-1] if self.n == 1 else self.skips[0].take(skips[0], skips[-1].shape[-1])
        for i in range(1, self.n):
            if i < self.n - 1:
                self.skips[i].write_into(out, skips[i])
            else:
                out = out + skips[i]
        return out


class _Coupling:
    def __init__(self, layer: ResidualCouplingLayer, g: Tensor | None) -> None:
        self.half = layer.half_channels
        self.pre = _conv(layer.pre)
        self.enc = _WN(layer.enc, g)
        self.post = _conv(layer.post)
        self.inputs = Delay()

    def push(self, x: Tensor, final: bool) -> Tensor:
        m = self.post.push(self.enc.push(self.pre.push(x[:, : self.half], final), final), final)
        x = self.inputs.take(x, m.shape[-1])
        x0, x1 = x[:, : self.half], x[:, self.half :]
        return torch.cat([x0, x1 - m], dim=1)


class StreamingFlow:
    """One sentence's prior frames through ``flow.reverse`` in pieces. One per sentence."""

    def __init__(self, flow: ResidualCouplingBlock, g: Tensor | None) -> None:
        self.steps: list[_Coupling | None] = [
            _Coupling(f, g) if isinstance(f, ResidualCouplingLayer) else None
            for f in reversed(flow.flows)
        ]
        self.piece = _piece_frames(flow)

    def push(self, x: Tensor, final: bool = False) -> Tensor:
        """Prior frames, channels-last ``[1, c, 1, t]`` -> the latent frames now exact, the
        same layout. A push longer than ``piece`` frames goes through in equal pieces no
        longer than that (not a full one and a sliver: a product over a few frames runs
        at a fraction of the rate)."""
        n = x.shape[-1]
        k = -(-n // self.piece)
        if k <= 1:
            return self._push(x, final)
        bounds = [round(i * n / k) for i in range(k + 1)]
        outs = [self._push(x[..., a:b], final and b == n) for a, b in zip(bounds, bounds[1:])]
        return torch.cat(outs, dim=-1)

    def _push(self, x: Tensor, final: bool) -> Tensor:
        for step in self.steps:
            x = torch.flip(x, [1]) if step is None else step.push(x, final)
        return x


def _piece_frames(flow: ResidualCouplingBlock) -> int:
    """Frames per push that keep the flow's largest temporary, a convolution's overlapping
    windows (``vits.tap_products``: kernel x hidden values a frame), below glibc's mmap
    threshold (``tts.memory``), counting the frames a coupling holds back from earlier
    pushes (up to the flow's receptive field) that a push carries besides its own. Above
    the threshold every such temporary is a fresh mapping whose pages fault in as the
    product's copy writes them: a long sentence's 840 frames in one push spend a sixth of
    the flow's time in that copying, in pieces a fifteenth, at the same rate of products."""
    wn = next(f.enc for f in flow.flows if isinstance(f, ResidualCouplingLayer))
    conv = wn.in_layers[0]
    assert isinstance(conv, Conv)
    per_frame = conv.kernel_size[0] * wn.hidden * 4  # bytes of float32 windows
    return max(16, MMAP_THRESHOLD // per_frame - flow.receptive_field - 1)

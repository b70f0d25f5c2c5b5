"""The HiFi-GAN generator run incrementally: latent frames in, audio out, nothing recomputed.

Decoding overlapping windows would repeat the generator's receptive field (+-11 frames for
a medium voice) at every window edge; for the short windows that make the first audio early
that is a large share of the work. Instead every convolution here keeps the tail of its
input that the next outputs still need, and every residual branch keeps the inputs its
convolution has not caught up with. Pushing the latent frames in pieces then yields
exactly the samples of one-shot decoding, in order, each computed once.

Indices are absolute from the start of the sentence; the zero padding of the one-shot
model appears as zeros prepended at the start and appended at ``final``.
All tensors are channels-last ``[1, c, 1, t]`` (see ``vits.Conv``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .vits import LRELU_SLOPE, Conv, Generator, ResBlock1, ResBlock2, Upsample, _as_int

PIECE = 1 << 17  # values per piece in the upsampled stages (512 KiB of float32)


def _conv(module: object) -> Conv:
    assert isinstance(module, Conv), f"expected vits.Conv, got {type(module).__name__}"
    return module


def _keep(buf: Tensor, n: int) -> Tensor:
    """The last ``n`` samples, copied: a view would keep the whole buffer alive."""
    return buf[..., buf.shape[-1] - n :].clone(memory_format=torch.channels_last)


def _cat(a: Tensor | None, b: Tensor) -> Tensor:
    if a is None or a.shape[-1] == 0:
        return b
    return torch.cat([a, b], dim=3)


def _assemble(x: Tensor, tail: Tensor | None, lead: int, trail: int,
              slope: float | None) -> Tensor:
    """``[zeros(lead), tail, act(x), zeros(trail)]`` in one pass over ``x``.

    The activation is written straight into the convolution's input buffer: joining and
    activating separately would each cost a full pass over the (large) signal.
    """
    held = 0 if tail is None else tail.shape[-1]
    n = lead + held + x.shape[-1] + trail
    buf = torch.empty((x.shape[0], x.shape[1], 1, n), dtype=x.dtype,
                      memory_format=torch.channels_last)
    if lead:
        buf[..., :lead].zero_()
    if held:
        assert tail is not None
        buf[..., lead : lead + held].copy_(tail)
    body = buf[..., lead + held : n - trail]
    if slope is None:
        body.copy_(x)
    else:
        torch.ops.aten.leaky_relu.out(x, slope, out=body)
    if trail:
        buf[..., n - trail :].zero_()
    return buf


class _Conv:
    """A 'same' convolution fed piece by piece: outputs lag the inputs by its radius.

    ``slope`` is the leaky ReLU applied to the inputs before the convolution (None: none).
    """

    def __init__(self, conv: Conv, slope: float | None) -> None:
        self.conv = conv
        self.r = conv.radius
        self.slope = slope
        self.tail: Tensor | None = None

    def push(self, x: Tensor, final: bool) -> Tensor:
        lead = self.r if self.tail is None else 0  # the left zero padding
        buf = _assemble(x, self.tail, lead, self.r if final else 0, self.slope)
        if buf.shape[-1] <= 2 * self.r:
            self.tail = buf
            return buf[..., :0]
        self.tail = _keep(buf, 2 * self.r)
        return self.conv.valid(buf)


class _Delay:
    """Holds a residual input until the branch beside it has produced the same samples."""

    def __init__(self) -> None:
        self.held: Tensor | None = None

    def add_into(self, y: Tensor, x: Tensor) -> Tensor:
        """``y += (held ++ x)[:len(y)]``, keeping the rest; no joined copy is made."""
        n = y.shape[-1]
        h = 0 if self.held is None else self.held.shape[-1]
        if h >= n:
            assert self.held is not None
            y.add_(self.held[..., :n])
            self.held = _cat(_keep(self.held, h - n), x)
            return y
        if h:
            assert self.held is not None
            y[..., :h].add_(self.held)
        y[..., h:].add_(x[..., : n - h])
        self.held = _keep(x, x.shape[-1] - (n - h))
        return y


class _Upsample:
    """The polyphase transposed convolution fed piece by piece (see ``vits.Upsample``)."""

    def __init__(self, up: Upsample) -> None:
        self.up = up
        self.k = up.taps - 1  # causal context of each phase
        self.skip = _as_int(up.padding)  # leading samples the one-shot output crops
        self.tail: Tensor | None = None
        self.inputs = 0
        self.emitted = 0

    def push(self, x: Tensor, final: bool) -> Tensor:
        self.inputs += x.shape[-1]
        lead = self.k if self.tail is None else 0
        buf = _assemble(x, self.tail, lead, self.k if final else 0, LRELU_SLOPE)
        if buf.shape[-1] <= self.k:
            self.tail = buf
            return buf[..., :0]
        self.tail = _keep(buf, self.k)
        y = self.up.polyphase(buf)
        if self.skip:
            cut = min(self.skip, y.shape[-1])
            y, self.skip = y[..., cut:], self.skip - cut
        if final:  # the one-shot output is exactly inputs * stride long
            y = y[..., : self.inputs * self.up.stride[0] - self.emitted]
        self.emitted += y.shape[-1]
        return y


class _ResBlock:
    """ResBlock1 or ResBlock2: chains of leaky ReLU + convolution with residual adds."""

    def __init__(self, block: ResBlock1 | ResBlock2) -> None:
        if isinstance(block, ResBlock1):
            self.chains = [[_Conv(_conv(c1), LRELU_SLOPE), _Conv(_conv(c2), LRELU_SLOPE)]
                           for c1, c2 in zip(block.convs1, block.convs2)]
        else:
            self.chains = [[_Conv(_conv(c), LRELU_SLOPE)] for c in block.convs]
        self.delays = [_Delay() for _ in self.chains]

    def push(self, x: Tensor, final: bool) -> Tensor:
        for chain, delay in zip(self.chains, self.delays):
            y = x
            for conv in chain:
                y = conv.push(y, final)
            x = delay.add_into(y, x)
        return x


class _Mean:
    """Averages parallel branches that lag by different amounts."""

    def __init__(self, n: int) -> None:
        self.held: list[Tensor | None] = [None] * n

    def push(self, outs: list[Tensor]) -> Tensor:
        held = [0 if h is None else h.shape[-1] for h in self.held]
        n = min(h + o.shape[-1] for h, o in zip(held, outs))
        first = outs[0]
        total = torch.empty((first.shape[0], first.shape[1], 1, n), dtype=first.dtype,
                            memory_format=torch.channels_last)
        # Branch by branch in Generator.forward's order (b0, += b1, += b2, /n), so the sums
        # match it bit for bit; each branch's held samples first, then its new output, with
        # no joined copy of either.
        for j, (h, o) in enumerate(zip(self.held, outs)):
            parts = [] if h is None else [h]
            parts.append(o)
            at = 0
            for part in parts:
                take = min(part.shape[-1], n - at)
                if take > 0:
                    dst = total[..., at : at + take]
                    if j == 0:
                        dst.copy_(part[..., :take])
                    else:
                        dst.add_(part[..., :take])
                at += part.shape[-1]
            rest = held[j] + o.shape[-1] - n  # what stays for the next push
            if rest <= o.shape[-1]:
                self.held[j] = _keep(o, rest) if rest else None
            else:
                assert h is not None
                self.held[j] = _keep(_cat(h, o), rest)
        return total.div_(len(outs))


class StreamingGenerator:
    """One sentence through ``Generator`` in pieces. Create one per sentence."""

    def __init__(self, gen: Generator, g: Tensor | None) -> None:
        self.gen = gen
        self.cond = gen.cond(g.unsqueeze(2).contiguous(memory_format=torch.channels_last)) \
            if g is not None else None
        self.pre = _Conv(gen.conv_pre, None)
        self.ups = [_Upsample(u) for u in gen.ups]  # type: ignore[arg-type]
        nk = gen.num_kernels
        self.blocks = [[_ResBlock(b) for b in gen.resblocks[i * nk : (i + 1) * nk]]  # type: ignore[arg-type]
                       for i in range(len(gen.ups))]
        self.means = [_Mean(nk) for _ in gen.ups]
        self.post = _Conv(gen.conv_post, 0.01)  # F.leaky_relu's default, as trained

    def push(self, z: Tensor, final: bool = False) -> Tensor:
        """Latent frames ``[1, c, t]`` -> the audio samples now complete ``[t']``."""
        x = self.pre.push(z.unsqueeze(2).contiguous(memory_format=torch.channels_last), final)
        if self.cond is not None:
            x = x + self.cond
        return torch.cat(self._stage(0, x, final))

    def _stage(self, i: int, x: Tensor, final: bool) -> list[Tensor]:
        """Upsample ``x`` through stage ``i``, then take it on in pieces of ``PIECE`` values.

        Upsampling multiplies the length by up to 8 at every stage; cut into pieces, the
        last stages' temporaries stay small enough for the CPU cache and for glibc to reuse
        heap memory instead of mapping (and page-faulting) fresh memory for each.
        """
        if i == len(self.ups):
            return [torch.tanh_(self.post.push(x, final)).reshape(-1)]
        x = self.ups[i].push(x, final)
        step = max(1, PIECE // x.shape[1])
        starts = list(range(0, x.shape[-1], step)) or [0]
        out: list[Tensor] = []
        for k, a in enumerate(starts):
            last = final and k == len(starts) - 1
            y = self.means[i].push([b.push(x[..., a : a + step], last) for b in self.blocks[i]])
            out += self._stage(i + 1, y, last)
        return out

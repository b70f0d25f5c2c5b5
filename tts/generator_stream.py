"""The HiFi-GAN generator run incrementally: latent frames in, audio out, nothing recomputed.

Decoding overlapping windows would repeat the generator's receptive field (+-11 frames for
a medium voice) at every window edge; for the short windows that make the first audio early
that is a large share of the work. Instead every convolution here keeps the tail of its
input that the next outputs still need, and every residual branch keeps the inputs its
convolution has not caught up with. Pushing the latent frames in pieces then yields
exactly the samples of one-shot decoding, in order, each computed once.

Built from ``tts.incremental``. All tensors are channels-last ``[1, c, 1, t]`` (see
``vits.Conv``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .incremental import Delay, StreamConv
from .memory import MMAP_THRESHOLD
from .vits import LRELU_SLOPE, Conv, Generator, ResBlock1, ResBlock2, Upsample, nhwc, tanh_
from .vits.layers import _as_int

# Values per piece in the upsampled stages: 512 KiB of float32, half of ``MMAP_THRESHOLD``,
# so a piece is cache-sized and its temporaries come from the heap rather than each being a
# fresh mapping whose pages fault in (``tts.memory``).
PIECE = MMAP_THRESHOLD // 2 // 4
# What a convolution's length is rounded up to (``StreamConv``'s ``quantum``): at the latent
# frames' rate, frames; in the upsampled stages, a quarter of a piece. So each convolution
# meets a handful of lengths, some 200 in all for a medium voice, which oneDNN's bounded
# cache (``tts.memory``) holds; the zeros computed besides cost a few percent of a window.
FRAMES_QUANTUM = 16
PIECE_QUANTA = 4


def _quantum(channels: int) -> int:
    """The length quantum of a convolution over pieces of ``channels``-wide samples."""
    return max(1, PIECE // channels // PIECE_QUANTA)


def _conv(module: object, slope: float | None, quantum: int, exact_start: bool
          ) -> StreamConv:
    assert isinstance(module, Conv), f"expected vits.Conv, got {type(module).__name__}"
    return StreamConv.same(module, slope, quantum, exact_start)


class _Upsample:
    """The polyphase transposed convolution fed piece by piece (see ``vits.Upsample``)."""

    def __init__(self, up: Upsample, quantum: int, exact_start: bool) -> None:
        self.up = up
        taps = up.taps - 1  # causal context of each phase
        self.conv = StreamConv(up.polyphase, taps, taps, up.out_channels, LRELU_SLOPE,
                               quantum, exact_start)
        self.skip = _as_int(up.padding)  # leading samples the one-shot output crops
        self.inputs = 0
        self.emitted = 0

    def push(self, x: Tensor, final: bool) -> Tensor:
        self.inputs += x.shape[-1]
        y = self.conv.push(x, final)
        if self.skip:
            cut = min(self.skip, y.shape[-1])
            y, self.skip = y[..., cut:], self.skip - cut
        if final:  # the one-shot output is exactly inputs * stride long
            y = y[..., : self.inputs * self.up.stride[0] - self.emitted]
        self.emitted += y.shape[-1]
        return y


class _ResBlock:
    """ResBlock1 or ResBlock2: chains of leaky ReLU + convolution with residual adds."""

    def __init__(self, block: ResBlock1 | ResBlock2, quantum: int, exact_start: bool) -> None:
        if isinstance(block, ResBlock1):
            self.chains = [[_conv(c1, LRELU_SLOPE, quantum, exact_start),
                            _conv(c2, LRELU_SLOPE, quantum, exact_start)]
                           for c1, c2 in zip(block.convs1, block.convs2)]
        else:
            self.chains = [[_conv(c, LRELU_SLOPE, quantum, exact_start)] for c in block.convs]
        self.delays = [Delay() for _ in self.chains]

    def push(self, x: Tensor, final: bool) -> Tensor:
        for chain, delay in zip(self.chains, self.delays):
            y = x
            for conv in chain:
                y = conv.push(y, final)
            x = delay.write_into(y, x)  # y += the residual, aligned
        return x


class _Mean:
    """Averages parallel branches that lag by different amounts."""

    def __init__(self, n: int) -> None:
        self.delays = [Delay() for _ in range(n)]

    def push(self, outs: list[Tensor]) -> Tensor:
        n = min(d.pending + o.shape[-1] for d, o in zip(self.delays, outs))
        first = outs[0]
        total = torch.empty((first.shape[0], first.shape[1], 1, n), dtype=first.dtype,
                            memory_format=torch.channels_last)
        # Branch by branch in Generator.forward's order (b0, += b1, += b2, /n), so the sums
        # match it bit for bit.
        for j, (delay, out) in enumerate(zip(self.delays, outs)):
            delay.write_into(total, out, add=j > 0)
        return total.div_(len(outs))


class StreamingGenerator:
    """One sentence (or a piece of one) through ``Generator`` in pieces. Create one per
    sentence. ``exact_start``: its first push is a window a listener waits for, computed at
    its own length (``StreamConv``)."""

    def __init__(self, gen: Generator, g: Tensor | None, exact_start: bool = False) -> None:
        self.gen = gen
        self.cond = gen.cond(nhwc(g)) if g is not None else None
        self.pre = _conv(gen.conv_pre, None, FRAMES_QUANTUM, exact_start)
        # Stage i's pieces are ups[i]'s output; ups[i] reads stage i-1's (ups[0]: frames).
        ups: list[Upsample] = list(gen.ups)  # type: ignore[arg-type]
        stage = [_quantum(u.out_channels) for u in ups]
        self.ups = [_Upsample(u, stage[i - 1] if i else FRAMES_QUANTUM, exact_start)
                    for i, u in enumerate(ups)]
        nk = gen.num_kernels
        self.blocks = [[_ResBlock(b, stage[i], exact_start)  # type: ignore[arg-type]
                        for b in gen.resblocks[i * nk : (i + 1) * nk]]
                       for i in range(len(gen.ups))]
        self.means = [_Mean(nk) for _ in gen.ups]
        # F.leaky_relu's default slope, as trained
        self.post = _conv(gen.conv_post, 0.01, stage[-1], exact_start)

    def push(self, z: Tensor, final: bool = False) -> Tensor:
        """Latent frames, channels-last ``[1, c, 1, t]`` -> the audio samples now complete
        ``[t']``."""
        x = self.pre.push(z, final)
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
            return [tanh_(self.post.push(x, final)).reshape(-1)]
        x = self.ups[i].push(x, final)
        step = max(1, PIECE // x.shape[1])
        starts = list(range(0, x.shape[-1], step)) or [0]
        out: list[Tensor] = []
        for k, a in enumerate(starts):
            last = final and k == len(starts) - 1
            y = self.means[i].push([b.push(x[..., a : a + step], last) for b in self.blocks[i]])
            out += self._stage(i + 1, y, last)
        return out

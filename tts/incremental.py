"""The two pieces every incremental layer is made of: a convolution that keeps the input tail
its next outputs need, and a delay that holds a branch until the branch beside it catches up.

``flow_stream`` and ``generator_stream`` build the flow and the generator from them. The time
axis is the last one, whatever the rank (``[1, c, t]`` in the flow, channels-last
``[1, c, 1, t]`` in the generator). Indices are absolute from the start of the sentence; the
one-shot model's zero padding appears as zeros prepended at the start and appended at
``final``, so the pieces' outputs join into exactly the one-shot result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor


def empty(like: Tensor, shape: tuple[int, ...]) -> Tensor:
    """A new tensor of ``shape`` in ``like``'s dtype and layout (channels-last for the
    generator's 4-D tensors)."""
    layout = torch.channels_last if like.dim() == 4 else torch.contiguous_format
    return torch.empty(shape, dtype=like.dtype, memory_format=layout)


def keep(buf: Tensor, n: int) -> Tensor:
    """The last ``n`` samples, copied: a view would keep the whole buffer alive."""
    return buf[..., buf.shape[-1] - n :].clone()


def join(a: Tensor | None, b: Tensor) -> Tensor:
    if a is None or a.shape[-1] == 0:
        return b
    return torch.cat([a, b], dim=-1)


def assemble(x: Tensor, tail: Tensor | None, lead: int, trail: int,
             slope: float | None, spare: int = 0) -> Tensor:
    """``[zeros(lead), tail, act(x), zeros(trail)]`` in one pass over ``x``, followed by
    ``spare`` more zeros that are not part of the signal (see ``StreamConv``'s ``quantum``).

    The activation (a leaky ReLU of ``slope``, or none) is written straight into the
    convolution's input buffer: joining and activating separately would each cost a full
    pass over the (large) signal.
    """
    held = 0 if tail is None else tail.shape[-1]
    n = lead + held + x.shape[-1] + trail
    buf = empty(x, (*x.shape[:-1], n + spare))
    if lead:
        buf[..., :lead].zero_()
    if tail is not None and held:
        buf[..., lead : lead + held].copy_(tail)
    body = buf[..., lead + held : n - trail]
    if slope is None:
        body.copy_(x)
    else:
        torch.ops.aten.leaky_relu.out(x, slope, out=body)
    if trail or spare:
        buf[..., n - trail :].zero_()
    return buf


class SameConv(Protocol):
    """A 'same'-padded convolution that can also run unpadded (``vits.Conv``)."""

    @property
    def radius(self) -> int: ...

    @property
    def out_channels(self) -> int: ...

    def valid(self, x: Tensor) -> Tensor: ...


class StreamConv:
    """A convolution fed piece by piece.

    ``valid`` convolves without padding; ``pad`` zeros stand for the one-shot padding at
    each end of the sentence; ``context`` input samples are kept for the next piece (twice
    the radius for a 'same' convolution, ``taps - 1`` for a causal one). ``slope``: the
    leaky ReLU applied to the inputs first, or None. ``out_channels``: what a piece too
    short for any output gives back is empty, but of the right shape for what follows.

    ``quantum``: the convolution is computed over a whole number of ``quantum`` outputs
    (fewer than one: an eighth or quarters of it, ``rounded``), the input padded
    with zeros beyond the signal and the outputs past it dropped (no kept output depends on
    those zeros). oneDNN builds a convolution for every input length it meets, which costs
    far more than running it (tens of milliseconds over a window of the generator's), and
    keeps what it built, tens of kilobytes each, up to its cache's bound; with the lengths
    rounded, a few recur from window to window and sentence to sentence, and the cache
    holds them all.

    ``exact_start``: the first push, unless it is also the last, is computed at its own
    length. That is for a sentence's first window where a listener waits for it: the plan
    fixes its length, so its lengths recur as they are, and the padding would only delay
    the first audio. Every other first push is rounded like the rest: a helper's piece
    begins where the sentence's length cuts it, a sentence begun with audio in hand with
    what that audio pays for, and at their own lengths each would build convolutions of
    lengths met once.
    """

    def __init__(self, valid: Callable[[Tensor], Tensor], pad: int, context: int,
                 out_channels: int, slope: float | None = None, quantum: int = 1,
                 exact_start: bool = False) -> None:
        self.valid = valid
        self.pad = pad
        self.context = context
        self.out_channels = out_channels
        self.slope = slope
        self.quantum = quantum
        self.exact_start = exact_start
        self.tail: Tensor | None = None

    @classmethod
    def same(cls, conv: SameConv, slope: float | None = None, quantum: int = 1,
             exact_start: bool = False) -> StreamConv:
        """A 'same' convolution (any radius, 0 for a 1x1) fed piece by piece."""
        return cls(conv.valid, conv.radius, 2 * conv.radius, conv.out_channels, slope,
                   quantum, exact_start)

    def push(self, x: Tensor, final: bool) -> Tensor:
        if self.context == 0 and self.slope is None and self.quantum == 1:
            return self.valid(x)  # pointwise: nothing to keep, nothing to copy
        lead = self.pad if self.tail is None else 0
        trail = self.pad if final else 0
        held = 0 if self.tail is None else self.tail.shape[-1]
        n = lead + held + x.shape[-1] + trail
        if n <= self.context:
            self.tail = assemble(x, self.tail, lead, trail, self.slope)
            return empty(x, (x.shape[0], self.out_channels, *x.shape[2:-1], 0))
        outputs = n - self.context  # in input samples
        exact = self.exact_start and self.tail is None and not final
        spare = 0 if exact else rounded(outputs, self.quantum) - outputs
        buf = assemble(x, self.tail, lead, trail, self.slope, spare)
        self.tail = keep(buf[..., :n], self.context)
        y = self.valid(buf)
        if spare:  # the outputs of the padding (an upsampler gives several per input)
            y = y[..., : y.shape[-1] // (outputs + spare) * outputs]
        return y


def rounded(n: int, quantum: int) -> int:
    """``n`` rounded up to a whole number of ``quantum``; below one, to an eighth of it or a
    whole number of quarters (a short piece is not made several times longer, and the
    lengths stay few)."""
    if n >= quantum:
        step = quantum
    elif n > quantum // 8:
        step = max(1, quantum // 4)
    else:
        return max(1, quantum // 8)
    return -(-n // step) * step


class Delay:
    """Holds a stream until the branch beside it has produced the same samples."""

    def __init__(self) -> None:
        self.held: Tensor | None = None

    @property
    def pending(self) -> int:
        """Samples held from earlier pushes."""
        return 0 if self.held is None else self.held.shape[-1]

    def write_into(self, dst: Tensor, x: Tensor, add: bool = True) -> Tensor:
        """``dst (+)= (held ++ x)[:len(dst)]``, keeping the rest; no joined copy is made."""
        n = dst.shape[-1]
        at = 0
        for part in ([] if self.held is None else [self.held]) + [x]:
            take = min(part.shape[-1], n - at)
            if take > 0:
                target = dst[..., at : at + take]
                if add:
                    target.add_(part[..., :take])
                else:
                    target.copy_(part[..., :take])
            at += part.shape[-1]
        rest = self.pending + x.shape[-1] - n  # what stays for the next push
        if rest <= x.shape[-1]:
            self.held = keep(x, rest) if rest else None
        else:
            self.held = keep(join(self.held, x), rest)
        return dst

    def take(self, x: Tensor, n: int) -> Tensor:
        """The oldest ``n`` samples of ``held ++ x``, as a new tensor."""
        out = empty(x, (*x.shape[:-1], n))
        return self.write_into(out, x, add=False)

"""``enc_p``, the text encoder: phoneme ids -> hidden rows and the prior's mean and log-scale,
through transformer layers with relative-position attention."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from functools import partial
from typing import cast

import torch
from torch import Tensor, nn

from ..sharing import Phases, in_order
from .config import VitsConfig
from .layers import LayerNorm, RowConv


class MultiHeadAttention(nn.Module):
    """Self-attention with windowed relative position embeddings shared by all heads, run a
    head at a time or all at once (``Encoder``): the projections (``project``), then the
    heads' attention (``attend``), then the output projection (``conv_o``)."""

    def __init__(self, channels: int, n_heads: int, window_size: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.k_channels = channels // n_heads
        self.window_size = window_size
        self.conv_q = RowConv(channels, channels, 1)
        self.conv_k = RowConv(channels, channels, 1)
        self.conv_v = RowConv(channels, channels, 1)
        self.conv_o = RowConv(channels, channels, 1)
        rel_shape = (1, window_size * 2 + 1, self.k_channels)
        self.emb_rel_k = nn.Parameter(torch.zeros(rel_shape))
        self.emb_rel_v = nn.Parameter(torch.zeros(rel_shape))

    def head_channels(self) -> list[slice]:
        """Each head's channels of the queries, keys and values."""
        k = self.k_channels
        return [slice(i * k, (i + 1) * k) for i in range(self.n_heads)]

    def project(self, x: Tensor, heads: slice = slice(None)) -> tuple[Tensor, Tensor, Tensor]:
        """Rows ``[t, d]`` -> their queries (scaled), keys and values, each ``[t, d]``; or
        only the channels ``heads`` of them, those of some of the heads."""
        q = self.conv_q.rows(x, heads).mul_(1 / math.sqrt(self.k_channels))
        return q, self.conv_k.rows(x, heads), self.conv_v.rows(x, heads)

    def attend(self, q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        """The heads' outputs side by side ``[t, d]``, before the output projection, of as
        many heads as the queries, keys and values (``[t, d]`` each) have channels for."""
        t, d = q.shape
        k, w = self.k_channels, self.window_size
        h = d // k
        q = q.view(t, h, k).transpose(0, 1)  # [h, t, k]
        key = keys.view(t, h, k).transpose(0, 1)
        v = values.view(t, h, k).transpose(0, 1)
        # Relative positions beyond +-window have zero embeddings: only the 2w+1 diagonals
        # around the main one get a relative term, which goes in and out through
        # [t, 2w+1] bands (``_diagonals``, ``_add_diagonals``) with one product each instead
        # of building Piper's [t, 2t-1] relative matrices.
        scores = torch.bmm(q, key.transpose(1, 2))  # [h, t, t]
        _add_diagonals(scores, q @ self.emb_rel_k[0].transpose(0, 1), w)
        p_attn = torch.softmax(scores, dim=-1)
        out = torch.baddbmm(_diagonals(p_attn, w) @ self.emb_rel_v[0], p_attn, v)
        return out.transpose(0, 1).reshape(t, d)


# The diagonals -w..w of a score matrix ([h, t, t], for each head) as the rows of
# [h, t, 2w+1], zero where a diagonal leaves the matrix. Both ways go through the flat
# positions of the entries inside it, one gather or one indexed add a call: attention is
# dozens of small operations a head, and the interpreter's lock between them is what two
# threads sharing the encoder contend for (55 ids: 75 -> 35 us a call, bench/README.md).


@functools.lru_cache(maxsize=8)  # a sentence's layers all ask for its length
def _band_index(t: int, w: int) -> tuple[Tensor, Tensor]:
    """Where the entries (i, i + j - w) that are inside a [t, t] matrix sit in it laid
    flat, and in the [t, 2w + 1] band laid flat."""
    i = torch.arange(t).unsqueeze(1)
    j = torch.arange(2 * w + 1).unsqueeze(0)
    col = i + j - w
    inside = (col >= 0) & (col < t)
    return (i * t + col)[inside], (i * (2 * w + 1) + j)[inside]


def _diagonals(m: Tensor, w: int) -> Tensor:
    """Diagonals -w..w of ``m`` ``[h, t, t]`` as ``[h, t, 2w + 1]``, zero outside it."""
    h, t, _ = m.shape
    at, into = _band_index(t, w)
    out = m.new_zeros(h, t * (2 * w + 1))
    out[:, into] = m.reshape(h, t * t)[:, at]
    return out.view(h, t, 2 * w + 1)


def _add_diagonals(m: Tensor, band: Tensor, w: int) -> None:
    """``m[:, i, i + j - w] += band[:, i, j]`` in place, where that is inside ``m``."""
    h, t, _ = m.shape
    at, into = _band_index(t, w)
    m.view(h, t * t).index_add_(1, at, band.reshape(h, -1)[:, into])


class FFN(nn.Module):
    """The feed-forward part: two 'same' convolutions over the rows, a ReLU between."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        assert kernel_size % 2 == 1, "Piper voices use odd feed-forward kernels"
        self.conv_1 = RowConv(channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.conv_2 = RowConv(filter_channels, channels, kernel_size, padding=kernel_size // 2)


# Sentences of at least this many ids (about 3 s of speech) cut each layer's products into
# blocks of output channels, each block a task that a second thread may take
# (``tts.sharing``): a head's projections and attention, then each half of the output
# projection's and the feed-forward products' channels. Cut by columns, every product keeps
# all the rows: by rows, in two blocks, the products ran slower on one thread (161 ids on
# AVX2: 90 ms against 83 by columns) and no faster on two (399 ids: 156 against 139 ms),
# and a long sentence's first audio came 6-19 ms later. Shorter ones run in one block:
# after an idle pause two threads did not gain on them (55 ids: 34 ms shared against 32 in
# one block), and cut in two they cost one thread 10-15% more (bench/README.md).
SHARED_IDS = 128


def column_blocks(channels: int, t: int) -> list[slice]:
    """The blocks of output channels a product over ``t`` rows is cut into. They depend on
    the layer and ``t`` alone, never on how many threads run them: a matrix product's
    rounding may depend on how many columns it is given, so the blocks, not the threads,
    decide the result."""
    if t < SHARED_IDS:
        return [slice(None)]
    half = -(-channels // 2)
    return [slice(0, half), slice(half, channels)]


class Encoder(nn.Module):
    """The transformer layers, each run as four phases of tasks that each write their own
    block of columns (``column_blocks``): the heads' projections and attention (a head a
    task when the products are cut); the output projection and residual; the feed-forward
    part's first product; its second and the residual. Within a phase the tasks are
    independent, so a task is one another thread may take (``tts.sharing``); the result is
    the same whoever runs it. A layer norm needs whole rows, so it is left to the next
    phase, whose tasks each compute it (the first also keeps it for a later residual)."""

    def __init__(self, c: VitsConfig) -> None:
        super().__init__()
        hc = c.hidden_channels
        self.attn_layers = nn.ModuleList(
            MultiHeadAttention(hc, c.n_heads, c.window_size) for _ in range(c.n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(LayerNorm(hc) for _ in range(c.n_layers))
        self.ffn_layers = nn.ModuleList(
            FFN(hc, c.filter_channels, c.kernel_size) for _ in range(c.n_layers)
        )
        self.norm_layers_2 = nn.ModuleList(LayerNorm(hc) for _ in range(c.n_layers))
        self.filter_channels = c.filter_channels

    def forward(self, x: Tensor, run: Callable[[Phases], None] = in_order) -> Tensor:
        t, d = x.shape
        x = x.clone()  # a layer's input: its attention's residual
        heads = torch.empty_like(x)  # the heads' outputs, before the output projection
        pre = torch.empty_like(x)  # a residual sum, before its norm
        y = torch.empty_like(x)  # after the attention's norm: the feed-forward's residual
        hidden = x.new_empty(t, self.filter_channels)

        def attend(attn: MultiHeadAttention, before: LayerNorm | None, cols: slice,
                   keep: bool) -> None:
            rows = x if before is None else before(pre)
            if before is not None and keep:
                x.copy_(rows)  # the other tasks of the phase read their own ``rows``
            heads[:, cols] = attn.attend(*attn.project(rows, cols))

        def output(attn: MultiHeadAttention, cols: slice) -> None:
            pre[:, cols] = attn.conv_o.rows(heads, cols).add_(x[:, cols])

        def expand(ffn: FFN, norm: LayerNorm, cols: slice, keep: bool) -> None:
            rows = norm(pre)
            if keep:
                y.copy_(rows)
            hidden[:, cols] = torch.relu_(ffn.conv_1.rows(rows, cols))

        def contract(ffn: FFN, cols: slice) -> None:
            pre[:, cols] = ffn.conv_2.rows(hidden, cols).add_(y[:, cols])

        cut = len(column_blocks(d, t)) > 1
        phases: list[list[Callable[[], None]]] = []
        before: LayerNorm | None = None  # the norm the layer's input is still owed
        for attn_, norm1_, ffn_, norm2_ in zip(self.attn_layers, self.norm_layers_1,
                                               self.ffn_layers, self.norm_layers_2):
            attn, norm1 = cast(MultiHeadAttention, attn_), cast(LayerNorm, norm1_)
            ffn, norm2 = cast(FFN, ffn_), cast(LayerNorm, norm2_)
            heads_of = attn.head_channels() if cut else [slice(None)]
            phases += [[partial(attend, attn, before, c, i == 0)
                        for i, c in enumerate(heads_of)],
                       [partial(output, attn, c) for c in column_blocks(d, t)],
                       [partial(expand, ffn, norm1, c, i == 0)
                        for i, c in enumerate(column_blocks(self.filter_channels, t))],
                       [partial(contract, ffn, c) for c in column_blocks(d, t)]]
            before = norm2
        (run if cut else in_order)(phases)  # one block a phase: nothing to share
        assert before is not None
        out: Tensor = before(pre)
        return out


class TextEncoder(nn.Module):
    """Phoneme ids -> prior mean and log-std per phoneme, plus hidden states for durations."""

    def __init__(self, c: VitsConfig) -> None:
        super().__init__()
        self.hidden_channels = c.hidden_channels
        self.inter_channels = c.inter_channels
        self.emb = nn.Embedding(c.n_vocab, c.hidden_channels)
        self.encoder = Encoder(c)
        self.proj = RowConv(c.hidden_channels, c.inter_channels * 2, 1)

    def forward(self, ids: Tensor, run: Callable[[Phases], None] = in_order
                ) -> tuple[Tensor, Tensor, Tensor]:
        """Ids ``[t]`` -> hidden ``[t, hidden]``, mean and log-std ``[t, inter]``; ``run``
        runs the encoder's phases (``tts.sharing``)."""
        x = self.encoder(self.emb(ids) * math.sqrt(self.hidden_channels), run)
        m, logs = torch.split(self.proj.rows(x), self.inter_channels, dim=1)
        return x, m, logs

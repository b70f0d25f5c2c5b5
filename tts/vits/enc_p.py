"""``enc_p``, the text encoder: phoneme ids -> hidden rows and the prior's mean and log-scale,
through transformer layers with relative-position attention."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import cast

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..sharing import Phases, in_order
from .config import VitsConfig
from .layers import LayerNorm, RowConv


class MultiHeadAttention(nn.Module):
    """Self-attention with windowed relative position embeddings shared by all heads, run
    by blocks of rows (``Encoder``): the projections of a block's rows (``project``), then
    its rows' attention over the keys and values of all rows (``attend``)."""

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

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Rows ``[m, d]`` -> their queries (scaled), keys and values, each ``[m, d]``."""
        q = self.conv_q.rows(x).mul_(1 / math.sqrt(self.k_channels))
        return q, self.conv_k.rows(x), self.conv_v.rows(x)

    def attend(self, q: Tensor, first: int, keys: Tensor, values: Tensor) -> Tensor:
        """The output ``[m, d]`` of rows ``first .. first + m`` of the sequence, from their
        queries ``q`` and the keys and values of all its rows (``[t, d]``)."""
        (m, d), t = q.shape, keys.shape[0]
        h, k, w = self.n_heads, self.k_channels, self.window_size
        q = q.view(m, h, k).transpose(0, 1)  # [h, m, k]
        key = keys.view(t, h, k).transpose(0, 1)
        v = values.view(t, h, k).transpose(0, 1)
        # Relative positions beyond +-window have zero embeddings: only the 2w+1 diagonals
        # around the main one get a relative term, which goes in and out through
        # [m, 2w+1] bands (``_diagonals``, ``_add_diagonals``) with one product each instead
        # of building Piper's [t, 2t-1] relative matrices.
        scores = torch.bmm(q, key.transpose(1, 2))  # [h, m, t]
        _add_diagonals(scores, q @ self.emb_rel_k[0].transpose(0, 1), w, first)
        p_attn = torch.softmax(scores, dim=-1)
        out = torch.baddbmm(_diagonals(p_attn, w, first) @ self.emb_rel_v[0], p_attn, v)
        return self.conv_o.rows(out.transpose(0, 1).reshape(m, d))


# The diagonals -w..w of a block of rows of a score matrix ([h, n, t]: rows first .. first + n
# of a [t, t] matrix, for each head), as the rows of [h, n, 2w+1]. For the rows at least w
# from either edge of the matrix they are a strided view of the block itself (row i starts
# at column first + i - w); only the rows within w of an edge, whose diagonals leave the
# matrix, go through a small copy padded with zeros (``_band``). For a long sentence this
# spares a padded copy of the whole matrix (a megabyte a layer) each way.


def _diagonals(m: Tensor, w: int, first: int = 0) -> Tensor:
    """Diagonals -w..w of ``m`` ``[h, n, t]`` (rows ``first ..``) as ``[h, n, 2w + 1]``,
    zero outside the matrix."""
    h, n, _ = m.shape
    out = m.new_empty(h, n, 2 * w + 1)
    lo, hi = _inner_rows(m, w, first)
    if hi > lo:
        out[:, lo:hi] = _inner_diagonals(m, w, first, lo, hi)
    for a, b in ((0, lo), (hi, n)):
        if b > a:
            out[:, a:b] = _band(F.pad(m[:, a:b], (w, w)), w, first + a)
    return out


def _add_diagonals(m: Tensor, band: Tensor, w: int, first: int = 0) -> None:
    """``m[:, i, first + i + j - w] += band[:, i, j]`` in place, where that is inside ``m``."""
    n, t = m.shape[1:]
    lo, hi = _inner_rows(m, w, first)
    if hi > lo:
        _inner_diagonals(m, w, first, lo, hi).add_(band[:, lo:hi])
    for a, b in ((0, lo), (hi, n)):
        if b > a:
            block = F.pad(m[:, a:b], (w, w))
            _band(block, w, first + a).add_(band[:, a:b])
            m[:, a:b] = block[:, :, w : w + t]


def _inner_rows(m: Tensor, w: int, first: int) -> tuple[int, int]:
    """The block's rows ``lo .. hi`` (counted in the block) whose diagonals -w..w are all
    inside the matrix."""
    n, t = m.shape[1:]
    lo = min(n, max(0, w - first))
    return lo, max(lo, min(n, t - w - first))


def _inner_diagonals(m: Tensor, w: int, first: int, lo: int, hi: int) -> Tensor:
    """Rows lo..hi of ``_diagonals(m, w, first)``, as a view of ``m``."""
    h, n, t = m.shape
    assert m.is_contiguous()
    return m.as_strided((h, hi - lo, 2 * w + 1), (n * t, t + 1, 1),
                        m.storage_offset() + lo * t + first + lo - w)


def _band(padded: Tensor, w: int, first: int) -> Tensor:
    """Diagonals -w..w of rows ``first ..`` of a matrix, from those rows padded by w columns
    each side (contiguous ``[h, rows, t + 2w]``), as a ``[h, rows, 2w + 1]`` view.

    Row i of the view holds padded[i, first + i : first + i + 2w + 1], i.e. the entries
    (first + i, first + i - w .. first + i + w) of the unpadded rows; the ones outside them
    fall into the padding.
    """
    h, rows, n = padded.shape
    return padded.as_strided((h, rows, 2 * w + 1), (rows * n, n + 1, 1),
                             padded.storage_offset() + first)


class FFN(nn.Module):
    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        assert kernel_size % 2 == 1, "Piper voices use odd feed-forward kernels"
        self.conv_1 = RowConv(channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.conv_2 = RowConv(filter_channels, channels, kernel_size, padding=kernel_size // 2)
        self.reach = 2 * (kernel_size // 2)  # rows each side an output row depends on

    def forward(self, x: Tensor) -> Tensor:
        return self.conv_2.rows(torch.relu_(self.conv_1.rows(x)))


# Sentences of at least this many ids (about 3 s of speech) run the encoder in two blocks of
# rows, which two threads can share (``tts.sharing``); shorter ones in one. Two blocks on
# one thread cost 3-5 ms more than one (each product's fixed cost is paid twice). Shared,
# after an idle pause, the encoder took 23 ms against 26 whole at 128 ids, 21 against 29 at
# 160, and a synthesis's first audio came 7 ms sooner at 129 ids, 29 ms at 399; below 128
# the gain was a millisecond (bench/README.md).
SHARED_ROWS = 128


def row_blocks(t: int) -> list[tuple[int, int]]:
    """The blocks of rows the encoder runs a sentence of ``t`` ids in. They depend on ``t``
    alone, never on how many threads run them: a matrix product's rounding may depend on
    how many rows it is given, so the blocks, not the threads, decide the result."""
    return [(0, t)] if t < SHARED_ROWS else [(0, t // 2), (t // 2, t)]


class Encoder(nn.Module):
    """The transformer layers, each run as three phases over blocks of rows (``row_blocks``):
    every row's projections; every row's attention, with its residual and norm; every
    row's feed-forward part (which reads ``FFN.reach`` rows of its neighbours each side),
    with its residual and norm. Within a phase the blocks are independent, so a block is
    a task another thread may take (``tts.sharing``); the result is the same whoever runs
    it."""

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

    def forward(self, x: Tensor, run: Callable[[Phases], None] = in_order) -> Tensor:
        t = x.shape[0]
        blocks = row_blocks(t)
        x = x.clone()  # each layer's output goes back into it, block by block
        after_attention = torch.empty_like(x)
        keys, values = torch.empty_like(x), torch.empty_like(x)
        queries: list[Tensor] = [x] * len(blocks)  # each block's own, from its projections

        def project(i: int, attn: MultiHeadAttention) -> None:
            a, b = blocks[i]
            queries[i], keys[a:b], values[a:b] = attn.project(x[a:b])

        def attend(i: int, attn: MultiHeadAttention, norm: LayerNorm) -> None:
            a, b = blocks[i]
            y = attn.attend(queries[i], a, keys, values).add_(x[a:b])
            after_attention[a:b] = norm(y)

        def feed(i: int, ffn: FFN, norm: LayerNorm) -> None:
            (a, b), y = blocks[i], after_attention
            lo, hi = max(0, a - ffn.reach), min(t, b + ffn.reach)
            x[a:b] = norm(ffn(y[lo:hi])[a - lo : b - lo].add_(y[a:b]))

        phases: list[list[Callable[[], None]]] = []
        each = range(len(blocks))
        for attn, norm1, ffn, norm2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2
        ):
            phases += [[partial(project, i, cast(MultiHeadAttention, attn)) for i in each],
                       [partial(attend, i, cast(MultiHeadAttention, attn),
                                cast(LayerNorm, norm1)) for i in each],
                       [partial(feed, i, cast(FFN, ffn), cast(LayerNorm, norm2))
                        for i in each]]
        (run if len(blocks) > 1 else in_order)(phases)  # one block: nothing to share
        return x


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

"""``enc_p``, the text encoder: phoneme ids -> hidden rows and the prior's mean and log-scale,
through transformer layers with relative-position attention."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .config import VitsConfig
from .layers import LayerNorm, RowConv


class MultiHeadAttention(nn.Module):
    """Self-attention with windowed relative position embeddings shared by all heads."""

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

    def forward(self, x: Tensor) -> Tensor:
        """Self-attention over one unpadded sequence of rows ``[t, d]``."""
        t, d = x.shape
        h, k, w = self.n_heads, self.k_channels, self.window_size

        def heads(conv: RowConv) -> Tensor:
            return conv.rows(x).view(t, h, k).transpose(0, 1)  # [h, t, k]

        q = heads(self.conv_q).mul_(1 / math.sqrt(k))
        key, v = heads(self.conv_k), heads(self.conv_v)
        # Relative positions beyond +-window have zero embeddings: only the 2w+1 diagonals
        # around the main one get a relative term, which goes in and out through
        # [t, 2w+1] bands (``_diagonals``, ``_add_diagonals``) with one product each instead
        # of building Piper's [t, 2t-1] relative matrices.
        scores = torch.bmm(q, key.transpose(1, 2))  # [h, t, t]
        _add_diagonals(scores, q @ self.emb_rel_k[0].transpose(0, 1), w)
        p_attn = torch.softmax(scores, dim=-1)
        out = torch.baddbmm(_diagonals(p_attn, w) @ self.emb_rel_v[0], p_attn, v)
        return self.conv_o.rows(out.transpose(0, 1).reshape(t, d))


# The diagonals -w..w of a contiguous [h, t, t] matrix, as the rows of [h, t, 2w+1]: for the
# rows at least w from either edge they are a strided view of the matrix itself (row i
# starts at (i, i - w)); only the w rows at each edge, whose diagonals leave the matrix, go
# through a small copy padded with zeros (``_band``). For a long sentence this spares a
# padded copy of the whole matrix (a megabyte a layer) each way.


def _diagonals(m: Tensor, w: int) -> Tensor:
    """Diagonals -w..w of ``m`` ``[h, t, t]`` as ``[h, t, 2w + 1]``, zero outside it."""
    h, t, _ = m.shape
    if t <= 2 * w:
        return _band(F.pad(m, (w, w)), w)
    out = m.new_empty(h, t, 2 * w + 1)
    out[:, w : t - w] = _inner_diagonals(m, w)
    for rows, cols, pad in _edge_blocks(t, w):
        out[:, rows] = _band(F.pad(m[:, rows, cols], pad), w)
    return out


def _add_diagonals(m: Tensor, band: Tensor, w: int) -> None:
    """``m[:, i, i + j - w] += band[:, i, j]`` in place, where that is inside ``m``."""
    t = m.shape[1]
    if t <= 2 * w:
        padded = F.pad(m, (w, w))
        _band(padded, w).add_(band)
        m.copy_(padded[:, :, w : w + t])
        return
    _inner_diagonals(m, w).add_(band[:, w : t - w])
    for rows, cols, pad in _edge_blocks(t, w):
        block = F.pad(m[:, rows, cols], pad)
        _band(block, w).add_(band[:, rows])
        m[:, rows, cols] = block[:, :, pad[0] : pad[0] + 2 * w]


def _inner_diagonals(m: Tensor, w: int) -> Tensor:
    """Rows w..t-w of ``_diagonals(m, w)``, as a view of ``m``."""
    h, t, _ = m.shape
    assert m.is_contiguous()
    return m.as_strided((h, t - 2 * w, 2 * w + 1), (t * t, t + 1, 1),
                        m.storage_offset() + w * t)


def _edge_blocks(t: int, w: int) -> tuple[tuple[slice, slice, tuple[int, int]], ...]:
    """The w rows at each edge (t > 2w), the 2w columns their diagonals reach inside the
    matrix, and the zero padding (left, right) that puts those diagonals where ``_band``
    reads them."""
    return ((slice(0, w), slice(0, 2 * w), (w, 0)),
            (slice(t - w, t), slice(t - 2 * w, t), (0, w)))


def _band(padded: Tensor, w: int) -> Tensor:
    """Diagonals -w..w of rows of a matrix padded by w columns on the left (contiguous
    ``[h, rows, n]``), as a ``[h, rows, 2w + 1]`` view.

    Row i of the view holds padded[i, i : i + 2w + 1], i.e. the entries (i, i - w .. i + w)
    of the unpadded rows; the ones outside them fall into the padding.
    """
    h, t, n = padded.shape
    return padded.as_strided((h, t, 2 * w + 1), (t * n, n + 1, 1))


class FFN(nn.Module):
    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        assert kernel_size % 2 == 1, "Piper voices use odd feed-forward kernels"
        self.conv_1 = RowConv(channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.conv_2 = RowConv(filter_channels, channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv_2.rows(torch.relu_(self.conv_1.rows(x)))


class Encoder(nn.Module):
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

    def forward(self, x: Tensor) -> Tensor:
        for attn, norm1, ffn, norm2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2
        ):
            x = norm1(attn(x).add_(x))
            x = norm2(ffn(x).add_(x))
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

    def forward(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Ids ``[t]`` -> hidden ``[t, hidden]``, mean and log-std ``[t, inter]``."""
        x = self.encoder(self.emb(ids) * math.sqrt(self.hidden_channels))
        m, logs = torch.split(self.proj.rows(x), self.inter_channels, dim=1)
        return x, m, logs

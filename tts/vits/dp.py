"""The VITS voice model (Kim et al., 2021) as Piper trains and exports it, inference only.

Read top to bottom in the paper's order: text encoder -> duration predictor -> (prior
sampling, done by the caller) -> residual coupling flow -> HiFi-GAN generator. Submodules are
named exactly as Piper's checkpoint names them (``enc_p``, ``dp``, ``flow``, ``dec``,
``emb_g``), so the weights of a ``.onnx`` voice map onto ``state_dict()`` one to one.

Weight normalisation was folded into plain weights at export time, and dropout is gone at
inference, so neither appears here. Shapes are noted as ``[batch, channels, time]``.

The encoder/duration half runs once per sentence; the flow and the generator are written so
that they can also run over a window of latent frames (see ``tts.stream``), which is why each
exposes its receptive field.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

LRELU_SLOPE = 0.1
# Ids whose durations a long sentence's first part of the prior covers (``prior_parts``):
# about 100 latent frames at length scale 1 (more ids when faster), enough for the first
# window and its look-ahead (60 frames for a medium voice).
PRIOR_HEAD = 48


@dataclass(frozen=True)
class VitsConfig:
    """Hyper-parameters of one voice. Read off the weights' shapes by ``tts.voice``."""

    n_vocab: int = 256  # phoneme id table size
    hidden_channels: int = 192  # text encoder width (96 for x_low)
    inter_channels: int = 192  # latent width fed to the flow and generator
    filter_channels: int = 768  # text encoder feed-forward width
    n_heads: int = 2
    n_layers: int = 6  # text encoder layers
    kernel_size: int = 3  # text encoder feed-forward kernel
    window_size: int = 4  # relative attention window
    use_sdp: bool = True  # stochastic duration predictor (else the plain one)
    dp_filter_channels: int = 256  # plain duration predictor width
    flow_layers: int = 4  # coupling layers in the flow
    flow_wn_layers: int = 4  # WaveNet layers in each coupling layer
    flow_kernel_size: int = 5
    resblock: str = "2"  # "1" for high quality, "2" otherwise
    resblock_kernel_sizes: tuple[int, ...] = (3, 5, 7)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6), (3, 12))
    upsample_rates: tuple[int, ...] = (8, 8, 4)
    upsample_initial_channel: int = 256
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8)
    n_speakers: int = 1
    gin_channels: int = 0  # speaker embedding width (0 = single speaker)

    @property
    def hop_length(self) -> int:
        """Audio samples per latent frame."""
        return math.prod(self.upsample_rates)


# --------------------------------------------------------------------------- helpers
#
# The text encoder and the duration predictors run once per sentence on one unpadded
# sequence. They work on time-major rows ``[t, c]`` and without masks: a 1x1 convolution
# is then one matrix product with the weight as stored, a k-wide convolution k products
# over shifted rows (``RowConv``), and layer norm acts on the contiguous last axis. Run as
# Piper's ``[b, c, t]`` graph, each of these went through a convolution primitive made for
# images and a transpose around every norm.


class LayerNorm(nn.Module):
    """Layer norm over the channels of time-major rows ``[t, c]``."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.channels = channels
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, (self.channels,), self.gamma, self.beta, self.eps)


def _padding(kernel_size: int, dilation: int = 1) -> int:
    return (kernel_size * dilation - dilation) // 2


class RowConv(nn.Conv1d):
    """A 'same' Conv1d applied to time-major rows ``[t, c]`` (``rows``).

    The weight keeps its logical shape ``[out, in, k]`` (loading is unchanged) but is stored
    tap-major, so each tap ``weight[:, :, j]`` is a contiguous matrix: the convolution is the
    centre tap's product over all rows plus, for every other tap, a product of the rows it
    reaches accumulated into the output rows it feeds. There is no im2col copy and no padded
    copy of the input (for a long sentence's feed-forward layers a fresh megabyte each, of
    which zeroing, copying and page faults cost 3-6% of the text encoder). Depthwise
    (``groups == channels``) convolutions become shifted element-wise products the same way:
    as a grouped convolution they measured several times slower.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        w = self.weight.detach()
        self.weight = nn.Parameter(w.permute(2, 0, 1).contiguous().permute(1, 2, 0))

    def rows(self, x: Tensor) -> Tensor:
        k, d = self.kernel_size[0], _as_int(self.dilation)
        w, t = self.weight, x.shape[0]
        if k == 1:
            return F.linear(x, w[:, :, 0], self.bias)
        r = _padding(k, d)
        centre = r // d
        depthwise = self.groups > 1
        if depthwise:
            assert self.groups == self.in_channels == self.out_channels
            y = x * w[:, 0, centre]
            if self.bias is not None:
                y += self.bias
        else:
            y = F.linear(x, w[:, :, centre], self.bias)
        for j in range(k):
            shift = j * d - r  # output row i takes input row i + shift
            if j == centre or abs(shift) >= t:
                continue  # beyond the sentence: the tap only ever meets padding
            a, b = max(0, -shift), t - max(0, shift)
            if depthwise:
                y[a:b].addcmul_(x[a + shift : b + shift], w[:, 0, j])
            else:
                y[a:b].addmm_(x[a + shift : b + shift], w[:, :, j].t())
        return y


def tap_products(rows: Tensor, weight: Tensor, bias: Tensor | None, dilation: int) -> Tensor:
    """An unpadded convolution of time-major rows ``[t, in]`` -> ``[t', out]`` as products.

    ``weight`` is ``[out, in, k]``. Stored ``[out][k][in]`` and undilated, it is a
    ``[out, k*in]`` matrix whose columns match ``k`` consecutive rows laid end to end: the
    convolution is one product with the rows' overlapping windows (a strided view, which
    the product copies once). Otherwise it is one product per tap with the rows shifted by
    it, summed.
    """
    out, c, k = weight.shape
    t_out = rows.shape[0] - dilation * (k - 1)
    if k > 1 and dilation == 1 and weight.permute(0, 2, 1).is_contiguous():
        rows = rows.contiguous()
        windows = rows.as_strided((t_out, k * c), (c, 1))
        flat = weight.permute(0, 2, 1).reshape(out, k * c)  # a view
        return windows @ flat.t() if bias is None else torch.addmm(bias, windows, flat.t())
    y = F.linear(rows[:t_out], weight[:, :, 0], bias)
    for j in range(1, k):
        y.addmm_(rows[j * dilation : j * dilation + t_out], weight[:, :, j].t())
    return y


def _row(g: Tensor) -> Tensor:
    """A ``[1, c, 1]`` conditioning vector as one row to add to ``[t, c]``."""
    return g.reshape(1, -1)


# --------------------------------------------------------------------------- text encoder


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


# --------------------------------------------------------------------------- durations


class DDSConv(nn.Module):
    """Dilated depth-separable convolutions."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int) -> None:
        super().__init__()
        self.convs_sep = nn.ModuleList()
        self.convs_1x1 = nn.ModuleList()
        self.norms_1 = nn.ModuleList()
        self.norms_2 = nn.ModuleList()
        for i in range(n_layers):
            dilation = kernel_size**i
            self.convs_sep.append(
                RowConv(
                    channels,
                    channels,
                    kernel_size,
                    groups=channels,
                    dilation=dilation,
                    padding=_padding(kernel_size, dilation),
                )
            )
            self.convs_1x1.append(RowConv(channels, channels, 1))
            self.norms_1.append(LayerNorm(channels))
            self.norms_2.append(LayerNorm(channels))
        self.radius = sum(_padding(kernel_size, kernel_size**i) for i in range(n_layers))

    def forward(self, x: Tensor, g: Tensor | None = None) -> Tensor:
        if g is not None:
            x = x + g
        for sep, c1x1, n1, n2 in zip(self.convs_sep, self.convs_1x1, self.norms_1, self.norms_2):
            assert isinstance(sep, RowConv) and isinstance(c1x1, RowConv)
            y = F.gelu(n1(sep.rows(x)))
            y = F.gelu(n2(c1x1.rows(y)))
            x = x + y
        return x


class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def reverse(self, x: Tensor) -> Tensor:
        return (x - self.m[:, 0]) * torch.exp(-self.logs[:, 0])


class ConvFlow(nn.Module):
    """Coupling layer whose transform is a monotonic rational-quadratic spline."""

    def __init__(self, filter_channels: int, kernel_size: int, n_layers: int, num_bins: int = 10,
                 tail_bound: float = 5.0) -> None:
        super().__init__()
        self.filter_channels = filter_channels
        self.num_bins = num_bins
        self.tail_bound = tail_bound
        self.pre = RowConv(1, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, n_layers)
        self.proj = RowConv(filter_channels, num_bins * 3 - 1, 1)

    def reverse(self, x: Tensor, g: Tensor) -> Tensor:
        """Rows ``[t, 2]``, conditioned on ``g`` ``[t, filter]``."""
        x0, x1 = x[:, :1], x[:, 1]
        h = self.proj.rows(self.convs(self.pre.rows(x0), g=g))  # [t, 3*bins-1]
        scale = math.sqrt(self.filter_channels)
        n = self.num_bins
        widths = h[:, :n] / scale
        heights = h[:, n : 2 * n] / scale
        derivatives = h[:, 2 * n :]
        x1 = _inverse_spline(x1, widths, heights, derivatives, self.tail_bound)
        return torch.cat([x0, x1[:, None]], dim=1)


def _inverse_spline(
    y: Tensor, uw: Tensor, uh: Tensor, ud: Tensor, bound: float,
    min_width: float = 1e-3, min_height: float = 1e-3, min_derivative: float = 1e-3,
) -> Tensor:
    """Inverse of an unconstrained rational-quadratic spline with linear tails (Durkan 2019).

    Computed for every element and then selected, instead of boolean indexing, so that the
    shapes stay static; values outside ``[-bound, bound]`` pass through unchanged.
    """
    inside = (y >= -bound) & (y <= bound)
    yc = y.clamp(-bound, bound)
    n = uw.shape[-1]
    edge = math.log(math.exp(1 - min_derivative) - 1)
    ud = F.pad(ud, (1, 1), value=edge)

    def knots(u: Tensor, min_size: float) -> tuple[Tensor, Tensor]:
        size = min_size + (1 - min_size * n) * torch.softmax(u, dim=-1)
        cum = F.pad(torch.cumsum(size, dim=-1), (1, 0), value=0.0)
        cum = 2 * bound * cum - bound
        cum = torch.cat([torch.full_like(cum[..., :1], -bound), cum[..., 1:-1],
                         torch.full_like(cum[..., :1], bound)], dim=-1)
        return cum, cum[..., 1:] - cum[..., :-1]

    cumwidths, widths = knots(uw, min_width)
    cumheights, heights = knots(uh, min_height)
    derivatives = min_derivative + F.softplus(ud)

    locations = torch.cat([cumheights[..., :-1], cumheights[..., -1:] + 1e-6], dim=-1)
    idx = (torch.sum(yc[..., None] >= locations, dim=-1) - 1).clamp(0, n - 1)[..., None]

    def at(t: Tensor) -> Tensor:
        return t.gather(-1, idx)[..., 0]

    in_cw, in_w, in_ch, in_h = at(cumwidths), at(widths), at(cumheights), at(heights)
    delta = heights / widths
    in_delta = at(delta)
    d0, d1 = at(derivatives), at(derivatives[..., 1:])

    dy = yc - in_ch
    a = dy * (d0 + d1 - 2 * in_delta) + in_h * (in_delta - d0)
    b = in_h * d0 - dy * (d0 + d1 - 2 * in_delta)
    c = -in_delta * dy
    disc = b.pow(2) - 4 * a * c
    root = (2 * c) / (-b - torch.sqrt(disc))
    return torch.where(inside, root * in_w + in_cw, y)


class StochasticDurationPredictor(nn.Module):
    """Samples log-durations by running a normalising flow backwards from noise."""

    def __init__(self, c: VitsConfig, n_flows: int = 4, kernel_size: int = 3) -> None:
        super().__init__()
        ch = c.hidden_channels  # VITS forces filter_channels = in_channels here
        self.pre = RowConv(ch, ch, 1)
        self.proj = RowConv(ch, ch, 1)
        self.convs = DDSConv(ch, kernel_size, n_layers=3)
        flows: list[nn.Module] = [ElementwiseAffine(2)]
        for _ in range(n_flows):
            flows += [ConvFlow(ch, kernel_size, n_layers=3), Flip()]
        self.flows = nn.ModuleList(flows)
        # Reverse order, skipping flows[1]: VITS trains it only for the posterior.
        self.order = [self.flows[i] for i in range(len(flows) - 1, 1, -1)] + [self.flows[0]]
        # Ids each side one log-duration depends on: the conditioning stack, then each
        # coupling's stack, which reads the conditioning and the coupling before it
        # (measured tight: an id 52 away changes the log-duration, 53 away does not).
        self.radius = self.convs.radius + sum(
            f.convs.radius for f in self.order if isinstance(f, ConvFlow))
        if c.gin_channels:
            self.cond = RowConv(c.gin_channels, ch, 1)

    def forward(self, x: Tensor, noise: Tensor, g: Tensor | None) -> Tensor:
        """Hidden rows ``[t, c]``, ``noise`` ``[t, 2]`` already scaled by noise_w ->
        log-durations ``[t]``."""
        x = self.pre.rows(x)
        if g is not None:
            x = x + _row(self.cond(g))
        x = self.proj.rows(self.convs(x))
        z = noise
        for flow in self.order:
            if isinstance(flow, Flip):
                z = torch.flip(z, [1])
            elif isinstance(flow, ConvFlow):
                z = flow.reverse(z, g=x)
            else:
                assert isinstance(flow, ElementwiseAffine)
                z = flow.reverse(z)
        return z[:, 0]


class DurationPredictor(nn.Module):
    """The deterministic predictor some voices are trained with instead."""

    def __init__(self, c: VitsConfig, kernel_size: int = 3) -> None:
        super().__init__()
        fc = c.dp_filter_channels
        self.conv_1 = RowConv(c.hidden_channels, fc, kernel_size, padding=kernel_size // 2)
        self.norm_1 = LayerNorm(fc)
        self.conv_2 = RowConv(fc, fc, kernel_size, padding=kernel_size // 2)
        self.norm_2 = LayerNorm(fc)
        self.radius = 2 * (kernel_size // 2)  # ids each side one log-duration depends on
        self.proj = RowConv(fc, 1, 1)
        if c.gin_channels:
            self.cond = RowConv(c.gin_channels, c.hidden_channels, 1)

    def forward(self, x: Tensor, noise: Tensor, g: Tensor | None) -> Tensor:
        if g is not None:
            x = x + _row(self.cond(g))
        x = self.norm_1(torch.relu(self.conv_1.rows(x)))
        x = self.norm_2(torch.relu(self.conv_2.rows(x)))
        return self.proj.rows(x)[:, 0]


class Flip(nn.Module):
    pass


# --------------------------------------------------------------------------- convolutions


# The flow and the generator, streamed, run their convolutions as 2-D convolutions on
# channels-last tensors of shape [b, c, 1, t]: oneDNN then skips the layout reorders it does
# around every 1-D convolution, which at 32-64 channels cost as much as the arithmetic
# (measured 1.3-4x per layer). Given 3-D tensors (the one-shot model) they are Piper's 1-D
# modules.


_ONEDNN = torch.backends.mkldnn.is_available()


def nhwc(x: Tensor) -> Tensor:
    return x.unsqueeze(2).contiguous(memory_format=torch.channels_last)


class Conv(nn.Conv1d):
    """A Conv1d that, given a channels-last ``[b, c, 1, t]`` tensor, convolves it as 2-D.

    The weight keeps its logical shape ``[out, in, k]`` (loading is unchanged) but is stored
    ``[out][k][in]``, which is exactly a channels-last ``[out, in, 1, k]``: the 4-D weight
    oneDNN wants is a view, and a voice holds its convolution weights once, not twice.
    """

    _w4: Tensor | None = None

    def __init__(self, *args: object, as_products: bool = False, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        w = self.weight.detach()
        self.weight = nn.Parameter(w.permute(0, 2, 1).contiguous().permute(0, 2, 1))
        self.as_products = as_products

    def drop_cache(self) -> None:
        """Forget the 4-D weight view (after the weight tensor was replaced)."""
        self._w4 = None

    @property
    def radius(self) -> int:
        """Samples each side one output depends on (the 'same' padding)."""
        return _as_int(self.padding)

    def weight4(self) -> Tensor:
        if self._w4 is None or self._w4.shape[0] != self.weight.shape[0]:
            # A view while the weight keeps its [out][k][in] storage; a copy only if
            # something replaced it with another layout.
            self._w4 = self.weight.detach().unsqueeze(2).contiguous(
                memory_format=torch.channels_last)
        return self._w4

    def valid(self, x: Tensor, pad: int = 0) -> Tensor:
        """Convolve a channels-last ``[b, c, 1, t]`` tensor with ``pad`` zeros each side.

        Dilated ones go to oneDNN directly. ``F.conv2d`` sends inputs under 20480 values
        (the streamed generator's first pieces) to ATen's own dilated convolution, which
        measured 1.4-1.7x slower than oneDNN there; undilated small ones stay with ATen,
        which is faster than oneDNN for them.
        """
        dilation = _as_int(self.dilation)
        if self.as_products:
            return self._products(x, pad, dilation)
        if dilation > 1 and _ONEDNN:
            return torch.mkldnn_convolution(x, self.weight4(), self.bias, (0, pad), (1, 1),
                                            (1, dilation), 1)
        return F.conv2d(x, self.weight4(), self.bias, padding=(0, pad), dilation=(1, dilation))

    def _products(self, x: Tensor, pad: int, dilation: int) -> Tensor:
        """The convolution as matrix products (``tap_products``).

        A channels-last ``[1, c, 1, t]`` tensor is, in memory, time-major rows ``[t, c]``.
        For the flow's wide, short convolutions (192 -> 384 channels over tens to hundreds
        of frames) products measured up to 1.3x faster than oneDNN's convolution, which
        re-lays out its weights at every call, and than ATen's; for the generator's narrower
        ones oneDNN stays faster.
        """
        n, c, _, t = x.shape
        assert n == 1, "streamed convolutions see one sequence"
        rows = x.permute(0, 2, 3, 1).reshape(t, c)  # a view of channels-last memory
        if pad:
            rows = F.pad(rows, (0, 0, pad, pad))
        y = tap_products(rows, self.weight.detach(), self.bias, dilation)
        return y.view(1, 1, y.shape[0], y.shape[1]).permute(0, 3, 1, 2)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 3:
            return super().forward(x)
        return self.valid(x, self.radius)


def _as_int(v: int | str | tuple[int, ...]) -> int:
    """A 1-D convolution's padding/dilation as one number (torch stores tuples)."""
    if isinstance(v, str):
        raise ValueError(f"string padding {v!r} is not used by VITS")
    return int(v[0]) if isinstance(v, tuple) else int(v)


# --------------------------------------------------------------------------- flow


class WN(nn.Module):
    """Non-causal WaveNet stack: gated dilated convolutions with skip connections."""

    def __init__(self, hidden: int, kernel_size: int, n_layers: int, gin_channels: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.n_layers = n_layers
        self.in_layers = nn.ModuleList(
            Conv(hidden, 2 * hidden, kernel_size, padding=_padding(kernel_size),
                 as_products=True)
            for _ in range(n_layers)
        )
        self.res_skip_layers = nn.ModuleList(
            Conv(hidden, 2 * hidden if i < n_layers - 1 else hidden, 1, as_products=True)
            for i in range(n_layers)
        )
        if gin_channels:
            self.cond_layer = Conv(gin_channels, 2 * hidden * n_layers, 1, as_products=True)

    def forward(self, x: Tensor, x_mask: Tensor, g: Tensor | None) -> Tensor:
        out = torch.zeros_like(x)
        gc = self.cond_layer(g) if g is not None else None
        h = self.hidden
        for i, (inl, rsl) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            a = inl(x)
            if gc is not None:
                a = a + gc[:, i * 2 * h : (i + 1) * 2 * h]
            acts = torch.tanh(a[:, :h]) * torch.sigmoid(a[:, h:])
            rs = rsl(acts)
            if i < self.n_layers - 1:
                x = (x + rs[:, :h]) * x_mask
                out = out + rs[:, h:]
            else:
                out = out + rs
        return out * x_mask


class ResidualCouplingLayer(nn.Module):
    def __init__(self, c: VitsConfig) -> None:
        super().__init__()
        self.half_channels = c.inter_channels // 2
        self.pre = Conv(self.half_channels, c.hidden_channels, 1, as_products=True)
        self.enc = WN(c.hidden_channels, c.flow_kernel_size, c.flow_wn_layers, c.gin_channels)
        self.post = Conv(c.hidden_channels, self.half_channels, 1, as_products=True)  # mean only

    def reverse(self, x: Tensor, x_mask: Tensor, g: Tensor | None) -> Tensor:
        x0, x1 = torch.split(x, [self.half_channels, self.half_channels], dim=1)
        h = self.enc(self.pre(x0) * x_mask, x_mask, g)
        x1 = (x1 - self.post(h) * x_mask) * x_mask
        return torch.cat([x0, x1], dim=1)


class ResidualCouplingBlock(nn.Module):
    def __init__(self, c: VitsConfig) -> None:
        super().__init__()
        flows: list[nn.Module] = []
        for _ in range(c.flow_layers):
            flows += [ResidualCouplingLayer(c), Flip()]
        self.flows = nn.ModuleList(flows)
        # Every coupling layer sees +-(kernel//2) frames per WaveNet layer.
        self.receptive_field = c.flow_layers * c.flow_wn_layers * (c.flow_kernel_size // 2)

    def reverse(self, x: Tensor, x_mask: Tensor, g: Tensor | None) -> Tensor:
        for flow in reversed(self.flows):
            if isinstance(flow, ResidualCouplingLayer):
                x = flow.reverse(x, x_mask, g)
            else:
                x = torch.flip(x, [1])
        return x


# --------------------------------------------------------------------------- generator


class Upsample(nn.ConvTranspose1d):
    """A transposed convolution computed as ``stride`` ordinary ones (polyphase).

    Output sample ``q*u + r`` only ever meets kernel taps ``r, r+u, r+2u, ...``, so phase
    ``r`` is a plain convolution with those taps. Ordering the phases as the slowest output
    channel axis makes interleaving them a free reshape of the channels-last result, and no
    time is spent multiplying the zeros a transposed convolution inserts.
    """

    _wp: Tensor | None = None
    _bp: Tensor | None = None

    def drop_cache(self) -> None:
        self._wp = self._bp = None

    @property
    def taps(self) -> int:
        return -(-self.kernel_size[0] // self.stride[0])

    def _phases(self) -> tuple[Tensor, Tensor]:
        if self._wp is None or self._bp is None:
            w = self.weight.detach()  # [in, out, k]
            u, k = self.stride[0], self.kernel_size[0]
            cin, cout, _ = w.shape
            taps = self.taps
            w = F.pad(w, (0, taps * u - k)).view(cin, cout, taps, u).flip(2)
            w = w.permute(3, 1, 0, 2).reshape(u * cout, cin, 1, taps)  # [(r, out), in, 1, i]
            self._wp = w.contiguous(memory_format=torch.channels_last)
            assert self.bias is not None
            self._bp = self.bias.detach().repeat(u)
        return self._wp, self._bp

    def polyphase(self, x: Tensor, pad: int = 0) -> Tensor:
        """Uncropped output ``y[q*u + r]`` for ``q`` over the valid positions of ``x``."""
        w, b = self._phases()
        u = self.stride[0]
        y = F.conv2d(x, w, b, padding=(0, pad))  # [b, u*out, 1, q], channels last
        n, _, _, q = y.shape
        cout = w.shape[0] // u
        return y.permute(0, 2, 3, 1).reshape(n, 1, q * u, cout).permute(0, 3, 1, 2)

    def forward(self, x: Tensor, output_size: list[int] | None = None) -> Tensor:
        if x.dim() == 3:
            return super().forward(x, output_size)
        u, p = self.stride[0], _as_int(self.padding)
        y = self.polyphase(x, self.taps - 1)
        return y[:, :, :, p : p + x.shape[-1] * u]


class ResBlock1(nn.Module):
    def __init__(self, ch: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            Conv(ch, ch, kernel_size, dilation=d, padding=_padding(kernel_size, d))
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            Conv(ch, ch, kernel_size, padding=_padding(kernel_size)) for _ in dilations
        )
        self.radius = sum(_padding(kernel_size, d) + _padding(kernel_size) for d in dilations)

    def forward(self, x: Tensor) -> Tensor:
        for c1, c2 in zip(self.convs1, self.convs2):
            xt = F.leaky_relu(c1(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE, inplace=True)
            x = c2(xt).add_(x)  # in place: the generator's tensors are large
        return x


class ResBlock2(nn.Module):
    def __init__(self, ch: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            Conv(ch, ch, kernel_size, dilation=d, padding=_padding(kernel_size, d))
            for d in dilations
        )
        self.radius = sum(_padding(kernel_size, d) for d in dilations)

    def forward(self, x: Tensor) -> Tensor:
        for c in self.convs:
            x = c(F.leaky_relu(x, LRELU_SLOPE)).add_(x)
        return x


class Generator(nn.Module):
    """HiFi-GAN: latent frames -> waveform, upsampling by ``hop_length``."""

    def __init__(self, c: VitsConfig) -> None:
        super().__init__()
        self.num_kernels = len(c.resblock_kernel_sizes)
        uic = c.upsample_initial_channel
        self.conv_pre = Conv(c.inter_channels, uic, 7, padding=3)
        block = ResBlock1 if c.resblock == "1" else ResBlock2
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (u, k) in enumerate(zip(c.upsample_rates, c.upsample_kernel_sizes)):
            ch = uic // 2 ** (i + 1)
            self.ups.append(Upsample(ch * 2, ch, k, u, padding=(k - u) // 2))
            for ks, ds in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes):
                self.resblocks.append(block(ch, ks, ds))
        self.conv_post = Conv(ch, 1, 7, padding=3, bias=False)
        if c.gin_channels:
            self.cond = Conv(c.gin_channels, uic, 1)
        self.receptive_field = self._receptive_field(c)

    def _receptive_field(self, c: VitsConfig) -> int:
        """Latent frames each side whose output samples one latent frame can change.

        Follows the samples a single input frame reaches, layer by layer: a convolution of
        radius ``r`` widens the interval by ``r`` each side, an upsampling of stride ``u``,
        kernel ``k`` and padding ``p`` maps ``[a, b]`` to ``[a*u - p, b*u - p + k - 1]``.
        """
        frame = 1000  # any frame away from the edges
        lo, hi = frame - 3, frame + 3  # conv_pre
        blocks: list[ResBlock1 | ResBlock2] = list(self.resblocks)  # type: ignore[arg-type]
        for i, up in enumerate(self.ups):
            assert isinstance(up, Upsample)
            u, p, k = up.stride[0], _as_int(up.padding), up.kernel_size[0]
            lo, hi = lo * u - p, hi * u - p + k - 1
            stage = blocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            r = max(int(b.radius) for b in stage)
            lo, hi = lo - r, hi + r
        lo, hi = lo - 3, hi + 3  # conv_post
        hop = c.hop_length
        return max(frame - lo // hop, hi // hop - frame)

    def forward(self, x: Tensor, g: Tensor | None = None) -> Tensor:
        """``[b, inter, frames]`` -> ``[b, 1, frames * hop]``."""
        x = self.conv_pre(nhwc(x))
        if g is not None:
            x = x + self.cond(nhwc(g))
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE, inplace=True))
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            xs = blocks[0](x)
            for block in blocks[1:]:
                xs.add_(block(x))
            x = xs.div_(self.num_kernels)
        x = self.conv_post(F.leaky_relu(x, inplace=True))  # default slope 0.01, as trained
        return torch.tanh_(x).flatten(1, 2).contiguous()


# --------------------------------------------------------------------------- the model


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
        return self.emb_g(sid).unsqueeze(-1)  # [1, gin, 1]

    def prior(self, ids: Tensor, g: Tensor | None, noise_scale: float, length_scale: float,
              noise_w: float, generator: torch.Generator | None = None,
              head: int = PRIOR_HEAD) -> Tensor:
        """Phoneme ids ``[1, t]`` -> sampled prior latent ``z_p`` ``[1, inter, frames]``."""
        return torch.cat(list(self.prior_parts(ids, g, noise_scale, length_scale, noise_w,
                                               generator, head)), dim=-1)

    def prior_parts(self, ids: Tensor, g: Tensor | None, noise_scale: float,
                    length_scale: float, noise_w: float,
                    generator: torch.Generator | None = None, head: int = PRIOR_HEAD
                    ) -> Iterator[Tensor]:
        """``prior``'s latent in parts along time, the later ones computed when asked for.

        The text encoder attends over the whole sentence, but a log-duration depends only on
        the ids within the duration predictor's ``radius``. So for a long sentence the
        durations, expansion and noise of its first ``head`` ids come first (from the
        predictor run over ``head + radius`` ids), which is all its first audio needs, and
        the rest follows. Each part draws its own noise: the parts joined are what
        ``prior`` returns, whether or not anything ran in between.
        """
        x, m_p, logs_p = self.enc_p(ids[0])
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
            yield (m + eps * torch.exp(logs) * noise_scale).contiguous()

    def log_durations(self, x: Tensor, noise: Tensor, g: Tensor | None, a: int, b: int
                      ) -> Tensor:
        """Log-durations of ids ``a:b`` given the whole sentence's hidden rows ``x`` and
        noise rows: the predictor over those ids and its ``radius`` each side, which gives
        what it gives over the whole sentence there (up to float rounding)."""
        r = self.dp.radius
        lo, hi = max(0, a - r), min(x.shape[0], b + r)
        return self.dp(x[lo:hi], noise[lo:hi], g)[a - lo : b - lo]

    def decode(self, z_p: Tensor, g: Tensor | None) -> Tensor:
        """Prior latent -> waveform ``[1, 1, frames * hop]`` (one shot)."""
        mask = torch.ones_like(z_p[:, :1])
        z = self.flow.reverse(z_p, mask, g)
        return self.dec(z, g)

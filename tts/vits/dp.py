"""``dp``, the duration predictor: how many latent frames each phoneme lasts. Stochastic
(spline flows over noise) in most Piper voices, a plain convolution stack in some."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .config import VitsConfig
from .layers import LayerNorm, RowConv, _padding, _row


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

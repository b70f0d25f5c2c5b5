"""``flow``, the residual coupling flow: run in reverse, it turns the sampled prior latent
into the latent the generator decodes."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import VitsConfig
from .dp import Flip
from .layers import Conv, _padding, tanh


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
            acts = tanh(a[:, :h]) * torch.sigmoid(a[:, h:])
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

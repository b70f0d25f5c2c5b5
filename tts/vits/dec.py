"""``dec``, the HiFi-GAN generator: latent frames -> waveform, by transposed convolutions
and residual blocks."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .config import VitsConfig
from .layers import Conv, _as_int, _padding, nhwc, tanh_

LRELU_SLOPE = 0.1


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
        return tanh_(x).flatten(1, 2).contiguous()

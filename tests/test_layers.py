"""Layers that compute a convolution another way than torch's own (``tts.vits.layers``) give
its result: the convolution to one channel, as a product and a sum of diagonals."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from tts.vits.layers import Conv


@pytest.mark.parametrize("channels, kernel, dilation, bias",
                         [(32, 7, 1, False), (32, 7, 1, True), (16, 3, 2, True), (8, 1, 1, False)])
@pytest.mark.parametrize("length", [1, 6, 301, 4102])
def test_a_convolution_to_one_channel_is_torchs(channels: int, kernel: int, dilation: int,
                                                 bias: bool, length: int) -> None:
    gen = torch.Generator().manual_seed(length + kernel)
    conv = Conv(channels, 1, kernel, dilation=dilation, bias=bias,
                padding=(kernel * dilation - dilation) // 2)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen))
        if conv.bias is not None:
            conv.bias.copy_(torch.randn(1, generator=gen))
    x = torch.randn(1, channels, 1, length, generator=gen)
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        for pad in {0, conv.radius}:
            if length + 2 * pad <= dilation * (kernel - 1):
                continue  # nothing to output
            expected = F.conv2d(x, conv.weight4(), conv.bias, padding=(0, pad),
                                dilation=(1, dilation))
            got = conv.valid(x, pad)
            assert got.shape == expected.shape
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
        assert torch.equal(conv(x), conv.valid(x, conv.radius))

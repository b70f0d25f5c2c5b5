"""The layers every part of the model is built from: time-major row convolutions and layer
norm (text encoder, duration predictor) and channels-last convolutions (flow, generator)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

# --------------------------------------------------------------------------- rows

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

    def rows(self, x: Tensor, out: slice = slice(None)) -> Tensor:
        """``out``: only these output channels (a block of columns another thread may
        compute beside the rest, ``tts.vits.enc_p``); each tap's weight rows for a block
        are still one contiguous matrix."""
        k, d = self.kernel_size[0], _as_int(self.dilation)
        w, bias, t = self.weight, self.bias, x.shape[0]
        if out != slice(None):
            w, bias = w[out], None if bias is None else bias[out]
        if k == 1:
            return F.linear(x, w[:, :, 0], bias)
        r = _padding(k, d)
        centre = r // d
        depthwise = self.groups > 1
        if depthwise:
            assert self.groups == self.in_channels == self.out_channels
            assert out == slice(None), "a depthwise convolution is not cut by channels"
            y = x * w[:, 0, centre]
            if bias is not None:
                y += bias
        else:
            y = F.linear(x, w[:, :, centre], bias)
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


def tanh(x: Tensor) -> Tensor:
    """``tanh(x)`` as ``2 * sigmoid(2x) - 1``, a new tensor.

    ``torch.tanh`` runs through MKL's vector math library, which takes its generic code path
    on CPUs that are not Intel's: on an AMD EPYC it measured 6x slower than ``torch.sigmoid``
    (ATen's own vectorised kernel), and a few percent of the flow. The two agree to about
    1e-7, far below what the audio can show.
    """
    return torch.sigmoid(x * 2).mul_(2).sub_(1)


def tanh_(x: Tensor) -> Tensor:
    """``tanh``, in place."""
    return x.mul_(2).sigmoid_().mul_(2).sub_(1)


def _row(g: Tensor) -> Tensor:
    """A ``[1, c, 1]`` conditioning vector as one row to add to ``[t, c]``."""
    return g.reshape(1, -1)


# --------------------------------------------------------------------------- convolutions


# The flow and the generator, streamed, run their convolutions as 2-D convolutions on
# channels-last tensors of shape [b, c, 1, t]: oneDNN then skips the layout reorders it does
# around every 1-D convolution, which at 32-64 channels cost as much as the arithmetic
# (measured 1.3-4x per layer). Given 3-D tensors (the one-shot model) they are Piper's 1-D
# modules.


_ONEDNN: bool = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]


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
        if self.out_channels == 1 and x.shape[0] == 1:
            return self._to_one(x, pad, dilation)
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

    def _to_one(self, x: Tensor, pad: int, dilation: int) -> Tensor:
        """A convolution to one channel (the generator's last, 32 -> 1 over every sample) as
        one product of the taps with the rows, ``[k, t]``, whose diagonals summed are the
        output: ``y[i] = sum_j p[j, i + j * dilation]``. oneDNN's convolution to one channel
        took 0.6 ms over a piece of 4,096 samples on AVX2, the product and the sum 0.14."""
        _, c, _, t = x.shape
        rows = x.permute(0, 2, 3, 1).reshape(t, c)  # a view of channels-last memory
        if pad:
            rows = F.pad(rows, (0, 0, pad, pad))
            t += 2 * pad
        k = self.kernel_size[0]
        taps = self.weight.detach()[0].t()  # [k, c], contiguous in the [out][k][in] storage
        p = torch.mm(taps, rows.t())
        n = t - dilation * (k - 1)
        y = p.as_strided((k, n), (t + dilation, 1)).sum(0)
        if self.bias is not None:
            y += self.bias
        return y.view(1, 1, 1, n)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 3:
            return super().forward(x)
        return self.valid(x, self.radius)


def _as_int(v: int | str | tuple[int, ...]) -> int:
    """A 1-D convolution's padding/dilation as one number (torch stores tuples)."""
    if isinstance(v, str):
        raise ValueError(f"string padding {v!r} is not used by VITS")
    return int(v[0]) if isinstance(v, tuple) else int(v)

"""Streaming sample-rate conversion: voices and sound devices at different rates.

The composer resamples a second voice (16 kHz) or espeak-ng (22 050 Hz) to the rate of a
stream's first voice; the speaker sink resamples to what the device takes.

Voices come at 16 000 or 22 050 Hz; many USB and HDMI devices only take 44 100 or 48 000.
Audio arrives in chunks and must leave seamlessly, so the converter keeps the input tail it
still needs between calls: feeding a signal in any number of pieces gives exactly the samples
of feeding it at once.

Method: polyphase windowed-sinc (band-limited interpolation). For a rational ratio
``up/down`` (22 050 -> 48 000 is 320/147) output sample ``n`` sits at input time
``t = n * down / up``; it is the sum of the input samples within ``taps/2`` of ``t``, weighted
by a Kaiser-windowed sinc whose cutoff is the lower of the two Nyquist frequencies (so
downsampling doesn't alias). ``t`` only ever has ``up`` distinct fractional parts, so the
weights are one ``(up, taps)`` table computed once. The filter is centred (zero phase): the
output is not delayed relative to the input, it just needs ``taps/2`` input samples of
look-ahead, which ``flush()`` supplies as silence at the end of a stream.

Pure numpy; scipy's ``resample_poly`` would do the same maths but only on whole signals.
"""

from __future__ import annotations

from math import gcd

import numpy as np

_KAISER_BETA = 8.6  # ~ -80 dB stop band
_ZERO_CROSSINGS = 16  # sinc lobes on each side of the centre, at the cutoff frequency
_ROLLOFF = 0.94  # cutoff as a fraction of the lower Nyquist frequency (transition band room)


class Resampler:
    """Converts float32 mono audio from ``src_rate`` to ``dst_rate``, chunk by chunk."""

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        if src_rate <= 0 or dst_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {src_rate} -> {dst_rate}")
        g = gcd(src_rate, dst_rate)
        self.src_rate, self.dst_rate = src_rate, dst_rate
        self.up, self.down = dst_rate // g, src_rate // g
        # Cutoff in cycles per input sample: the input's Nyquist (0.5) when upsampling, the
        # output's when downsampling; the kernel widens as the cutoff drops.
        cutoff = 0.5 * min(1.0, self.up / self.down) * _ROLLOFF
        half = int(np.ceil(_ZERO_CROSSINGS / (2 * cutoff)))
        self.taps = 2 * half
        # Row p holds the weights for fractional position p/up; column k is the input sample
        # at integer offset (k - half + 1) from floor(t).
        frac = np.arange(self.up)[:, None] / self.up
        dist = frac + (half - 1) - np.arange(self.taps)[None, :]  # t - j, in input samples
        inside = np.clip(1.0 - (dist / half) ** 2, 0.0, None)
        window = np.i0(_KAISER_BETA * np.sqrt(inside)) / np.i0(_KAISER_BETA)
        kernel = 2 * cutoff * np.sinc(2 * cutoff * dist) * window
        kernel[np.abs(dist) >= half] = 0.0
        kernel /= kernel.sum(axis=1, keepdims=True)  # unity gain at DC for every phase
        self._table = kernel.astype(np.float32)
        self._half = half
        self.reset()

    def reset(self) -> None:
        # The input seen so far that later outputs still need, starting at absolute input
        # index self._base; the stream starts with `half` samples of silence before it so the
        # first outputs have their left-hand neighbours.
        self._buf = np.zeros(self._half, dtype=np.float32)
        self._base = -self._half
        self._received = 0  # input samples fed
        self._produced = 0  # output samples returned

    def expected_length(self, n_in: int) -> int:
        """Output samples for ``n_in`` input samples once flushed: ceil(n_in * up / down)."""
        return -(-n_in * self.up // self.down)

    def process(self, samples: np.ndarray) -> np.ndarray:
        """Feed input, get every output sample whose look-ahead has now arrived."""
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        self._buf = np.concatenate([self._buf, x])
        self._received += len(x)
        return self._emit(self._received)

    def flush(self) -> np.ndarray:
        """End of stream: the remaining outputs, with silence as the look-ahead."""
        self._buf = np.concatenate([self._buf, np.zeros(self._half, dtype=np.float32)])
        out = self._emit(self._received, final=True)
        self.reset()
        return out

    def _emit(self, available: int, final: bool = False) -> np.ndarray:
        # Output n needs input up to floor(n*down/up) + half; without `final` that index must
        # be below `available`. With `final`, stop at the length the whole signal maps to.
        if final:
            end = self.expected_length(self._received)
        else:
            last_centre = available - self._half - 1  # highest usable floor(t)
            end = (last_centre * self.up) // self.down + 1 if last_centre >= 0 else 0
        n = np.arange(self._produced, max(end, self._produced), dtype=np.int64)
        if len(n) == 0:
            return np.zeros(0, dtype=np.float32)
        pos = n * self.down
        centre, phase = pos // self.up, pos % self.up
        first = centre - self._half + 1 - self._base  # index into self._buf of tap 0
        windows = np.lib.stride_tricks.sliding_window_view(self._buf, self.taps)
        out: np.ndarray = np.einsum("ij,ij->i", windows[first],
                                    self._table[phase]).astype(np.float32)
        self._produced += len(n)
        # Drop input no future output can reach.
        next_first = (self._produced * self.down) // self.up - self._half + 1
        drop = max(0, next_first - self._base)
        if drop:
            self._buf = self._buf[drop:]
            self._base += drop
        return out

"""The hyperparameters of a Piper voice, as its ``.onnx.json`` and weight shapes give them."""

from __future__ import annotations

import math
from dataclasses import dataclass


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

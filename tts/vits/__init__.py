"""The VITS voice model (Kim et al., 2021) as Piper trains and exports it, inference only.

One module per part, read in the paper's order and named as Piper's checkpoint names the
part: text encoder (``enc_p``) -> duration predictor (``dp``) -> (prior sampling) -> residual
coupling flow (``flow``) -> HiFi-GAN generator (``dec``), put together in ``model`` with the
speaker embedding (``emb_g``); ``config`` and ``layers`` hold what they share. The weights of a
``.onnx`` voice map onto ``state_dict()`` one to one.

Weight normalisation was folded into plain weights at export time, and dropout is gone at
inference, so neither appears here. Shapes are noted as ``[batch, channels, time]``.

The encoder/duration half runs once per sentence; the flow and the generator are written so
that they can also run over a window of latent frames (see ``tts.stream``), which is why each
exposes its receptive field.
"""

from .config import VitsConfig
from .dec import LRELU_SLOPE, Generator, ResBlock1, ResBlock2, Upsample
from .flow import WN, ResidualCouplingBlock, ResidualCouplingLayer
from .layers import Conv, nhwc, tanh, tanh_
from .model import PRIOR_HEAD, Vits

__all__ = ["LRELU_SLOPE", "PRIOR_HEAD", "WN", "Conv", "Generator", "ResBlock1", "ResBlock2",
           "ResidualCouplingBlock", "ResidualCouplingLayer", "Upsample", "Vits", "VitsConfig",
           "nhwc", "tanh", "tanh_"]

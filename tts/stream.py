"""Streaming synthesis: text -> audio chunks that join into exactly the one-shot audio.

Per sentence the text encoder runs once over the whole sentence (it attends over all of
it); the durations and the prior sampling follow in parts (``Vits.prior_parts``), the
first covering only what the first audio needs. The flow and the generator, where the time
goes, then run incrementally over windows of latent frames: each keeps the context its next
outputs need, so the joined chunks equal one-shot decoding, with nothing computed twice,
nothing to cross-fade and no click. A small first window makes the first audio early; the
windows after it are as large as the audio already out pays for (``tts.pace``), so that the
per-window overhead costs little. With helpers, later pieces of a sentence and the sentences
after it are decoded elsewhere meanwhile (``tts.lanes``, ``tts.pieces``).

Beside other syntheses the windows take a ``Demand`` into account: whoever shares the CPU
between them (``daemon.synthesis.workers``) says, before each window, how much audio it should hold
at least to last while the others take their turns. Any window plan joins exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from .lanes import MIN_PIECE, Prior, decode_sentences
from .options import Demand, SynthesisOptions
from .pace import Pace, in_frames
from .pieces import Helpers, apply_gain
from .vits import Vits
from .voice import Voice

__all__ = ["MIN_PIECE", "AudioChunk", "Synthesizer", "decode_windows"]


@dataclass(frozen=True)
class AudioChunk:
    samples: np.ndarray  # float32 in [-1, 1], mono, at the voice's rate
    sentence: int  # index of the sentence this chunk belongs to
    last_in_sentence: bool


class Synthesizer:
    """Streams one voice. Not thread-safe per call, but holds no per-call state."""

    def __init__(self, voice: Voice, first_window: int = 8, max_window: int = 96,
                 lone_first_window: int = 16) -> None:
        self.voice = voice
        self.model = voice.model
        # Frames of a played sentence's first window. With helpers it is small: it stands
        # before the first audio and before the helpers get the rest. Without (one lane),
        # every window after it is this lane's too, and each grows from the audio in hand
        # less the pace's margin (``tts.pace.MARGIN``): after 8 frames (93 ms of audio at a
        # medium voice's rate) the next window takes ~16, after 16 ~64, and a sentence ends
        # in a window and a flow push fewer: 2-4% less time and CPU in all, for 5-10 ms more
        # before the first audio (bench/README.md, "Measurements behind the defaults").
        self.first_window = first_window
        self.lone_first_window = lone_first_window
        self.max_window = max_window

    @property
    def sample_rate(self) -> int:
        return self.voice.config.sample_rate

    def sentences(self, text: str) -> list[list[int]]:
        """Phoneme ids of each sentence of ``text``, by the voice's phonemizer."""
        return self.voice.phonemizer.sentences(text)

    def stream(self, text: str, options: SynthesisOptions = SynthesisOptions(),
               helpers: Helpers | None = None, whole: bool = False) -> Iterator[AudioChunk]:
        opts = options.with_defaults(self.voice)
        generator = torch.Generator().manual_seed(opts.seed) if opts.seed is not None else None
        for samples, index, last in self.stream_sentences(self.sentences(text), opts, generator,
                                                          helpers=helpers, whole=whole):
            yield AudioChunk(samples, index, last)
            if last and opts.sentence_silence > 0:
                silence = np.zeros(int(opts.sentence_silence * self.sample_rate), np.float32)
                yield AudioChunk(silence, index, True)

    def prior(self, ids: list[int], opts: SynthesisOptions,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The sentence's whole prior latent ``z_p`` and the speaker conditioning ``g``."""
        parts, g = self.prior_parts(ids, opts, generator)
        with torch.inference_mode():
            return torch.cat(list(parts), dim=-1), g

    def prior_parts(self, ids: list[int], opts: SynthesisOptions,
                    generator: torch.Generator | None = None
                    ) -> tuple[Iterator[torch.Tensor], torch.Tensor | None]:
        """``Vits.prior_parts`` for these options; iterate it under ``torch.inference_mode``
        (as ``decode_windows`` does)."""
        opts = opts.with_defaults(self.voice)
        assert opts.noise_scale is not None and opts.length_scale is not None
        assert opts.noise_w is not None
        with torch.inference_mode():
            g = self.model.speaker_embedding(self.voice.speaker_id(opts.speaker))
        parts = self.model.prior_parts(torch.tensor([ids], dtype=torch.long), g,
                                       opts.noise_scale, opts.length_scale, opts.noise_w,
                                       generator)
        return parts, g

    def stream_sentences(self, sentences: Iterable[list[int]], opts: SynthesisOptions,
                         generator: torch.Generator | None = None,
                         demand: Demand | None = None, helpers: Helpers | None = None,
                         whole: bool = False) -> Iterator[tuple[np.ndarray, int, bool]]:
        """Audio of the sentences' phoneme ids, in order: (samples, sentence index, whether
        they end the sentence). Each sentence's prior is computed when it is about to be
        needed, in order (``generator`` draws the same noise however the work is shared);
        ``helpers`` decode later pieces and sentences meanwhile.

        ``whole``: nobody plays the audio before it is all made (a WAV file, a batch item),
        and ``sentences`` is the whole text. No window is made small for an early first
        chunk, only where the helpers get work after it (``tts.lanes``): a short command
        alone is decoded in one window. Each window costs a few milliseconds besides its
        frames: small first windows make all of a short command's audio take 1.0-1.2x as
        long as decoding it at once, by host (bench/README.md's Engine figures, "all of it"
        against "made whole")."""
        frame_seconds = self.model.config.hop_length / self.sample_rate

        def priors() -> Iterator[Prior]:
            for ids in sentences:
                yield self.prior_parts(ids, opts, generator)

        def wanted() -> int | None:
            return None if demand is None else in_frames(demand(), frame_seconds)

        helped = helpers is not None and helpers.lanes >= 2
        first = self.first_window if helped else self.lone_first_window
        yield from decode_sentences(self.model, priors(), opts.gain, first, self.max_window,
                                    Pace(frame_seconds), wanted, helpers, whole)

    def synthesize(self, text: str, options: SynthesisOptions = SynthesisOptions()) -> np.ndarray:
        """Whole text decoded one sentence at a time in one shot (reference for tests)."""
        opts = options.with_defaults(self.voice)
        generator = torch.Generator().manual_seed(opts.seed) if opts.seed is not None else None
        parts = []
        for ids in self.sentences(text):
            z_p, g = self.prior(ids, opts, generator)
            with torch.inference_mode():
                parts.append(apply_gain(self.model.decode(z_p, g)[0, 0].numpy(), opts.gain))
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def decode_windows(model: Vits, z_p: torch.Tensor | Iterable[torch.Tensor],
                   g: torch.Tensor | None, gain: float = 1.0, first: int = 8,
                   largest: int = 96, pace: Pace | None = None,
                   wanted: Callable[[], int | None] | None = None,
                   helpers: Helpers | None = None, whole: bool = False
                   ) -> Iterator[tuple[np.ndarray, bool]]:
    """One sentence's prior ``z_p`` ``[1, c, frames]`` (whole, or in parts along time) through
    the flow and the generator in windows (``decode_sentences``); the chunks join into
    ``model.decode``, the flag marks the last."""
    for samples, _, last in decode_sentences(model, [(z_p, g)], gain, first, largest, pace,
                                             wanted, helpers, whole):
        yield samples, last

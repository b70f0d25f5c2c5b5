"""Streaming synthesis: one sentence -> audio chunks that join into exactly the one-shot audio.

Per sentence the text encoder runs once over the whole sentence (it attends over all of
it); the durations and the prior sampling follow in parts (``Vits.prior_parts``), the
first covering only what the first audio needs. The flow and the generator, where the time
goes, then run incrementally over windows of latent frames: each keeps the context its next
outputs need, so the joined chunks equal one-shot decoding, with nothing computed twice,
nothing to cross-fade and no click. A small first window makes the first audio early;
later windows grow so that the per-window overhead costs little.

Beside other syntheses the windows take a ``Demand`` into account: whoever shares the CPU
between them (``daemon.workers``) says, before each window, how much audio it should hold at
least to last while the others take their turns. A stream that starts while five others
wait for their first audio then starts with a window that lasts through theirs, instead of
one that runs out after 0.1 s and holds them back. Any window plan joins exactly.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from .flow_stream import StreamingFlow
from .generator_stream import StreamingGenerator
from .options import Demand, SynthesisOptions
from .phonemize import phoneme_ids, phonemize
from .threads import governed
from .vits import Vits, nhwc
from .voice import Voice


@dataclass(frozen=True)
class AudioChunk:
    samples: np.ndarray  # float32 in [-1, 1], mono, at the voice's rate
    sentence: int  # index of the sentence this chunk belongs to
    last_in_sentence: bool


class Synthesizer:
    """Streams one voice. Not thread-safe per call, but holds no per-call state."""

    def __init__(self, voice: Voice, first_window: int = 8, max_window: int = 96) -> None:
        self.voice = voice
        self.model = voice.model
        self.first_window = first_window
        self.max_window = max_window

    @property
    def sample_rate(self) -> int:
        return self.voice.config.sample_rate

    def sentences(self, text: str) -> list[list[int]]:
        """Phoneme ids of each sentence espeak-ng finds in ``text``."""
        c = self.voice.config
        return [phoneme_ids(p, c.phoneme_id_map)
                for p in phonemize(text, c.espeak_voice, c.vowel_clusters)]

    def stream(self, text: str, options: SynthesisOptions = SynthesisOptions()
               ) -> Iterator[AudioChunk]:
        opts = options.with_defaults(self.voice)
        generator = torch.Generator().manual_seed(opts.seed) if opts.seed is not None else None
        for index, ids in enumerate(self.sentences(text)):
            for samples, last in self.stream_ids(ids, opts, generator):
                yield AudioChunk(samples, index, last)
            if opts.sentence_silence > 0:
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

    def stream_ids(self, ids: list[int], opts: SynthesisOptions,
                   generator: torch.Generator | None = None, demand: Demand | None = None
                   ) -> Iterator[tuple[np.ndarray, bool]]:
        """Audio of one sentence in chunks; the flag marks the last one. Each chunk is
        computed on the intra-op threads ``tts.threads`` gives it."""
        parts, g = self.prior_parts(ids, opts, generator)
        pace = FlowPace(self.sample_rate)
        wanted = None
        if demand is not None:
            wanted = in_frames(demand, self.sample_rate / self.model.config.hop_length)
        yield from governed(decode_windows(self.model, parts, g, opts.gain, self.first_window,
                                           self.max_window, pace, wanted))

    def synthesize(self, text: str, options: SynthesisOptions = SynthesisOptions()) -> np.ndarray:
        """Whole text decoded one sentence at a time in one shot (reference for tests)."""
        opts = options.with_defaults(self.voice)
        generator = torch.Generator().manual_seed(opts.seed) if opts.seed is not None else None
        parts = []
        for ids in self.sentences(text):
            z_p, g = self.prior(ids, opts, generator)
            with torch.inference_mode():
                parts.append(_apply_gain(self.model.decode(z_p, g)[0, 0].numpy(), opts.gain))
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def _apply_gain(samples: np.ndarray, gain: float) -> np.ndarray:
    if gain != 1.0:
        samples = samples * gain
    clipped: np.ndarray = np.clip(samples, -1.0, 1.0).astype(np.float32, copy=False)
    return clipped


class FlowPace:
    """How many frames the flow may run ahead of what the generator needs next.

    Every flow push costs a few milliseconds of fixed overhead (some 400 small tensor
    operations) besides its arithmetic, and at 2 threads that overhead does not shrink, so
    pushing the flow in windows as small as the generator's costs ~10% of a long sentence.
    Running ahead is only safe while the audio already handed out covers it, though: the
    frames computed early delay the next chunk. So the flow runs ahead by what half of the
    audio buffered ahead of real time (handed out, minus the time since the first chunk)
    pays for at the flow's measured speed, never more than ``cap`` frames. Before the first
    chunk nothing is buffered and nothing runs ahead: the first audio is as early as ever.
    A slow or busy machine measures itself slow and runs ahead less.
    """

    def __init__(self, sample_rate: int, cap: int = 256,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.sample_rate = sample_rate
        self.cap = cap
        self.clock = clock
        self.first_out: float | None = None
        self.handed_out = 0.0  # seconds of audio
        self.per_frame: float | None = None  # seconds of flow work per frame, last measured

    def ahead(self) -> int:
        if self.first_out is None or self.per_frame is None or self.cap <= 0:
            return 0
        buffered = self.handed_out - (self.clock() - self.first_out)
        if buffered <= 0:
            return 0
        return min(self.cap, int(0.5 * buffered / max(self.per_frame, 1e-6)))

    def flow_ran(self, frames: int, seconds: float) -> None:
        if frames > 0:
            self.per_frame = seconds / frames

    def out(self, samples: int) -> None:
        if self.first_out is None:
            self.first_out = self.clock()
        self.handed_out += samples / self.sample_rate


class _Latents:
    """A sentence's prior latent, channels-last, joined from its parts as windows need them."""

    def __init__(self, parts: Iterable[torch.Tensor]) -> None:
        self._parts = iter(parts)
        self.z: torch.Tensor | None = None
        self.complete = False  # every part joined: the sentence's length is known

    def fill(self, frames: int) -> int:
        """Joins parts until ``frames`` are here or there are no more; returns how many are."""
        while not self.complete and self.frames < frames:
            part = next(self._parts, None)
            if part is None:
                self.complete = True
                break
            part = nhwc(part)  # the layout both halves work in: every window is contiguous
            self.z = part if self.z is None else torch.cat([self.z, part], dim=-1)
        return self.frames

    @property
    def frames(self) -> int:
        return 0 if self.z is None else self.z.shape[-1]


def in_frames(demand: Demand, per_second: float) -> Callable[[], int | None]:
    """``demand`` in latent frames (``per_second`` of them a second of audio)."""
    def frames() -> int | None:
        seconds = demand()
        return None if seconds is None else math.ceil(max(0.0, seconds) * per_second)
    return frames


def next_window(start: int, size: int, largest: int, first: int, frames: int,
                complete: bool) -> int:
    """Where the window of ``size`` frames from ``start`` ends, never over ``largest``; a tail
    shorter than ``first`` left after it (once the sentence's length is known) is folded in
    rather than decoded as a sliver of its own."""
    end = start + min(largest, size)
    if complete and frames - end < first:
        end = frames
    return min(end, frames)


def decode_windows(model: Vits, z_p: torch.Tensor | Iterable[torch.Tensor],
                   g: torch.Tensor | None, gain: float = 1.0, first: int = 8,
                   largest: int = 96, pace: FlowPace | None = None,
                   wanted: Callable[[], int | None] | None = None
                   ) -> Iterator[tuple[np.ndarray, bool]]:
    """Flow + generator over windows of ``z_p`` ``[1, c, frames]``; joins equal ``model.decode``.

    Both halves run incrementally (``StreamingFlow``, ``StreamingGenerator``): every frame
    goes through each once. To hand out the audio through the end of a window, the generator
    needs its receptive field of latent frames past it, and the flow its own past those; the
    first window's push is therefore that much longer, later pushes are just the window, or
    more where ``pace`` lets the flow run ahead (without one, it never does).

    ``z_p`` may come in parts along time (``Vits.prior_parts``): the first window is decoded
    as soon as the parts cover it and its look-ahead, the rest are taken after it.

    The windows: ``first`` frames, then doubling up to ``largest``, a tail shorter than
    ``first`` folded into the window before it (``next_window``). With ``wanted`` (a
    ``Demand`` in frames, ``in_frames``), a window is made as long as it asks where that is
    longer, up to ``largest``, and while it is not None the flow never runs ahead.
    """
    pace = pace or FlowPace(1, cap=0)
    dc, fc = model.dec.receptive_field, model.flow.receptive_field
    with torch.inference_mode():
        flow = StreamingFlow(model.flow, g)
        gen = StreamingGenerator(model.dec, g)
        latents = _Latents([z_p] if isinstance(z_p, torch.Tensor) else z_p)
        # Enough for the first window, its look-ahead and a window after it: then the
        # sentence is known to go on past what the first push reads.
        latents.fill(2 * first + dc + fc + 1)

    fed = 0  # prior frames given to the flow
    latent: list[torch.Tensor] = []  # flow output not yet given to the generator
    pushed = 0  # latent frames given to the generator
    start, size = 0, first  # the next window's start and planned size
    while start < latents.frames:
        asked = wanted() if wanted is not None else None
        if asked:
            size = max(size, min(largest, asked))
            with torch.inference_mode():  # as above, for the window asked for
                latents.fill(start + size + first + dc + fc + 1)
        elif start > 0:
            with torch.inference_mode():  # the first window is out: the rest is wanted now
                latents.fill(sys.maxsize)
        end = next_window(start, size, largest, first, latents.frames, latents.complete)
        start, size = end, min(largest, size * 2)
        frames = latents.frames  # all of them, or (first window) more than it reads
        need = min(frames, end + dc)  # the audio through `end` needs this much look-ahead
        if need <= pushed:
            continue  # an earlier push reached the end of the sentence
        with torch.inference_mode():
            target = min(frames, need + fc)
            if target > fed:
                extra = pace.ahead() if latents.complete and asked is None else 0
                if extra:
                    target += extra
                    if frames - target <= extra // 2:  # no sliver left for a push of its own
                        target = frames
                    target = min(frames, target)
                started = pace.clock()
                assert latents.z is not None
                done = latents.complete and target == frames
                latent.append(flow.push(latents.z[..., fed:target], final=done))
                pace.flow_ran(target - fed, pace.clock() - started)
                fed = target
            z = torch.cat(latent, dim=-1) if len(latent) > 1 else latent[0]
            take = need - pushed
            latent = [z[..., take:]]
            last = latents.complete and need == frames
            audio = gen.push(z[..., :take], final=last)
        pace.out(audio.shape[0])
        pushed = need
        yield _apply_gain(audio.numpy(), gain), last

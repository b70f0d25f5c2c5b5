"""Marked-up text -> one stream of audio chunks, across voices, languages and pauses.

Two stages, so that the cheap one can run where the request arrives (an event loop) and the
expensive one where synthesis runs (a worker thread):

* **plan** (``Planner``, text only, milliseconds): markup -> sentences -> language runs ->
  a list of steps, each ``Say(text, voice, rate, gain)`` or ``Silence(seconds)``. It decides who
  speaks each run: the request's voice for its own language, an installed voice of the run's
  language, else espeak-ng (``espeak:cmn``). Latin text in a request to a voice that cannot
  read it (a Chinese ``pinyin``, Hebrew or Thai voice) is English, for an English voice. It
  accepts text in pieces (``feed``) and returns the steps of each sentence as soon as the
  sentence is complete.
* **render** (``Composer.render``): steps -> ``ComposedChunk``s, chunk by chunk as the
  voices produce them (never a whole text first), all at one sample rate — the request
  voice's — so a stream keeps one audio format. Other voices and espeak-ng are resampled.

Pauses are exact: a silence is that many zero samples at the output rate. A sentence is
followed by ``sentence_pause`` (or ``paragraph_pause`` at a paragraph end), an explicit
pause adds to that, and nothing is added after the last sentence.
"""

from __future__ import annotations

import html
import logging
import re
import unicodedata
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch

from .audio import AudioFormat
from .catalog import VoiceCatalog
from .errors import UnknownVoice
from .fallback import LABEL_PREFIX, EspeakFallback, FallbackError
from .options import Demand, SynthesisOptions
from .phoneme_types import READS_LATIN
from .pieces import Helpers
from .resample import Resampler
from .stream import AudioChunk
from .text.languages import (
    CJK_LANGUAGES,
    SCRIPTED_LANGUAGES,
    base_language,
    for_voice,
    language_runs,
)
from .text.markup import (
    Markup,
    MarkupError,
    ParagraphBreak,
    Pause,
    Segment,
    SentenceBreak,
    Speech,
    TagParser,
    TextFormat,
    parse_ssml,
)
from .text.sentences import DEFAULT_MAX_CHARS, Sentence, SentenceBuffer, split_sentences

log = logging.getLogger(__name__)

DEFAULT_PARAGRAPH_PAUSE = 0.4  # seconds
LATIN_LANGUAGE = "en"  # who says Latin text in a request to a voice that can't
MarkupErrors = Literal["raise", "text"]


@dataclass(frozen=True)
class ComposedChunk(AudioChunk):
    """An ``AudioChunk`` at the composition's rate, saying who spoke it."""

    voice: str = ""  # a voice name, "espeak:<language>", or "" for a pause
    text: str = ""  # the run of text this is the audio of ("" for a pause)


@dataclass(frozen=True)
class Say:
    text: str
    voice: str  # a voice name or "espeak:<language>"
    rate: float  # speed factor on top of the request's
    sentence: int
    last_in_sentence: bool = False
    gain: float = 1.0  # on top of the request's (emphasis)


@dataclass(frozen=True)
class Silence:
    seconds: float
    sentence: int
    last_in_sentence: bool = False


Step = Say | Silence


class Composer:
    """Plans and renders speech over the installed voices and espeak-ng.

    ``fallback``: the espeak-ng engine to use; by default one is made unless ``use_espeak``
    is False. Without it, text no installed voice speaks goes to the request's voice, with
    a warning.
    """

    def __init__(self, catalog: VoiceCatalog, fallback: EspeakFallback | None = None,
                 use_espeak: bool = True, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.catalog = catalog
        self.max_chars = max_chars
        if fallback is None and use_espeak:
            try:
                fallback = EspeakFallback()
            except FallbackError as e:
                log.warning("no espeak-ng fallback (%s): text in languages without an "
                            "installed voice goes to the request's voice", e)
        self.fallback = fallback

    # --- voices ---------------------------------------------------------------------------

    def voice_label(self, voice: str | None) -> str:
        """The canonical name of a request's voice; raises UnknownVoice."""
        if voice and voice.startswith(LABEL_PREFIX):
            found = self.fallback.find(voice) if self.fallback else None
            if found is None:
                why = "has no such language" if self.fallback else "is not installed"
                raise UnknownVoice(f"unknown voice {voice!r}: espeak-ng {why}")
            return found.label
        return self.catalog.resolve(voice).name

    def known_voice(self, voice: str) -> str | None:
        """``voice_label``, or None for a voice nobody has."""
        try:
            return self.voice_label(voice)
        except UnknownVoice:
            return None

    def reads_latin(self, label: str) -> bool:
        """Whether the voice reads Latin letters itself (espeak-ng does, a pinyin voice
        doesn't: ``tts.phoneme_types.READS_LATIN``)."""
        if label.startswith(LABEL_PREFIX):
            return True
        return self.catalog.resolve(label).config.phoneme_type in READS_LATIN

    def language_of(self, label: str) -> str:
        if label.startswith(LABEL_PREFIX):
            assert self.fallback is not None
            return self.fallback.resolve(label).languages[0]
        return self.catalog.resolve(label).config.language

    def sample_rate(self, voice: str | None = None) -> int:
        """The rate every chunk of a composition for this request voice comes at."""
        label = self.voice_label(voice)
        if label.startswith(LABEL_PREFIX):
            assert self.fallback is not None
            return self.fallback.sample_rate
        return self.catalog.resolve(label).config.sample_rate

    def audio_format(self, voice: str | None = None) -> AudioFormat:
        return AudioFormat(self.sample_rate(voice))

    def route(self, language: str) -> str | None:
        """Who speaks ``language`` when the voice in use doesn't: an installed voice, else
        espeak-ng; None if nobody does."""
        try:
            return self.catalog.resolve(language=language).name
        except UnknownVoice:
            found = self.fallback.find(language) if self.fallback else None
            return found.label if found else None

    # --- the two stages -------------------------------------------------------------------

    def planner(self, fmt: TextFormat = "text", voice: str | None = None,
                sentence_pause: float = 0.0, paragraph_pause: float = DEFAULT_PARAGRAPH_PAUSE,
                markup_errors: MarkupErrors = "raise") -> Planner:
        return Planner(self, fmt, voice, sentence_pause, paragraph_pause, markup_errors)

    def render(self, steps: Iterable[Step] | StepFeed,
               options: SynthesisOptions = SynthesisOptions(),
               voice: str | None = None, demand: Demand | None = None,
               helpers: Helpers | None = None, whole: bool = False
               ) -> Iterator[ComposedChunk]:
        """Audio of the steps, chunk by chunk, at the request voice's rate. ``options`` are
        the request's: its length scale sets the pace of every voice (relative to each
        voice's own default), its speaker applies to the request voice only. ``demand``
        sizes the neural voices' windows beside other syntheses (``tts.stream.Demand``);
        ``helpers`` decode later pieces of their sentences meanwhile (``tts.pieces``);
        ``whole``: nobody listens before the end (``Synthesizer.stream_sentences``). A
        ``StepFeed``'s steps are rendered until it is empty."""
        primary = self.voice_label(voice)
        rate = self.sample_rate(primary)
        speed = 1.0
        if options.length_scale and not primary.startswith(LABEL_PREFIX):
            speed = self.catalog.resolve(primary).config.length_scale / options.length_scale
        noise = _Noise(options.seed)
        queue = _Steps(steps)
        while (step := queue.next()) is not None:
            if isinstance(step, Silence):
                yield from _silence(step, rate)
            elif step.voice.startswith(LABEL_PREFIX):
                yield from self._render_fallback(step, options, speed, rate)
            else:
                yield from self._render_neural(step, queue, options, speed, rate, noise,
                                               primary, demand, helpers, whole)

    def stream(self, text: str, fmt: TextFormat = "text",
               options: SynthesisOptions = SynthesisOptions(), voice: str | None = None,
               sentence_pause: float | None = None, paragraph_pause: float | None = None,
               markup_errors: MarkupErrors = "raise", helpers: Helpers | None = None,
               whole: bool = False) -> Composition:
        """A whole text. Raises UnknownVoice (request voice) and MarkupError (malformed SSML,
        unless ``markup_errors="text"``) before any synthesis; the audio is made as the
        returned iterator is consumed. ``sentence_pause`` defaults to the options'
        ``sentence_silence``, ``paragraph_pause`` to their ``paragraph_silence``."""
        planner = self.planner(
            fmt, voice, options.sentence_silence if sentence_pause is None else sentence_pause,
            options.paragraph_silence if paragraph_pause is None else paragraph_pause,
            markup_errors)
        steps = planner.feed(text) + planner.finish()
        return Composition(steps, self.render(steps, options, planner.voice, None, helpers,
                                              whole),
                           self.sample_rate(planner.voice), planner.voice, planner.warnings)

    # --- rendering the steps ---------------------------------------------------------------

    def _render_neural(self, first: Say, queue: _Steps, options: SynthesisOptions,
                       speed: float, rate: int, noise: _Noise,
                       primary: str, demand: Demand | None = None,
                       helpers: Helpers | None = None, whole: bool = False
                       ) -> Iterator[ComposedChunk]:
        """``first`` and the steps after it in the same voice, rate and gain, with only
        pauses between them (taken from ``queue`` as their sentences are needed): their
        sentences in one synthesis, so that while one plays the helpers decode the next
        (``tts.lanes``), and the pauses in their places. Rendered a sentence at a time,
        a text's sentences would never be decoded at once on several lanes."""
        synth = self.catalog.synthesizer(first.voice)
        config = synth.voice.config
        opts = replace(options, length_scale=config.length_scale / (speed * first.rate),
                       speaker=options.speaker if first.voice == primary else None, seed=None,
                       sentence_silence=0.0)
        says: list[Say] = []
        owner: list[int] = []  # the say each sentence is of
        ends: dict[int, int] = {}  # each say's last sentence
        pauses: list[list[Silence]] = []  # after each say

        first_batch = queue.batch

        def sentences() -> Iterator[list[int]]:
            say: Say | None = first
            batch = first_batch
            while say is not None:
                found = synth.sentences(say.text)
                noise.at(batch)
                says.append(say)
                pauses.append([])
                if found:
                    ends[len(says) - 1] = len(owner) + len(found) - 1
                owner.extend([len(says) - 1] * len(found))
                yield from found
                say = queue.next_like(say, pauses[-1])
                batch = queue.batch

        done = -1  # the last say whose pauses are out

        def pauses_through(i: int) -> Iterator[ComposedChunk]:
            nonlocal done
            while done < i:
                done += 1
                for pause in pauses[done]:
                    yield from _silence(pause, rate)

        resampler: Resampler | None = None
        current = -1
        for samples, k, last in synth.stream_sentences(sentences(), opts, noise.generator,
                                                       demand, helpers, whole):
            i = owner[k]
            if i != current:
                yield from pauses_through(i - 1)
                current = i
                resampler = (Resampler(config.sample_rate, rate)
                             if config.sample_rate != rate else None)
            say = says[i]
            if say.gain != 1.0:
                samples = samples * np.float32(say.gain)
            final = last and k == ends[i]
            if resampler is not None:
                samples = resampler.process(samples)
                if final:
                    samples = np.concatenate([samples, resampler.flush()])
            yield ComposedChunk(samples, say.sentence, final and say.last_in_sentence,
                                say.voice, say.text)
        yield from pauses_through(len(says) - 1)

    def _render_fallback(self, step: Say, options: SynthesisOptions, speed: float, rate: int
                         ) -> Iterator[ComposedChunk]:
        assert self.fallback is not None
        voice = self.fallback.resolve(step.voice)
        samples = self.fallback.synthesize(step.text, voice, speed * step.rate,
                                           options.gain * step.gain)
        if self.fallback.sample_rate != rate:
            resampler = Resampler(self.fallback.sample_rate, rate)
            samples = np.concatenate([resampler.process(samples), resampler.flush()])
        size = max(1, rate // 2)
        pieces = range(0, len(samples), size)
        for start in pieces:
            yield ComposedChunk(samples[start:start + size], step.sentence,
                                step.last_in_sentence and start == pieces[-1], step.voice,
                                step.text)


class Composition(Iterator[ComposedChunk]):
    """The chunks of one text, with what was planned: ``steps`` (who says what),
    ``sample_rate``, ``voice`` (the request voice's name) and markup ``warnings``."""

    def __init__(self, steps: list[Step], chunks: Iterator[ComposedChunk], sample_rate: int,
                 voice: str, warnings: list[str]) -> None:
        self.steps = steps
        self.sample_rate = sample_rate
        self.voice = voice
        self.warnings = warnings
        self._chunks = chunks

    def __iter__(self) -> Composition:
        return self

    def __next__(self) -> ComposedChunk:
        return next(self._chunks)


_TAG_LIKE = re.compile(r"<[^<>]*>")


class Planner:
    """Text (whole, or in pieces) -> steps. Text only: no synthesis, safe on an event loop.

    ``feed`` returns the steps of the sentences the text so far completes; ``finish`` the
    rest. For SSML, which is only parseable whole, everything comes from ``finish``.
    """

    def __init__(self, composer: Composer, fmt: TextFormat, voice: str | None,
                 sentence_pause: float, paragraph_pause: float,
                 markup_errors: MarkupErrors) -> None:
        if fmt not in ("text", "ssml"):
            raise ValueError(f"unknown text format {fmt!r}: use 'text' or 'ssml'")
        self.composer = composer
        self.fmt = fmt
        self.voice = composer.voice_label(voice)  # raises UnknownVoice
        self.language = composer.language_of(self.voice)
        self.sentence_pause = max(0.0, sentence_pause)
        self.paragraph_pause = max(0.0, paragraph_pause)
        self.markup_errors = markup_errors
        self.warnings: list[str] = []
        self._buffer = SentenceBuffer(composer.max_chars)
        self._tags = TagParser()
        self._ssml: list[str] = []
        self._sentence = 0  # index of the sentence being planned
        self._spoke = False  # whether it has any speech yet
        self._pending = 0.0  # silence owed before the next speech
        self._out: list[Step] = []

    # --- input ----------------------------------------------------------------------------

    def feed(self, piece: str) -> list[Step]:
        if self.fmt == "ssml":
            self._ssml.append(piece)
            return []
        for sentence in self._buffer.feed(piece):
            self._tagged_sentence(sentence)
        return self._take()

    def finish(self) -> list[Step]:
        if self.fmt == "ssml":
            self._finish_ssml("".join(self._ssml))
        else:
            for sentence in self._buffer.flush():
                self._tagged_sentence(sentence)
        self._end_sentence(0.0)  # the gap after the last sentence is never said
        return self._take()

    def _take(self) -> list[Step]:
        out, self._out = self._out, []
        return out

    def _warn(self, messages: Iterable[str]) -> None:
        for m in messages:
            log.info("markup: %s", m)
            self.warnings.append(m)

    def _tagged_sentence(self, sentence: Sentence) -> None:
        markup = self._tags.parse(sentence.text)
        self._warn(markup.warnings)
        for seg in markup.segments:
            if isinstance(seg, Pause):
                self._pause(seg.seconds)
            elif isinstance(seg, Speech):
                self._speech(seg)
        self._end_sentence(self._gap(sentence))

    def _gap(self, sentence: Sentence) -> float:
        if sentence.paragraph_end:
            return self.paragraph_pause
        return self.sentence_pause if sentence.terminated else 0.0

    def _finish_ssml(self, text: str) -> None:
        try:
            markup = parse_ssml(text, self.language)
        except MarkupError as e:
            if self.markup_errors == "raise":
                raise
            self._warn([f"{e}; spoken as plain text"])
            plain = html.unescape(_TAG_LIKE.sub(" ", text))
            for sentence in split_sentences(plain, self.composer.max_chars):
                self._speech(Speech(sentence.text))
                self._end_sentence(self._gap(sentence))
            return
        self._warn(markup.warnings)
        self._ssml_segments(markup)

    def _ssml_segments(self, markup: Markup) -> None:
        for seg in _merge(markup.segments):
            if isinstance(seg, Pause):
                self._pause(seg.seconds)
            elif isinstance(seg, SentenceBreak):
                self._end_sentence(self.sentence_pause)
            elif isinstance(seg, ParagraphBreak):
                self._end_sentence(self.paragraph_pause)
            else:
                sentences = split_sentences(seg.text, self.composer.max_chars)
                for k, sentence in enumerate(sentences):
                    self._speech(replace(seg, text=sentence.text))
                    if k < len(sentences) - 1 or sentence.terminated:
                        self._end_sentence(self._gap(sentence))

    # --- output ---------------------------------------------------------------------------

    def _pause(self, seconds: float) -> None:
        self._out.append(Silence(self._pending + seconds, self._sentence))
        self._pending = 0.0

    def _end_sentence(self, gap: float) -> None:
        """Close the current sentence: mark its last step, owe the gap after it. A sentence
        that said nothing (only a pause or a [voice] tag) is no sentence: no gap."""
        if not self._spoke:
            if self._sentence > 0:  # a <p> right after a sentence's end: the longer gap
                self._pending = max(self._pending, gap)
            return
        if self._out and self._out[-1].sentence == self._sentence:
            self._out[-1] = replace(self._out[-1], last_in_sentence=True)
        self._sentence += 1
        self._spoke = False
        self._pending = max(self._pending, gap)

    def _speech(self, seg: Speech) -> None:
        if not _speakable(seg.text):
            return
        current = self.voice
        if seg.voice:
            known = self.composer.known_voice(seg.voice)
            if known is None:
                self._warn([f"unknown voice {seg.voice!r} in the markup: the request's voice "
                            f"{self.voice} speaks instead"])
            else:
                current = known
        own = self.composer.language_of(current)
        cjk = own if base_language(own) in CJK_LANGUAGES else None  # a Cantonese voice: yue
        # Latin letters in a request to a voice of a language written otherwise: its own
        # language if it reads them (espeak-ng does), else English, for an English voice to
        # say rather than this one to swallow (a pinyin, Hebrew or Thai voice would).
        default = own
        if base_language(own) in SCRIPTED_LANGUAGES and not self.composer.reads_latin(current):
            default = LATIN_LANGUAGE
        if seg.language:
            if base_language(seg.language) in CJK_LANGUAGES:
                cjk = seg.language
            elif not seg.voice:
                default = seg.language
        merge = False  # runs of one segment that the same voice speaks are said together
        for run in language_runs(seg.text, default, cjk):
            text = for_voice(run.text, run.cjk)
            if not _speakable(text):
                continue
            speaker = current
            if base_language(run.language) != base_language(own):
                speaker = self.composer.route(run.language) or current
                if speaker == current:
                    self._warn([f"no installed voice and no espeak-ng voice speaks "
                                f"{run.language!r}: {current} reads {text!r}"])
            if self._pending > 0:
                self._out.append(Silence(self._pending, self._sentence))
                self._pending = 0.0
            prev = self._out[-1] if self._out and merge else None
            if isinstance(prev, Say) and prev.voice == speaker:  # one voice, one intonation
                self._out[-1] = replace(prev, text=f"{prev.text} {text}")
            else:
                self._out.append(Say(text, speaker, seg.rate, self._sentence, gain=seg.gain))
            merge = self._spoke = True


def _speakable(text: str) -> bool:
    """Anything but whitespace and punctuation (symbols like $ and % are read out)."""
    return any(not ch.isspace() and not unicodedata.category(ch).startswith("P")
               for ch in text)


def _merge(segments: Iterable[Segment]) -> list[Segment]:
    """Join neighbouring Speech segments that differ only in ``say_as``, so that a sentence
    with a ``<say-as>`` in it is synthesized as one sentence, with one intonation."""
    out: list[Segment] = []
    for seg in segments:
        prev = out[-1] if out else None
        if (isinstance(seg, Speech) and isinstance(prev, Speech)
                and (prev.voice, prev.language, prev.rate, prev.gain) == (
                    seg.voice, seg.language, seg.rate, seg.gain)):
            joiner = "" if seg.text[:1] in ".,!?;:" or _ends_cjk(prev.text) else " "
            out[-1] = replace(prev, text=prev.text + joiner + seg.text, say_as=None)
        else:
            out.append(seg)
    return out


def _ends_cjk(text: str) -> bool:
    return bool(text) and unicodedata.category(text[-1]) == "Lo" and ord(text[-1]) > 0x2E80


def _silence(step: Silence, rate: int) -> Iterator[ComposedChunk]:
    n = int(round(step.seconds * rate))
    if n > 0:
        yield ComposedChunk(np.zeros(n, np.float32), step.sentence, step.last_in_sentence)


class StepFeed:
    """Steps that arrive while they are rendered: a streamed text's sentences, put in
    batches (one sentence's steps) from the thread that receives them, taken by a render on
    another. Taking never waits: a render ends when the feed is empty, and its owner starts
    the next one when more has come. Each batch starts the seeded noise afresh, so a seeded
    text's audio does not depend on which batches were rendered together."""

    def __init__(self) -> None:
        self._items: deque[tuple[int, Step]] = deque()  # (batch, step); deques are thread-safe
        self._batches = 0

    def put(self, batch: Iterable[Step]) -> None:
        self._batches += 1
        self._items.extend((self._batches, step) for step in batch)

    def __bool__(self) -> bool:
        return bool(self._items)

    def take(self) -> tuple[int, Step] | None:
        try:
            return self._items.popleft()
        except IndexError:
            return None


class _Noise:
    """One render's seeded noise, started afresh at each batch of a ``StepFeed``."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.batch = 0  # the batch the generator was last seeded for

    def at(self, batch: int) -> None:
        """The next noise drawn is for a sentence of ``batch``."""
        if self.generator is not None and self.seed is not None and batch != self.batch:
            self.generator.manual_seed(self.seed)
            self.batch = batch


class _Steps:
    """The steps to render, taken one at a time (lazily: a text's later sentences are
    planned and phonemized as they are needed), with a look past pauses for the next step
    in the same voice. ``batch`` is the ``StepFeed`` batch of the step taken last (0 for a
    whole text)."""

    def __init__(self, steps: Iterable[Step] | StepFeed) -> None:
        self._feed = steps if isinstance(steps, StepFeed) else None
        self._steps = iter(()) if isinstance(steps, StepFeed) else iter(steps)
        self._back: deque[tuple[int, Step]] = deque()
        self.batch = 0

    def _take(self) -> tuple[int, Step] | None:
        if self._back:
            return self._back.popleft()
        if self._feed is not None:
            return self._feed.take()
        step = next(self._steps, None)
        return None if step is None else (0, step)

    def next(self) -> Step | None:
        taken = self._take()
        if taken is None:
            return None
        self.batch, step = taken
        return step

    def next_like(self, say: Say, pauses: list[Silence]) -> Say | None:
        """The next step if it is a say in ``say``'s voice, rate and gain with only pauses
        before it (those go into ``pauses``); else None, and the steps looked at stay next."""
        seen: list[tuple[int, Step]] = []
        while (taken := self._take()) is not None:
            seen.append(taken)
            if not isinstance(taken[1], Silence):
                break
        step = seen[-1][1] if seen else None
        if (isinstance(step, Say) and not step.voice.startswith(LABEL_PREFIX)
                and (step.voice, step.rate, step.gain) == (say.voice, say.rate, say.gain)):
            pauses.extend(s for _, s in seen[:-1] if isinstance(s, Silence))
            self.batch = seen[-1][0]
            return step
        self._back.extendleft(reversed(seen))
        return None

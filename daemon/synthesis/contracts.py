"""What the fronts and the scheduler need of whatever makes the audio, as contracts: the
engine (a model in this process) fulfils them, and on a satellite (``node.role``), which has
no model, the fleet's list of the voices its online workers offer fulfils the fronts' part,
while each request carries its audio's source (``AudioSource``).

So neither the fronts nor the scheduler import the engine, and a satellite never imports
torch."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from tts.errors import UnknownVoice
from tts.text.languages import speaks

if TYPE_CHECKING:
    from tts.audio import AudioFormat
    from tts.compose import Planner, Step
    from tts.options import SynthesisOptions
    from tts.stream import AudioChunk
    from tts.text import TextFormat


_LANGUAGE = re.compile(r"^[a-z]{2,3}([_-][A-Za-z]{2})?$")  # en, de_DE, pt-br: not a voice name
MAX_VOICE_NAME = 200  # characters; a longer "name" is junk, not echoed back in full


def pick_voice(voices: Mapping[str, str], preferred: str, name: str | None = None,
               language: str | None = None, default: str | None = None,
               where: str = "installed") -> str:
    """The voice a request asks for among ``voices`` (name -> language), however the
    front lets it ask: by name; by a language in ``name`` (``en``, ``de_DE``, as people
    type it in a ``say``) or in ``language`` (Wyoming's field), ``preferred`` first;
    with neither, ``default`` (``preferred`` if None). Raises ``UnknownVoice`` naming
    what there is (``where``: "installed", or where else the voices are); each front
    answers it its own way. One resolver for the engine's voices and the fleet's."""
    if name and len(name) > MAX_VOICE_NAME:
        raise UnknownVoice(f"voice name too long (over {MAX_VOICE_NAME} characters)")
    if name:
        if name in voices:
            return name
        if not _LANGUAGE.match(name):
            raise UnknownVoice(f"unknown voice {name!r}; {where}: {', '.join(voices)}")
        language = name
    if not language:
        return default or preferred
    order = [preferred, *(v for v in voices if v != preferred)] if preferred in voices \
        else list(voices)
    found = speaks(language, ((v, voices[v]) for v in order))
    if found is not None:
        return found
    listed = ", ".join(f"{v} ({lang})" for v, lang in voices.items())
    what = f"unknown voice {name!r}: no voice has that name or" if name else "no voice"
    raise UnknownVoice(f"{what} speaks {language!r}; {where}: {listed}")


class VoiceList(Protocol):
    """The voices a request may name, checked before anything is queued."""

    @property
    def default_voice(self) -> str:
        """The voice of a request that names none (before ``set/voice``)."""
        ...

    def voice_names(self) -> list[str]:
        """Every voice a request may name."""
        ...

    def resolve_voice(self, name: str | None = None, language: str | None = None,
                      default: str | None = None) -> str:
        """The voice a request asks for: by name, or by a language (in ``name`` as people
        type it, or in ``language``); with neither, ``default`` (``default_voice`` if None).
        Raises ``tts.errors.UnknownVoice`` saying what there is."""
        ...

    def check_speaker(self, voice: str, speaker: str | int | None) -> None:
        """Refuse (``tts.errors.VoiceError``) a speaker that ``voice`` does not have."""
        ...

    def audio_format(self, voice: str | None = None) -> AudioFormat:
        """The format a request in ``voice`` comes in."""
        ...


class Synthesis(VoiceList, Protocol):
    """A model in this process: what the scheduler runs a request's text through."""

    def planner(self, voice: str | None, options: SynthesisOptions,
                text_format: TextFormat = "text") -> Planner: ...

    def stream(self, text: str, voice: str | None, options: SynthesisOptions,
               text_format: TextFormat = "text",
               whole: bool = False) -> AsyncGenerator[AudioChunk, None]: ...

    def stream_steps(self, batches: AsyncGenerator[list[Step], None], voice: str | None,
                     options: SynthesisOptions, waiting: Callable[[bool], None] | None = None
                     ) -> AsyncGenerator[AudioChunk, None]: ...

    def rest(self) -> None:
        """Called when the last job in hand has ended: a moment to give memory back."""


class AudioSource(Protocol):
    """A request's audio made somewhere else (a fleet worker), played in place of a
    synthesis: the scheduler treats it as its synthesis (queue, lanes, events, stop, latency
    record) without knowing where it comes from.

    ``pcm()`` is called once, when the scheduler would start synthesizing (the request's
    turn, or the one before it: prefetch); it yields s16le mono PCM in ``format`` and ends
    at the audio's end, or raises ``daemon.errors.RequestError`` saying why it cannot go
    on. Closing it (``aclose``: the request was stopped or its sinks left) gives the work up
    wherever it is done. ``waiting``: nothing comes because the request's text is still
    being written (a streamed text), which the watchdog must not count as stuck.
    ``preroll``: seconds of its audio the speaker holds before it starts playing it, so that
    a piece that comes late (the network, a busy worker) is not a gap at the start.
    """

    @property
    def format(self) -> AudioFormat: ...

    @property
    def waiting(self) -> bool: ...

    @property
    def preroll(self) -> float: ...

    def pcm(self) -> AsyncGenerator[bytes, None]: ...

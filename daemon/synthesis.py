"""What the fronts and the scheduler need of whatever makes the audio, as contracts: the
engine (a model in this process) fulfils them, and on a satellite (``node.role``, issue 19),
which has no model, the fleet's list of the voices its online workers offer fulfils the
fronts' part, while each request carries its audio's source (``Request.source``).

So neither the fronts nor the scheduler import the engine, and a satellite never imports
torch."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tts.audio import AudioFormat
    from tts.compose import Planner, Step
    from tts.options import SynthesisOptions
    from tts.stream import AudioChunk
    from tts.text import TextFormat


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
               text_format: TextFormat = "text") -> AsyncGenerator[AudioChunk, None]: ...

    def stream_steps(self, batches: AsyncGenerator[list[Step], None], voice: str | None,
                     options: SynthesisOptions) -> AsyncGenerator[AudioChunk, None]: ...

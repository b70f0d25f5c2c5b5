"""One request to speak, whatever front it came from.

A request's text is either known up front (``say``) or arrives piece by piece
(``say/stream``, an LLM typing) through a ``TextStream``, whose sentences the engine's
planner releases as soon as each one ends, so synthesis can start before the rest has
arrived. Either way the text is plain text with bracket tags or, with ``format: "ssml"``,
SSML (``Request.text_format``).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from tts.text import TextFormat

from ..errors import RequestError
from .metrics import Timeline

if TYPE_CHECKING:
    from tts.compose import Planner, Step
    from tts.options import SynthesisOptions

    from ..sinks.client import ClientSink
    from ..synthesis.contracts import AudioSource

Mode = Literal["queue", "interrupt"]
SINKS = ("speaker", "mqtt")


def new_id() -> str:
    """Short and unique enough to tell a day of requests apart in logs and topics."""
    return secrets.token_hex(4)


# --------------------------------------------------------------------------- text streams


class TextStream:
    """Text arriving in pieces (``say/stream``, Wyoming's ``synthesize-chunk``: an LLM
    typing), handed in order from the front that receives it to whoever speaks it.

    Only a pipe: ``steps`` gives the text to the engine's planner (``tts.compose.Planner``),
    the one a whole text goes through, so a streamed text is spoken in the same sentences,
    with the same tags carried over and the same pauses, as the same text sent in one piece;
    and each sentence as soon as what follows proves it complete.
    """

    def __init__(self) -> None:
        self.closed = False
        self.total_chars = 0
        self._pieces: list[str] = []
        self._wake = asyncio.Event()
        self._error: Exception | None = None

    def feed(self, piece: str, final: bool = False) -> None:
        if self.closed:
            raise RequestError("this stream has already ended")
        self.total_chars += len(piece)
        self._pieces.append(piece)
        if final:
            self.closed = True
        self._wake.set()

    def fail(self, error: Exception) -> None:
        """End the stream with an error; whoever is reading gets it after the sentences so far."""
        if not self.closed:
            self.closed = True
            self._error = error
            self._wake.set()

    async def _take(self) -> str | None:
        """The text that arrived since the last call (waiting for some); None at the end."""
        while not self._pieces:
            if self.closed:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                return None
            self._wake.clear()
            await self._wake.wait()
        text = "".join(self._pieces)
        self._pieces.clear()
        return text

    async def pieces(self) -> AsyncGenerator[str, None]:
        """The text as it arrives, unplanned (for a worker elsewhere to plan); raises the
        stream's error at its end."""
        while (text := await self._take()) is not None:
            yield text

    async def steps(self, planner: Planner) -> AsyncGenerator[list[Step], None]:
        """The planned text, one sentence's steps at a time as each one completes, so its
        audio never depends on how the text was cut or how fast it came (a fixed seed starts
        afresh on each sentence). SSML can only be parsed whole: it comes at the end, as one
        batch, like an SSML text sent whole."""
        while (text := await self._take()) is not None:
            for batch in _by_sentence(planner.feed(text)):
                yield batch
        rest = planner.finish()
        for batch in ([rest] if planner.fmt == "ssml" and rest else _by_sentence(rest)):
            yield batch


def _by_sentence(steps: list[Step]) -> list[list[Step]]:
    batches: list[list[Step]] = []
    for step in steps:
        if batches and batches[-1][-1].sentence == step.sentence:
            batches[-1].append(step)
        else:
            batches.append([step])
    return batches


# --------------------------------------------------------------------------- the request


@dataclass(eq=False)
class Request:
    """What to say (or, with ``audio``, what to play), how, where to, and when it arrived."""

    text: str  # the whole text; for a stream, what has arrived so far is in `stream`
    id: str = field(default_factory=new_id)
    voice: str | None = None  # resolved voice name (None: the engine's default)
    speaker: str | int | None = None
    rate: float | None = None  # length scale: > 1 slower
    volume: float = 1.0  # 0..1, applied to this request's samples
    mode: Mode = "queue"
    priority: int = 0  # higher first
    sinks: tuple[str, ...] = ("speaker",)
    ts: float | None = None  # sender's wall clock (Unix seconds) when it asked
    # Wall clock (Unix seconds) at which its first sample is to come out of the speaker, a
    # little in the future: several speakers start one announcement together. None: as
    # soon as possible. Set by herald itself, never from a front's payload.
    play_at: float | None = None
    front: str = "mqtt"
    timeline: Timeline = field(default_factory=Timeline)
    seed: int | None = None
    noise_scale: float | None = None
    noise_w: float | None = None
    stream: TextStream | None = None
    text_format: TextFormat = "text"  # "ssml": the text (or the streamed text) is SSML
    # Audio to play as it is instead of text to synthesize (Hermes playBytes): s16le mono PCM
    # at ``audio_rate``. It waits its turn in the speaker queue like any utterance.
    audio: bytes | None = None
    audio_rate: int = 0
    # The client connection that waits for the audio (an HTTP response, a Wyoming client):
    # a sink of this job alone, next to the named ``sinks``.
    client: ClientSink | None = None
    # Audio made elsewhere to play instead of synthesizing ``text`` here
    # (``daemon.synthesis.contracts.AudioSource``: a fleet worker's).
    source: AudioSource | None = None
    # The defaults this request is synthesized on instead of the configured [synthesis]
    # ones: a fleet job carries its owner's gain and sentence pause (daemon.fleet.worker).
    defaults: SynthesisOptions | None = None

    @property
    def whole(self) -> bool:
        """Nobody plays the audio before it is all made: its one consumer is a client that
        takes it whole (an HTTP WAV, a batch item), with no speaker or MQTT stream beside."""
        return not self.sinks and self.client is not None and self.client.whole

    def options(self, base: SynthesisOptions) -> SynthesisOptions:
        """This request's synthesis options on top of the configured defaults (only the
        fields a request can set are replaced; the rest, pauses included, stay configured)."""
        base = self.defaults or base
        return replace(
            base,
            length_scale=self.rate if self.rate is not None else base.length_scale,
            noise_scale=self.noise_scale if self.noise_scale is not None else base.noise_scale,
            noise_w=self.noise_w if self.noise_w is not None else base.noise_w,
            speaker=self.speaker if self.speaker is not None else base.speaker,
            gain=base.gain * self.volume,
            seed=self.seed,
        )

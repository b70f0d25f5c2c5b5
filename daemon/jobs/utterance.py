"""One job's parts while the scheduler holds it: the audio synthesized ahead of its sinks
(``AudioBuffer``), the job itself (``Utterance``) and the lane it waits and runs in, and its
text made audio by the engine (``from_text``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tts.audio import AudioFormat, to_pcm16

from ..errors import RequestError, failure
from .buffer import AudioBuffer
from .metrics import Timeline
from .request import Request

if TYPE_CHECKING:
    from tts.compose import Step
    from tts.options import SynthesisOptions

    from ..synthesis.contracts import Synthesis


@dataclass(eq=False)
class Utterance:
    req: Request
    order: int
    lane: Lane
    done: asyncio.Future[str]
    fmt: AudioFormat | None = None  # what its synthesis comes in, known once it starts
    buffer: AudioBuffer | None = None
    producer: asyncio.Task[None] | None = None
    player: asyncio.Task[None] | None = None
    cut: bool = False
    waiting_text: bool = False
    # One synthesis, several queues (wyoming.also_play): the utterances this one's producer
    # also feeds, and the one whose producer feeds this one.
    tee: list[Utterance] = field(default_factory=list)
    feeder: Utterance | None = None

    def sort_key(self) -> tuple[int, int, int]:
        return (0 if self.req.mode == "interrupt" else 1, -self.req.priority, self.order)


@dataclass(eq=False)
class Lane:
    name: str
    slots: int
    prefetch: bool
    waiting: list[Utterance] = field(default_factory=list)
    running: list[Utterance] = field(default_factory=list)


def whole(utt: Utterance) -> bool:
    """All of the utterance's audio is known: played as it came, or synthesized to the end."""
    return utt.req.audio is not None or (utt.buffer is not None and utt.buffer.complete)


def first_audio(t: Timeline) -> None:
    """The utterance's first audio reached its sink (stamped the first time only)."""
    if t.first_audio is None:
        t.first_audio = time.monotonic()


class SynthesisFailed(Exception):
    """The producer failed after some audio: what was made is played, then this is reported."""

    def __init__(self, error: RequestError) -> None:
        super().__init__(str(error))
        self.error = error


async def slices(pcm: bytes, fmt: AudioFormat, seconds: float) -> AsyncIterator[bytes]:
    """Whole PCM in pieces of about ``seconds``, the way synthesis hands audio over, so the
    speaker's jitter buffer (not one huge push) sets how far ahead of the device it runs."""
    step = max(1, round(fmt.rate * seconds)) * fmt.width * fmt.channels
    for start in range(0, len(pcm), step):
        yield pcm[start:start + step]


async def synthesized(buffer: AudioBuffer) -> AsyncIterator[bytes]:
    """The synthesized PCM; a synthesis error ends it as ``SynthesisFailed``."""
    while True:
        try:
            chunk = await buffer.get()
        except Exception as e:
            raise SynthesisFailed(failure(e)) from e
        if chunk is None:
            return
        yield chunk


def sink_names(req: Request) -> str:
    """Where a job's audio goes, as the log and the latency record name it."""
    return "+".join(req.sinks + ((req.client.name,) if req.client is not None else ()))


def skip_writing(t: Timeline) -> None:
    """Leave out of a streamed text's latency the wait for its first sentence (an LLM
    writing): from then on, herald has something to say."""
    if t.started is not None:
        wait = time.monotonic() - t.started
        t.received += wait
        t.started += wait


async def from_text(engine: Synthesis, utt: Utterance, base: SynthesisOptions,
                    progress: Callable[[], None]) -> AsyncGenerator[bytes, None]:
    """The utterance's text through the engine, as PCM (``base``: the configured defaults
    its options go on; ``progress`` as each streamed sentence comes)."""
    req = utt.req
    opts = req.options(base)
    if req.stream is None:
        chunks = engine.stream(req.text, req.voice, opts, req.text_format, req.whole)
    else:
        planner = engine.planner(req.voice, opts, req.text_format)
        chunks = engine.stream_steps(_arriving(utt, req.stream.steps(planner), progress),
                                     req.voice, opts, lambda w: setattr(utt, "waiting_text", w))
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            yield to_pcm16(chunk.samples)


async def _arriving(utt: Utterance, batches: AsyncGenerator[list[Step], None],
                    progress: Callable[[], None]) -> AsyncGenerator[list[Step], None]:
    """A streamed text's sentences, each one's arrival progress (the engine says when it
    waits for them with nothing in hand: ``Synthesis.stream_steps``)."""
    first = True
    async with contextlib.aclosing(batches):
        while True:
            try:
                steps = await anext(batches)
            except StopAsyncIteration:
                return
            finally:
                progress()
            if first:  # the time the writer took to finish a sentence is not herald's
                first = False
                for u in (utt, *utt.tee):
                    skip_writing(u.req.timeline)
            yield steps

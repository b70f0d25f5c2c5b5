"""What one request sends back: one ``audio-start`` ... ``audio-stop`` (``AudioOut``), fed
from a whole text or from a text stream arriving in pieces (``StreamedText``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Iterator
from typing import TYPE_CHECKING

from wyoming.audio import AudioChunk as WyomingAudioChunk
from wyoming.audio import AudioStart, AudioStop
from wyoming.tts import (
    SynthesizeStopped,
)

from tts import (
    AudioChunk,
    AudioFormat,
    SynthesisOptions,
    UnknownVoice,
    VoiceError,
    to_pcm16,
)
from tts.compose import Planner, Step
from tts.text import MarkupError, TextFormat

from ...logcontext import current_request
from ...metrics import LatencyRecord, Timeline
from ...request import (
    RequestError,
    TextStream,
    refuse_control,
)
from .protocol import FRONT, ClientGone, ClientStalled, Refused

if TYPE_CHECKING:
    from .session import Connection


class AudioOut:
    """One ``audio-start`` ... ``audio-stop`` to the client, and the latency record it makes.

    It is created the moment a request arrives, so every request is counted exactly once —
    finished, stopped (client gone) or refused — whatever point it fails at.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.id = uuid.uuid4().hex[:8]
        self.timeline = Timeline()
        self.voice = "?"
        self.options = conn.front.options
        self.text_format: TextFormat = "text"
        self.fmt: AudioFormat | None = None
        self.samples = 0
        self._started = False
        self._closed = False
        conn.ctx.status.begin(self.id, FRONT)  # speaking, until close()
        # The connection's log lines are about this request from now on (its refusal, which
        # fail() logs after the request's code has returned, included), and so are those of
        # the tasks it starts (a text stream's speaker).
        current_request.set(self.id)

    def set_voice(self, voice: str, options: SynthesisOptions) -> None:
        self.voice = voice
        self.options = options
        self.fmt = self.conn.ctx.engine.audio_format(voice)

    async def speak(self, chunks: AsyncGenerator[AudioChunk, None]) -> None:
        """Send each of the engine's chunks the moment it exists."""
        if self.timeline.started is None:
            self.timeline.started = time.monotonic()
        try:
            async for chunk in chunks:
                await self._send_chunk(chunk)
        except MarkupError as e:  # a streamed SSML text, checked only once it is complete
            raise Refused("bad-markup", str(e)) from None
        except UnknownVoice as e:  # removed since it was resolved: a race with a reload
            raise Refused("unknown-voice", str(e)) from None
        except VoiceError as e:  # e.g. a speaker the voice does not have
            raise Refused("bad-voice", str(e)) from None
        finally:
            await chunks.aclose()  # stops the worker now, not when the generator is collected
        self.timeline.synth_done = time.monotonic()

    async def _send_chunk(self, chunk: AudioChunk) -> None:
        assert self.fmt is not None
        if not self._started:
            await self._start()
        if self.timeline.first_audio is None:
            self.timeline.first_audio = time.monotonic()
        await self.conn.send(WyomingAudioChunk(
            rate=self.fmt.rate, width=self.fmt.width, channels=self.fmt.channels,
            audio=to_pcm16(chunk.samples), timestamp=self._ms()).event())
        self.samples += len(chunk.samples)

    async def _start(self) -> None:
        assert self.fmt is not None
        self._started = True
        await self.conn.send(AudioStart(rate=self.fmt.rate, width=self.fmt.width,
                                        channels=self.fmt.channels, timestamp=0).event())

    async def finish(self) -> None:
        """``audio-stop`` (after an ``audio-start`` even when the text made no sound, so the
        client always gets a well-formed, possibly empty, audio stream)."""
        if not self._started:
            await self._start()
        await self.conn.send(AudioStop(timestamp=self._ms()).event())

    def _ms(self) -> int:
        return round(self.samples * 1000 / self.fmt.rate) if self.fmt else 0

    def close(self, outcome: str) -> None:
        """Count this request once: a latency record if it made audio, else a bare outcome."""
        if self._closed:
            return
        self._closed = True
        metrics = self.conn.ctx.metrics
        if self.samples or (outcome == "ok" and self.fmt is not None):
            seconds = self.samples / self.fmt.rate if self.fmt else 0.0
            metrics.record(LatencyRecord.from_timeline(self.id, FRONT, FRONT, self.voice,
                                                       self.timeline, seconds, outcome=outcome))
        else:
            metrics.request(FRONT, outcome)
        self.conn.ctx.status.end(self.id)

    @contextlib.contextmanager
    def accounting(self) -> Iterator[None]:
        """Close with the right outcome if whatever runs inside fails."""
        try:
            yield
        except (ClientGone, ClientStalled, asyncio.CancelledError):
            self.close("stopped")
            raise
        except BaseException:
            self.close("error")
            raise


class StreamedText:
    """A ``synthesize-start`` ... ``synthesize-stop`` session: text in pieces, one audio stream.

    Events are read while a separate task speaks, so a sentence is synthesized while the
    client is still sending the next ones.
    """

    def __init__(self, conn: Connection, out: AudioOut,
                 local: TextStream | None = None) -> None:
        self.conn = conn
        self.out = out
        self.local = local  # the speaker's copy of the text
        self.text = TextStream()
        self.has_text = False  # anything but white space arrived
        self.begun = False  # the first sentence is planned: latency counts from here
        self.failed = False
        self._task = asyncio.create_task(self._speak(), name=f"wyoming speak {out.id}")

    def add(self, piece: str) -> None:
        limit = self.conn.settings.max_text
        if self.text.total_chars + len(piece) > limit:
            raise Refused("text-too-long", f"streamed text passed {limit} characters "
                           "(wyoming.max_text); send long texts as several streams")
        try:
            refuse_control(piece)
        except RequestError as e:
            raise Refused("bad-text", str(e)) from None
        self.has_text = self.has_text or bool(piece.strip())
        self.text.feed(piece)
        self._feed_local(piece)

    def _feed_local(self, piece: str, final: bool = False) -> None:
        if self.local is None:
            return
        try:
            self.local.feed(piece, final=final)
        except ValueError:  # RequestError: the scheduler ended it (stopped, cut): let it go
            self.local = None

    async def finish(self) -> bool:
        """Speak what is left, end the audio, ``synthesize-stopped``. False if it failed (the
        failure has been reported and the connection is closing)."""
        self.text.feed("", final=True)
        self._feed_local("", final=True)
        await self._task
        if self.failed:
            return False
        if not self.has_text:
            raise Refused("empty-text", "the streamed text was empty: send the words to speak "
                           "in synthesize-chunk events before synthesize-stop")
        await self.out.finish()
        self.out.close("ok")
        await self.conn.send(SynthesizeStopped().event())
        return True

    def _end_local(self, why: str) -> None:
        if self.local is not None:
            self.local.fail(RequestError(why))
            self.local = None

    async def cancel(self) -> None:
        self._end_local("the Wyoming client went away")
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.out.close("stopped")

    async def _speak(self) -> None:
        try:
            with self.out.accounting():
                out, engine = self.out, self.conn.ctx.engine
                planner = engine.planner(out.voice, out.options, out.text_format)
                await out.speak(engine.stream_steps(self._sentences(planner), out.voice,
                                                    out.options))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.failed = True
            self._end_local(f"the Wyoming request failed: {e}")
            await self.conn.fail(e)

    async def _sentences(self, planner: Planner) -> AsyncGenerator[list[Step], None]:
        async with contextlib.aclosing(self.text.steps(planner)) as batches:
            async for steps in batches:
                if not self.begun:
                    # Latency is measured from the moment herald had something to say, not
                    # from synthesize-start: the time a language model takes to write is
                    # not ours.
                    self.begun = True
                    now = time.monotonic()
                    self.out.timeline = Timeline(received=now, started=now)
                yield steps

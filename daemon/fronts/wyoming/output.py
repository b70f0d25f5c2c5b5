"""What one request sends back: its job in the scheduler, and one ``audio-start`` ...
``audio-stop`` fed from the job's audio as it comes (``AudioOut``), for a whole text or for a
text stream arriving in pieces (``StreamedText``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from wyoming.audio import AudioChunk as WyomingAudioChunk
from wyoming.audio import AudioStart, AudioStop
from wyoming.tts import SynthesizeStopped

from tts import AudioFormat, SynthesisOptions
from tts.text import TextFormat

from ...errors import RequestError
from ...jobs.fields import refuse_control
from ...jobs.metrics import Timeline
from ...jobs.request import Request, TextStream, new_id
from ...logs import current_request
from ...sinks.client import ClientSink
from .protocol import FRONT, ClientGone, ClientStalled, Refused, refusal

if TYPE_CHECKING:
    from .connection import Connection


class AudioOut:
    """One request: its job, the ``audio-start`` ... ``audio-stop`` the client gets of it.

    It is created the moment a request arrives, so every request is counted exactly once:
    by its job's latency record once audio of it reached the client, else here.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.id = new_id()
        self.timeline = Timeline()
        self.voice = "?"
        self.options = conn.front.options
        self.text_format: TextFormat = "text"
        self.sink = ClientSink(FRONT)
        self.req: Request | None = None
        self._started = False
        self._samples = 0  # sent so far
        self._closed = False
        # The connection's log lines are about this request from now on (its refusal, which
        # fail() logs after the request's code has returned, included).
        current_request.set(self.id)

    def set_voice(self, voice: str, options: SynthesisOptions) -> None:
        self.voice = voice
        self.options = options

    def submit(self, text: str, stream: TextStream | None = None) -> None:
        """Hand the request to the scheduler (with wyoming.also_play, the speaker gets the
        same audio from the same synthesis). Raises Refused (busy, shutting down)."""
        o = self.options
        speaker = self.conn.settings.also_play and self.conn.ctx.scheduler.speaker is not None
        req = Request(text=text, id=self.id, voice=self.voice, speaker=o.speaker,
                      rate=o.length_scale, noise_scale=o.noise_scale, noise_w=o.noise_w,
                      sinks=("speaker",) if speaker else (), front=FRONT,
                      timeline=self.timeline, stream=stream, text_format=self.text_format,
                      client=self.sink)
        try:
            self.conn.ctx.scheduler.submit(req)
        except RequestError as e:
            raise refusal(e) from None
        self.req = req

    async def send(self) -> None:
        """Send the job's audio as it comes. Raises Refused if the job failed (a job with
        nothing to pronounce is an empty audio stream, as it always was here); a client
        that goes away or stops reading makes the job stop."""
        try:
            fmt = await self.sink.started()
            while (pcm := await self.sink.read()) is not None:
                assert fmt is not None
                await self._send_pcm(pcm, fmt)
        except (ClientGone, ClientStalled, asyncio.CancelledError):
            self.sink.leave()
            raise
        error = self.sink.error
        if error is not None and error.code != "nothing-to-say":
            raise refusal(error)

    async def _send_pcm(self, pcm: bytes, fmt: AudioFormat) -> None:
        if not self._started:
            await self._start(fmt)
        await self.conn.send(WyomingAudioChunk(
            rate=fmt.rate, width=fmt.width, channels=fmt.channels, audio=pcm,
            timestamp=self._ms(fmt)).event())
        self._samples += len(pcm) // (fmt.width * fmt.channels)

    def _ms(self, fmt: AudioFormat | None) -> int:
        return round(self._samples * 1000 / fmt.rate) if fmt else 0

    async def _start(self, fmt: AudioFormat) -> None:
        self._started = True
        await self.conn.send(AudioStart(rate=fmt.rate, width=fmt.width, channels=fmt.channels,
                                        timestamp=0).event())

    async def finish(self) -> None:
        """``audio-stop`` (after an ``audio-start`` even when the text made no sound, so the
        client always gets a well-formed, possibly empty, audio stream)."""
        if not self._started:
            await self._start(self.sink.fmt or self.conn.ctx.engine.audio_format(self.voice))
        await self.conn.send(AudioStop(timestamp=self._ms(self.sink.fmt)).event())

    def close(self, outcome: str) -> None:
        """Count this request once: here if no audio of it reached the client (its job
        files no latency record then), else by its job's latency record."""
        if self._closed:
            return
        self._closed = True
        if self.req is None or not self.sink.written:
            self.conn.ctx.metrics.request(FRONT, outcome)

    @contextlib.contextmanager
    def accounting(self) -> Iterator[None]:
        """Close with the right outcome if whatever runs inside fails."""
        try:
            yield
        except (ClientGone, ClientStalled, asyncio.CancelledError):
            self.sink.leave()
            self.close("stopped")
            raise
        except BaseException:
            self.sink.leave()
            self.close("error")
            raise


class StreamedText:
    """A ``synthesize-start`` ... ``synthesize-stop`` session: text in pieces, one job, one
    audio stream. Events are read while a separate task sends the audio, so a sentence is
    synthesized while the client is still sending the next ones."""

    def __init__(self, conn: Connection, out: AudioOut) -> None:
        self.conn = conn
        self.out = out
        self.text = TextStream()
        self.has_text = False  # anything but white space arrived
        self.failed = False
        out.submit("", stream=self.text)
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
        with contextlib.suppress(RequestError):  # the job has ended: its task reports how
            self.text.feed(piece)

    async def finish(self) -> bool:
        """Speak what is left, end the audio, ``synthesize-stopped``. False if it failed (the
        failure has been reported and the connection is closing)."""
        with contextlib.suppress(RequestError):
            self.text.feed("", final=True)
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

    async def cancel(self) -> None:
        self.out.sink.leave()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.out.close("stopped")

    async def _speak(self) -> None:
        try:
            with self.out.accounting():
                await self.out.send()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.failed = True
            await self.conn.fail(e)

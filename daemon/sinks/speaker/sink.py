"""Local playback through sounddevice (PortAudio -> ALSA).

What the scheduler calls is ``daemon.sinks.protocol.Speaker``. Around this module:
``mixer`` (what the audio callback plays: jitter buffers, volume, cue, fade) and ``device``
(finding, opening, retrying and closing the sound device).

How it works. One PortAudio output stream per device and rate, opened once and kept; it is
*started* when an utterance has its pre-roll buffered and it *completes itself* (the
callback returns "complete") when the utterance's last sample has been handed over, so
PortAudio drains the device and only then reports the stream finished: that report is what
lets ``play()`` return, so a "finished" event means the listener heard the end. Nothing runs
while nobody speaks (no CPU, no silence streamed to the device).

Back to back. Restarting the stream costs silence: PortAudio and ALSA put about a device
buffer of it before the first block (0.18 s in all at the default ``latency_ms``, measured
on ALSA's file plugin), on top of the next utterance's wait for its turn. So when the
scheduler knows the next utterance whole before the current one ends, it *cues* it: at the
current utterance's last sample the callback goes on with the cued one's ``pause`` of
silence and then its audio, in the same block, and counts the current one as heard once
the device has played a buffer's worth more (``drain_seconds``). Only an utterance that ends
by itself hands over; a cut one completes the stream as before.

Between the event loop and PortAudio's thread sits each utterance's jitter buffer (see
``mixer``): the stream starts once ``preroll_ms`` is buffered, and an utterance starved
longer than ``park_ms`` (an LLM thinking between sentences) completes the stream, which is
restarted when audio is back; this also keeps a device that takes audio faster than real
time (ALSA's null/file plugins) from spinning on silence.

When the device can't take the voice's rate, the stream opens at the device's default rate
and ``tts.resample`` converts (polyphase windowed sinc, in a worker thread).

At a given time: ``play(..., start_at=T)`` holds the utterance, buffering, until a loop
timer starts the stream just early enough; the callback starts its audio at the frame whose
DAC time is T (``clock``, ``mixer``). Late, it starts as soon as it can and says by how much.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, Callable
from functools import partial
from typing import Any

import numpy as np

from tts import AudioFormat
from tts.resample import Resampler

from ...jobs.metrics import Metrics
from ...settings import SpeakerSettings
from ..protocol import SpeakerUnavailable
from .clock import DeviceClock
from .device import Device, Output
from .mixer import Mixer, State
from .playback import Playback, PlaybackStats, Quiet

log = logging.getLogger("herald.speaker")


class SpeakerSink:
    name = "speaker"

    def __init__(self, settings: SpeakerSettings, metrics: Metrics, retries: bool = True) -> None:
        """``retries=False``: a one-off player (``herald say``) that reports a failed device
        to its caller alone, without the daemon's "retrying" log line."""
        self.settings = settings
        # Underruns reach Prometheus through the latency record (``PlaybackStats.underruns``
        # -> ``LatencyRecord.underruns``), so the sink doesn't count them here as well.
        self.metrics = metrics
        self._dev = Device(settings, retries)
        # Which utterance the callback plays, cued and draining: the callback switches them
        # too (a cue taking over), so they are changed under ``_mix.lock``.
        self._mix: Mixer[Playback] = Mixer(float(settings.volume))
        # The open stream's clock (this one stands in until a stream opens).
        self._clock = DeviceClock(settings.latency_ms / 1000, settings.rate or 48000)
        self._running = False  # stream started and its completion not yet seen
        self._starting = False
        self._died_starting = False  # the stream stopped while it was being started
        self._ended_at: float | None = None  # when an utterance that ended by itself drained
        self._play_lock = asyncio.Lock()
        self._ticks = 0  # callbacks so far: lets play() notice a stalled device
        self._quiet: Quiet | None = None  # the utterance waited for, while it isn't moving
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False

    # ----------------------------------------------------------------------- public

    @property
    def volume(self) -> float:
        return self._mix.target

    @volume.setter
    def volume(self, value: float) -> None:
        v = float(value)
        if not 0.0 <= v <= 1.0 or v != v:
            raise ValueError(f"volume must be between 0 and 1, got {value!r}")
        self._mix.target = v

    @property
    def device(self) -> str | int | None:
        return self.settings.device

    @device.setter
    def device(self, value: str | int | None) -> None:
        """Switch devices: the current utterance finishes where it is, the next one opens
        the new device (and a failed device is retried at once)."""
        self.settings.device = value
        self._dev.retry_now()
        with self._mix.lock:
            self._mix.cue = self._mix.cue_key = None  # it would follow on the old device

    async def start(self, fmt: AudioFormat | None = None) -> None:
        """Open the device now (for ``fmt``, usually the default voice's format) so the first
        utterance doesn't pay for it. A missing device is logged, not raised: the daemon
        keeps serving its other sinks and ``play()`` retries."""
        self._closing = False
        self._loop = asyncio.get_running_loop()
        self._dev.reopen_thread()
        if not self.settings.enabled:
            return
        try:
            if fmt is not None:
                await self._ensure_output(fmt)
            else:  # no format yet: at least say now whether the device is there
                log.info("speaker: will play on %r", await self._dev.probe())
        except SpeakerUnavailable as e:
            if fmt is None:
                self._dev.gone(e)

    async def stop(self) -> None:
        """Cut what's playing (with its fade), forget the cue, then close the device."""
        p = self._mix.current
        if p is not None and not p.done.done():
            self.cut()
            try:
                async with asyncio.timeout(0.5):
                    await asyncio.shield(p.done)
            except Exception:  # timeout or a failing device: closing is all we can do
                pass
        self._closing = True
        await self._close_output()
        self._dev.close_thread()

    def cut(self, key: object = None) -> None:
        """Interrupt an utterance: fade it out over ``fade_ms``, drop the rest. ``key``: the
        one play() or cue() was given that key (a cue that hasn't started is just forgotten);
        None: the one being heard."""
        with self._mix.lock:
            if key is not None and self._mix.cue_key is key:
                self._mix.cue = self._mix.cue_key = None
            if key is None:
                p = self._mix.current
            else:
                p = next((q for q in (self._mix.current, *self._mix.draining)
                          if q is not None and q.key is key), None)
            if p is not None and p is self._mix.unclaimed:
                self._mix.unclaimed = None  # stopped before play() claimed it: nothing to claim
        if p is not None:
            self._cut(p)

    def cue(self, key: object, fmt: AudioFormat, pcm: bytes, pause: float = 0.0,
            on_first_audio: Callable[[], None] | None = None) -> None:
        """Have ``pcm``, a whole utterance (s16le mono), follow the one playing now: if that
        one ends by itself, ``pause`` seconds of silence and then this audio go on in the same
        device stream, with no restart. play(..., key=key) claims it and returns when it has
        drained; cut(key) forgets it, or fades it out if it has started. A new cue replaces
        one that hasn't started. No stream open for ``fmt``, or more audio than the jitter
        buffer holds: no cue, and play() plays it the usual way."""
        loop, out = self._loop, self._dev.out
        with self._mix.lock:
            self._mix.cue = self._mix.cue_key = None
            if (not self.settings.enabled or loop is None or out is None or self._dev.reinit
                    or out.src_rate != fmt.rate or fmt.width != 2 or fmt.channels != 1):
                return
            self._mix.cue_key = key
        samples = np.frombuffer(pcm[:len(pcm) // 2 * 2], dtype="<i2").astype(np.float32)
        p = Playback(loop, fmt.rate, out.rate, self.settings, on_first_audio, key)
        if not len(samples) or len(samples) * out.rate / fmt.rate > p.max_frames:
            with self._mix.lock:
                self._mix.cue_key = None
            return
        p.lead_in = int(pause * out.rate)  # the device is running: no wake-up lead-in
        p.cued = len(samples)
        if out.rate == fmt.rate:
            self._set_cue(p, out, samples)
        else:
            loop.create_task(self._resample_cue(p, out, samples), name="speaker-cue")

    async def play(self, fmt: AudioFormat, chunks: AsyncIterable[bytes],
                   on_first_audio: Callable[[], None] | None = None, key: object = None,
                   pause: float = 0.0, start_at: float | None = None,
                   preroll: float = 0.0) -> PlaybackStats:
        """Play one utterance; returns when it has drained from the device or was cut.

        One utterance at a time: a second call waits for the first. ``key`` names it for
        cut(key), and claims its cue if that is playing already (``chunks`` then only confirm
        what the cue holds). ``pause``: at least this much silence after the previous
        utterance, if that one ended by itself (consecutive utterances are paragraphs).
        ``start_at`` (wall clock, ``time.time()``): its first sample reaches the device's
        output then, or as soon as it can after (``pause`` then doesn't apply); the stats'
        ``skew`` says how late it was. ``preroll``: seconds of it buffered before it starts
        (and resumes after an underrun), if more than ``preroll_ms``."""
        if fmt.width != 2 or fmt.channels != 1:
            raise ValueError(f"the speaker takes 16-bit mono PCM, got {fmt}")
        if not self.settings.enabled:
            raise SpeakerUnavailable("the speaker is disabled (speaker.enabled = false)")
        async with self._play_lock:
            loop = self._loop = asyncio.get_running_loop()
            with self._mix.lock:
                started, self._mix.unclaimed = self._mix.unclaimed, None
                p = started if key is not None and started is not None and started.key is key \
                    else None
                if p is None and key is not None and self._mix.cue_key is key:
                    self._mix.cue = self._mix.cue_key = None  # cued, but never took over
            claimed = p is not None
            if p is not None:
                p.also_on_first_audio(on_first_audio)
                feeder = loop.create_task(self._confirm(p, chunks), name="speaker-confirm")
            else:
                if started is not None:  # a cue that went on, but something else comes now
                    self._cut(started)
                prev = self._mix.current
                if prev is not None and not prev.done.done():  # a cancelled play still fading
                    try:
                        async with asyncio.timeout(1.0):
                            await asyncio.shield(prev.done)
                    except Exception:
                        pass
                out = await self._ensure_output(fmt, start_at)
                p = Playback(loop, fmt.rate, out.rate, self.settings, on_first_audio, key)
                p.preroll = max(p.preroll, int(preroll * out.rate))
                if start_at is None:
                    p.lead_in = max(p.lead_in, self._pause_left(pause, out.rate))
                else:  # the device's lead-in comes before the instant (Playback.held)
                    p.start_at, p.lead_in = start_at, 0
                with self._mix.lock:
                    self._mix.current = p
                feeder = loop.create_task(self._feed(p, out, chunks), name="speaker-feed")
            self._ended_at = None
            try:
                await self._wait(p, feeder)
                if claimed and not p.cut:  # a short cue may drain before its chunks are in
                    await feeder
            except BaseException:
                self._cut(p)  # cancelled (SIGTERM, stop): fade out, don't click
                raise
            finally:
                if not feeder.done():
                    feeder.cancel()
                    try:
                        await feeder
                    except BaseException:  # noqa: B012 - the feeder's end is not our result
                        pass
                with self._mix.lock:
                    if self._mix.current is p and p.done.done():
                        self._mix.current = None
            with p.lock:
                frames, underruns, xruns, was_cut = p.frames_out, p.underruns, p.xruns, p.cut
                first_dac = p.first_dac
            if not was_cut:
                self._ended_at = time.monotonic()
            skew = None
            if start_at is not None and first_dac is not None:
                skew = self._clock.to_wall(first_dac) - start_at
            return PlaybackStats(samples=round(frames * p.src_rate / p.dev_rate),
                                 underruns=underruns, cut=was_cut, device_rate=p.dev_rate,
                                 xruns=xruns, skew=skew)

    # ---------------------------------------------------------------- loop side

    async def _feed(self, p: Playback, out: Output, chunks: AsyncIterable[bytes]) -> None:
        """Move chunks into the jitter buffer (resampled if needed) and start the stream."""
        resampler = Resampler(out.src_rate, out.rate) if out.rate != out.src_rate else None
        carry = b""  # an odd trailing byte waits for the next chunk
        try:
            async for data in chunks:
                if p.cut:
                    return
                data = carry + bytes(data)
                cut_at = len(data) - len(data) % 2
                data, carry = data[:cut_at], data[cut_at:]
                samples = np.frombuffer(data, dtype="<i2").astype(np.float32)
                if resampler is not None and len(samples):
                    samples = await asyncio.to_thread(resampler.process, samples)
                await self._push(p, samples)
            if resampler is not None:
                await self._push(p, resampler.flush())
        finally:
            with p.lock:
                p.producing = False
            self._settle(p)

    async def _confirm(self, p: Playback, chunks: AsyncIterable[bytes]) -> None:
        """play()'s audio for an utterance that has been playing from its cue: the same
        samples, all buffered already, so they are only counted."""
        n = 0
        async for data in chunks:
            if p.cut:
                return
            n += len(data)
        if n // 2 != p.cued:
            log.warning("speaker: the cue held %d samples but play() brought %d; the cue "
                        "was played", p.cued, n // 2)

    def _set_cue(self, p: Playback, out: Output, samples: np.ndarray) -> None:
        with p.lock:
            p.push(samples)
            p.producing = False
        with self._mix.lock:
            if self._mix.cue_key is p.key and self._dev.out is out:  # still wanted, same stream
                self._mix.cue = p

    async def _resample_cue(self, p: Playback, out: Output, samples: np.ndarray) -> None:
        resampler = Resampler(p.src_rate, p.dev_rate)
        self._set_cue(p, out, await asyncio.to_thread(
            lambda: np.concatenate([resampler.process(samples), resampler.flush()])))

    def _pause_left(self, pause: float, rate: int) -> int:
        """Frames of ``pause`` still to come since the last utterance that ended by itself."""
        if pause <= 0 or self._ended_at is None:
            return 0
        return max(0, int((pause - (time.monotonic() - self._ended_at)) * rate))

    def _cut(self, p: Playback) -> None:
        """Fade ``p`` out (or end it, if nothing of it is audible yet) and drop the rest."""
        if p.done.done():
            return
        p.interrupt()
        p.space.set()
        self._settle(p)

    async def _push(self, p: Playback, samples: np.ndarray) -> None:
        with p.lock:
            p.push(samples)
            full = p.buffered > p.max_frames
            if full:
                p.want_space = True
                p.space.clear()
        self._settle(p)
        if full:
            await p.space.wait()

    def _settle(self, p: Playback) -> None:
        """While the stream is stopped, decide what the utterance needs: a (re)start once
        its pre-roll is there, or the end when there is nothing (more) to play."""
        if p.done.done() or self._running or self._starting:
            return
        with p.lock:
            state, cut, ready = p.state, p.cut, p.ready()
            exhausted = not p.producing and p.buffered == 0
        if state is State.ENDED or (state in (State.WAITING, State.PARKED)
                                     and (cut or exhausted)):
            p.finish()
        elif state in (State.WAITING, State.PARKED) and ready and not p.held(
                self._clock, self.settings.lead_in_ms / 1000, self._settle):
            self._starting = True
            asyncio.get_running_loop().create_task(self._start_stream(p))

    async def _start_stream(self, p: Playback) -> None:
        out = self._dev.out
        try:
            if out is None:
                raise SpeakerUnavailable("the sound device was closed")
            with p.lock:
                go = p.state in (State.WAITING, State.PARKED) and not p.cut
                if go:
                    p.state = State.PLAYING
            if not go:  # cut while this task was on its way
                self._starting = False
                self._settle(p)
                return
            self._running = True
            # PortAudio ends the audio thread of a start it refuses and reports the stream
            # finished: that report is not the device going away (_on_finished).
            if not await self._dev.start(out, partial(self._may_start, p),
                                         self._start_by(p.start_at)):
                self._running = False
                if p.cut:
                    p.finish()
            elif self._died_starting:  # it started, and stopped before start() returned
                raise SpeakerUnavailable(self._unplugged())
        except SpeakerUnavailable as e:
            self._running = False
            self._starting = False
            await self._fail(p, e)
            return
        finally:
            self._starting = False
        # A device faster than real time may have played it all before start() returned, and
        # the cue after it too: the hand-over made the cue the current one. The completion
        # report found us still starting and left the rest to us, for whichever is current.
        for q in dict.fromkeys((p, self._mix.current)):
            if q is not None:
                self._settle(q)

    def _start_by(self, start_at: float | None) -> float | None:
        """The latest moment (``time.monotonic()``) to start the stream for a first sample at
        ``start_at``, the device's lead-in included; None without a start time."""
        return self._clock.start_by(start_at, self.settings.lead_in_ms / 1000)

    def _may_start(self, p: Playback) -> bool:
        """Before each try at starting the stream for ``p``: whether it still needs it."""
        going = p.needs_stream()
        if going:
            self._died_starting = False
            self._clock.starting()
        return going

    async def _wait(self, p: Playback, feeder: asyncio.Task[None]) -> None:
        """Wait for the utterance to drain; notice a failed feeder or a stalled playback.

        The stall rule: the utterance makes progress while the callback runs (it hands audio
        to the device, or the device drains what it was given), while the stream is being
        started, and while it waits for its source (the pre-roll after a slow synthesis).
        Otherwise nothing can move it: quiet for half the margin, it is reported (``stalled()``,
        for ``/healthz`` and the watchdog); quiet for longer than its audio left could take
        plus the margin, it is ended with SpeakerUnavailable and the device reopened."""
        out = self._dev.out
        name = out.device_name if out is not None else "?"
        # What a working device may take to move: its buffer a few times over, with room for
        # a late thread; never less than 2 s.
        margin = max(2.0, 4 * (out.drain_seconds if out is not None else 0.0) + 1.0)
        ticks, since = self._ticks, time.monotonic()

        def source_error() -> BaseException | None:
            return feeder.exception() if feeder.done() and not feeder.cancelled() else None

        waiting: set[asyncio.Future[Any]] = {p.done, feeder}
        try:
            while not p.done.done():
                await asyncio.wait(waiting, timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
                if feeder.done():
                    if source_error() is not None:
                        break
                    waiting = {p.done}  # fed completely: only the device is left to wait for
                now = time.monotonic()
                if (self._ticks != ticks or self._starting or p.waits_for_source()
                        or p.wake is not None):  # held for its start time
                    ticks, since = self._ticks, now
                    self._quiet = None
                    continue
                self._quiet = Quiet(since, margin / 2, name)
                left = p.seconds_left()  # no progress: what it holds is all still to play
                if now - since > left + margin and not p.done.done():
                    await self._fail(p, SpeakerUnavailable(
                        f"the sound device {name!r} stopped taking audio (nothing for "
                        f"{now - since:.0f} s, with {left:.1f} s of audio still to play); it "
                        "will be reopened for the next utterance"))
        finally:
            self._quiet = None
        error = source_error()
        if error is not None:
            log.warning("speaker: the audio source failed (%s); fading out", error)
            self._cut(p)
            try:
                async with asyncio.timeout(margin):
                    await asyncio.shield(p.done)
            except Exception:
                pass
            raise error
        await p.done  # raises what finish() was given

    def stalled(self) -> str | None:
        """What is wrong, while an utterance has audio to play and the device takes none
        (for longer than a working device would); None otherwise."""
        quiet = self._quiet
        return quiet.stalled() if quiet is not None else None

    async def _fail(self, p: Playback | None, error: SpeakerUnavailable) -> None:
        log.warning("speaker: %s", error)
        await self._close_output(error)
        self._dev.reinit = True
        if p is not None and not p.done.done():
            p.finish(error)

    async def _ensure_output(self, fmt: AudioFormat, start_at: float | None = None
                             ) -> Output:
        """The open stream for ``fmt``, (re)opening it if the format or device changed
        (soon enough for a first sample at ``start_at``, if it can)."""
        out = self._dev.out
        if out is not None and out.src_rate == fmt.rate and not self._dev.reinit:
            return out
        await self._close_output()
        out = await self._dev.open(fmt, lambda channels: partial(self._callback, channels),
                                   self._finished, self._start_by(start_at))
        # What the device holds ahead of the block being written, as PortAudio reports it
        # (its output latency; ALSA may hold up to a period more, and buffers past the
        # device are not seen, as by PortAudio's own drain).
        self._mix.rate, self._mix.drain_frames = out.rate, int(out.drain_seconds * out.rate)
        self._clock = self._mix.clock = DeviceClock(out.drain_seconds, out.rate)
        return out

    async def _close_output(self, error: SpeakerUnavailable | None = None) -> None:
        """Close the stream; whatever it was still playing ends (with ``error``)."""
        self._running = False
        with self._mix.lock:
            ended = [q for q in (self._mix.current, self._mix.unclaimed, *self._mix.draining)
                     if q is not None]
            self._mix.cue = self._mix.cue_key = self._mix.unclaimed = None
            self._mix.draining = []
        for q in ended:
            if not q.done.done():
                q.finish(error)
        await self._dev.close()

    # --------------------------------------------------------- PortAudio's thread

    def _callback(self, channels: int, outdata: Any, frames: int, time_info: Any,
                  status: Any) -> None:
        """Fill one device block. Must not block, allocate much, or raise (except Stop)."""
        self._ticks += 1
        stop = False
        try:
            dac = self._clock.tick(time_info.currentTime, time_info.outputBufferDacTime,
                                   frames)
            block, stop = self._mix.render(frames, bool(status.output_underflow), dac)
            pcm = np.clip(np.rint(block), -32768, 32767).astype("<i2")
        except Exception:
            log.exception("speaker: audio callback failed; playing silence")
            pcm = np.zeros(frames, dtype="<i2")
        if channels > 1:
            pcm = np.repeat(pcm, channels)
        outdata[:] = pcm.tobytes()
        if stop:
            raise self._dev.callback_stop

    def _finished(self) -> None:
        """PortAudio: the stream has stopped and the device has played what it was given."""
        loop, generation = self._loop, self._dev.generation
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._on_finished, generation)
            except RuntimeError:  # loop closed
                pass

    def _on_finished(self, generation: int) -> None:
        """On the loop: the stream completed (or died)."""
        if generation != self._dev.generation:
            return  # a report from before the latest start
        self._running = False
        with self._mix.lock:  # the stream has drained: whatever was handed over has been heard
            drained, self._mix.draining = self._mix.draining, []
        for d in drained:
            d.finish()
        p = self._mix.current
        if self._closing or p is None or p.done.done():
            return
        with p.lock:
            state = p.state
        if state in (State.ENDED, State.PARKED, State.WAITING):
            self._settle(p)  # finish, or restart once the pre-roll is back
        elif self._starting:  # a refused start's, or one that died at once: _start_stream's
            self._died_starting = True
        else:
            asyncio.get_running_loop().create_task(self._fail(p, SpeakerUnavailable(
                self._unplugged())))

    def _unplugged(self) -> str:
        name = self._dev.out.device_name if self._dev.out else "?"
        return (f"the sound device {name!r} stopped unexpectedly (unplugged?); it will be "
                "reopened for the next utterance")

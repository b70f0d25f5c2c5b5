"""Local playback through sounddevice (PortAudio -> ALSA).

Contract used by the scheduler:

    sink = SpeakerSink(settings, metrics)
    await sink.start(fmt)                   # fmt optional: opens the device ahead of time
    await sink.stop()
    sink.volume = 0.5                       # 0..1, ramps in over ~20 ms from the next block
    sink.device = "USB"                     # another device from the next utterance on
    stats = await sink.play(fmt, chunks, on_first_audio, key=None, pause=0.0)
        # fmt: tts.AudioFormat; chunks: AsyncIterator[bytes] of s16le mono PCM.
        # Returns once the audio has drained from the device (PlaybackStats).
        # on_first_audio() is called (on the loop) when the first block of real audio is
        # handed to PortAudio.
        # key: names this utterance for cut(key) and cue(key, ...) (any object, by identity).
        # pause: seconds of silence at least between the previous utterance, if it ended by
        # itself, and this one.
        # Raises SpeakerUnavailable when the device is missing, busy or fails (after logging).
    sink.cue(key, fmt, pcm, pause, on_first_audio)
        # The whole next utterance, known before the current one ends: it follows the
        # current one after `pause`, in the same device stream; play(..., key=key) claims it.
    sink.cut(key=None)                      # interrupt: 15 ms fade-out, play() returns early

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

Between the event loop and PortAudio's thread sits a jitter buffer (a deque of float blocks
under a lock held only for deque operations). The callback never blocks and never raises:

* pre-roll: the stream starts only once ``preroll_ms`` of audio (or the whole utterance, if
  shorter) is buffered, so the first blocks don't underrun;
* underrun: the callback finds the buffer empty while the utterance is still producing. It
  plays silence, counts one underrun for the episode, and waits for the pre-roll again
  before resuming. A starvation longer than ``park_ms`` (an LLM thinking between sentences)
  completes the stream; it is restarted when audio is back. This also keeps a device that
  takes audio faster than real time (ALSA's null/file plugins) from spinning on silence.
* volume is a per-sample linear ramp (full scale in 20 ms) towards the target, so changing
  it mid-word doesn't click ("zipper noise"); ``cut()`` fades out over ``fade_ms``.

When the device can't take the voice's rate, the stream opens at the device's default rate
and ``tts.resample`` converts (polyphase windowed sinc, in a worker thread).

Every PortAudio call that can block (open, start, stop, close) runs in one dedicated thread,
which also serialises them; the loop awaits them with a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, Field

from tts import AudioFormat
from tts.resample import Resampler

from ...metrics import Metrics

log = logging.getLogger("herald.speaker")

T = TypeVar("T")

VOLUME_RAMP_SECONDS = 0.02  # a full 0 -> 1 volume change takes this long


class SpeakerUnavailable(Exception):
    """The sound device is missing, busy or failed. The message says what to do."""


class SpeakerSettings(BaseModel):
    enabled: bool = True
    # PortAudio device: a number, or (part of) a name, case-insensitive; None = system default.
    device: str | int | None = None
    volume: float = Field(1.0, ge=0.0, le=1.0)
    # Device sample rate. None: the voice's rate if the device takes it, else the device's
    # default rate (with resampling). Set it for devices that misreport what they accept.
    rate: int | None = Field(None, ge=8000, le=384000)
    preroll_ms: float = Field(60.0, ge=0.0, le=5000.0)  # buffered before the stream starts
    lead_in_ms: float = Field(0.0, ge=0.0, le=2000.0)  # silence first: devices that wake late
    fade_ms: float = Field(15.0, ge=1.0, le=500.0)  # fade-out on cut()
    latency_ms: float = Field(100.0, ge=5.0, le=2000.0)  # device buffer PortAudio asks for
    block_ms: float = Field(20.0, ge=2.0, le=200.0)  # audio per callback
    park_ms: float = Field(500.0, ge=50.0, le=60000.0)  # starvation before the stream stops
    max_buffer_seconds: float = Field(30.0, ge=1.0)  # jitter buffer bound (feeding waits)
    retry_seconds: float = Field(10.0, ge=0.0)  # after a failed open, fail fast this long
    device_timeout: float = Field(5.0, gt=0.0)  # a PortAudio call taking longer = failure


@dataclass
class PlaybackStats:
    samples: int = 0  # samples of the input (voice rate) handed to the device
    underruns: int = 0  # episodes of an empty buffer while the utterance was producing
    cut: bool = False
    device_rate: int = 0  # rate the device ran at (!= input rate: resampled)
    xruns: int = 0  # underflows PortAudio reported on the device itself


class _State(Enum):
    WAITING = "waiting"  # stream not running: pre-roll (or re-buffering after a park)
    PLAYING = "playing"  # the callback takes audio from the buffer
    STARVED = "starved"  # buffer empty while producing: silence, counting one underrun
    PARKED = "parked"  # starved too long: stream completing, restarted when audio is back
    FADING = "fading"  # cut while audible: fading out
    ENDED = "ended"  # every sample handed over; waiting for the device to drain
    DONE = "done"


class _Playback:
    """One utterance's jitter buffer and state, shared by the loop and the audio callback.

    Fields below the lock line are only touched with ``lock`` held."""

    def __init__(self, loop: asyncio.AbstractEventLoop, src_rate: int, dev_rate: int,
                 settings: SpeakerSettings, on_first_audio: Callable[[], None] | None,
                 key: object = None) -> None:
        ms = dev_rate / 1000.0
        self.loop = loop
        self.key = key  # what play()/cue() named it, for cut(key)
        self.src_rate, self.dev_rate = src_rate, dev_rate
        self.preroll = int(settings.preroll_ms * ms)
        self.park_after = int(settings.park_ms * ms)
        self.fade_total = max(1, int(settings.fade_ms * ms))
        self.max_frames = int(settings.max_buffer_seconds * dev_rate)
        self.on_first_audio = on_first_audio
        self.done: asyncio.Future[None] = loop.create_future()
        self.space = asyncio.Event()
        self.lock = threading.Lock()
        # --- guarded by lock ---
        self.state = _State.WAITING
        self.blocks: deque[np.ndarray] = deque()
        self.buffered = 0
        self.producing = True
        self.lead_in = int(settings.lead_in_ms * ms)
        self.starved_frames = 0
        self.fade_left = self.fade_total
        self.want_space = False
        self.first_sent = False
        self.cut = False
        self.frames_out = 0
        self.underruns = 0
        self.xruns = 0
        # --- not under lock: the callback's alone (under the sink's lock), or set before
        # the cue is handed to the callback
        self.drain_left = 0  # handed over to a cued utterance: frames until it has been heard
        self.cued = 0  # a cue's input samples (what its play() must bring again)

    def ready(self) -> bool:
        """Enough buffered to (re)start: the pre-roll, or all there will be."""
        return self.buffered >= self.preroll or (not self.producing and self.buffered > 0)

    def waits_for_source(self) -> bool:
        """Stopped or starved until its source brings more: not the device's delay."""
        with self.lock:
            return (self.producing and not self.ready()
                    and self.state in (_State.WAITING, _State.STARVED, _State.PARKED))

    def push(self, samples: np.ndarray) -> None:
        if len(samples):
            self.blocks.append(samples)
            self.buffered += len(samples)

    def take(self, out: np.ndarray) -> int:
        """Fill the start of ``out`` from the buffer; returns the frames taken."""
        n = 0
        while n < len(out) and self.blocks:
            block = self.blocks[0]
            k = min(len(block), len(out) - n)
            out[n:n + k] = block[:k]
            n += k
            if k == len(block):
                self.blocks.popleft()
            else:
                self.blocks[0] = block[k:]
        self.buffered -= n
        return n

    def drop(self) -> None:
        self.blocks.clear()
        self.buffered = 0

    def signal(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the loop (from PortAudio's thread)."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed: nobody is waiting any more
            pass

    def finish(self, error: BaseException | None = None) -> None:
        """On the loop: resolve ``play()``'s wait."""
        with self.lock:
            self.state = _State.DONE
        if not self.done.done():
            if error is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(error)
        self.space.set()


@dataclass
class _Quiet:
    """An utterance that has made no progress since ``since`` (monotonic)."""

    since: float
    report_after: float  # seconds of it that a working device may show
    device: str


@dataclass
class _Output:
    """An open PortAudio stream and what it was opened for."""

    stream: Any  # sounddevice.RawOutputStream
    device: int
    device_name: str
    src_rate: int  # the input rate this stream was chosen for
    rate: int  # the device's rate
    channels: int
    drain_seconds: float  # device latency PortAudio reports


class SpeakerSink:
    name = "speaker"

    def __init__(self, settings: SpeakerSettings, metrics: Metrics, retries: bool = True) -> None:
        """``retries=False``: a one-off player (``herald say``) that reports a failed device
        to its caller alone, without the daemon's "retrying" log line."""
        self.settings = settings
        self._retries = retries
        # Underruns reach Prometheus through the latency record (``PlaybackStats.underruns``
        # -> ``LatencyRecord.underruns``), so the sink doesn't count them here as well.
        self.metrics = metrics
        self._target = float(settings.volume)
        self._gain = self._target  # callback-owned: the gain reached so far
        self._sd: Any = None  # the sounddevice module, imported on first use
        self._pa = ThreadPoolExecutor(max_workers=1, thread_name_prefix="herald-speaker")
        self._pa_closed = False
        self._out: _Output | None = None
        self._running = False  # stream started and its completion not yet seen
        self._starting = False
        self._current: _Playback | None = None  # the one the callback plays
        # Also switched by the callback (a cue taking over), so changed under this lock:
        self._lock = threading.Lock()
        self._cue: _Playback | None = None  # the next utterance, whole, ready to follow
        self._cue_key: object = None  # the cue asked for last (its audio may be resampling)
        self._unclaimed: _Playback | None = None  # a cue playing before play() claimed it
        self._draining: list[_Playback] = []  # handed over to a cue, still in the device
        self._ended_at: float | None = None  # when an utterance that ended by itself drained
        self._play_lock = asyncio.Lock()
        self._failed_at: float | None = None
        self._failure = ""
        self._reinit = False  # re-scan devices before the next open
        self._ticks = 0  # callbacks so far: lets play() notice a stalled device
        self._quiet: _Quiet | None = None  # the utterance waited for, while it isn't moving
        self._generation = 0  # stream starts so far: tells stale completion reports apart
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False

    # ----------------------------------------------------------------------- public

    @property
    def volume(self) -> float:
        return self._target

    @volume.setter
    def volume(self, value: float) -> None:
        v = float(value)
        if not 0.0 <= v <= 1.0 or v != v:
            raise ValueError(f"volume must be between 0 and 1, got {value!r}")
        self._target = v

    @property
    def device(self) -> str | int | None:
        return self.settings.device

    @device.setter
    def device(self, value: str | int | None) -> None:
        """Switch devices: the current utterance finishes where it is, the next one opens
        the new device (and a failed device is retried at once)."""
        self.settings.device = value
        self._failed_at = None
        self._reinit = True
        with self._lock:
            self._cue = self._cue_key = None  # it would follow on the old device

    async def start(self, fmt: AudioFormat | None = None) -> None:
        """Open the device now (for ``fmt``, usually the default voice's format) so the first
        utterance doesn't pay for it. A missing device is logged, not raised: the daemon
        keeps serving its other sinks and ``play()`` retries."""
        self._closing = False
        self._loop = asyncio.get_running_loop()
        if self._pa_closed:
            self._pa = ThreadPoolExecutor(max_workers=1, thread_name_prefix="herald-speaker")
            self._pa_closed = False
        if not self.settings.enabled:
            return
        try:
            if fmt is not None:
                await self._ensure_output(fmt)
            else:  # no format yet: at least say now whether the device is there
                name = await self._pa_call(self._probe, "look up the sound device")
                log.info("speaker: will play on %r", name)
        except SpeakerUnavailable as e:
            if fmt is None:
                self._failed_at, self._failure, self._reinit = time.monotonic(), str(e), True
                self._log_retry(e)

    async def stop(self) -> None:
        """Cut what's playing (with its fade), forget the cue, then close the device."""
        p = self._current
        if p is not None and not p.done.done():
            self.cut()
            try:
                await asyncio.wait_for(asyncio.shield(p.done), 0.5)
            except Exception:  # timeout or a failing device: closing is all we can do
                pass
        self._closing = True
        await self._close_output()
        self._pa.shutdown(wait=False, cancel_futures=True)
        self._pa_closed = True

    def cut(self, key: object = None) -> None:
        """Interrupt an utterance: fade it out over ``fade_ms``, drop the rest. ``key``: the
        one play() or cue() was given that key (a cue that hasn't started is just forgotten);
        None: the one being heard."""
        with self._lock:
            if key is not None and self._cue_key is key:
                self._cue = self._cue_key = None
            if key is None:
                p = self._current
            else:
                p = next((q for q in (self._current, *self._draining)
                          if q is not None and q.key is key), None)
            if p is not None and p is self._unclaimed:
                self._unclaimed = None  # stopped before play() claimed it: nothing to claim
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
        loop, out = self._loop, self._out
        with self._lock:
            self._cue = self._cue_key = None
            if (not self.settings.enabled or loop is None or out is None or self._reinit
                    or out.src_rate != fmt.rate or fmt.width != 2 or fmt.channels != 1):
                return
            self._cue_key = key
        samples = np.frombuffer(pcm[:len(pcm) // 2 * 2], dtype="<i2").astype(np.float32)
        p = _Playback(loop, fmt.rate, out.rate, self.settings, on_first_audio, key)
        if not len(samples) or len(samples) * out.rate / fmt.rate > p.max_frames:
            with self._lock:
                self._cue_key = None
            return
        p.lead_in = int(pause * out.rate)  # the device is running: no wake-up lead-in
        p.cued = len(samples)
        if out.rate == fmt.rate:
            self._set_cue(p, out, samples)
        else:
            loop.create_task(self._resample_cue(p, out, samples), name="speaker-cue")

    async def play(self, fmt: AudioFormat, chunks: AsyncIterable[bytes],
                   on_first_audio: Callable[[], None] | None = None, key: object = None,
                   pause: float = 0.0) -> PlaybackStats:
        """Play one utterance; returns when it has drained from the device or was cut.

        One utterance at a time: a second call waits for the first. ``key`` names it for
        cut(key), and claims its cue if that is playing already (``chunks`` then only confirm
        what the cue holds). ``pause``: at least this much silence after the previous
        utterance, if that one ended by itself (consecutive utterances are paragraphs)."""
        if fmt.width != 2 or fmt.channels != 1:
            raise ValueError(f"the speaker takes 16-bit mono PCM, got {fmt}")
        if not self.settings.enabled:
            raise SpeakerUnavailable("the speaker is disabled (speaker.enabled = false)")
        async with self._play_lock:
            loop = self._loop = asyncio.get_running_loop()
            with self._lock:
                started, self._unclaimed = self._unclaimed, None
                p = started if key is not None and started is not None and started.key is key \
                    else None
                if p is None and key is not None and self._cue_key is key:
                    self._cue = self._cue_key = None  # cued, but never took over
            claimed = p is not None
            if p is not None:
                self._also_on_first_audio(p, on_first_audio)
                feeder = loop.create_task(self._confirm(p, chunks), name="speaker-confirm")
            else:
                if started is not None:  # a cue that went on, but something else comes now
                    self._cut(started)
                prev = self._current
                if prev is not None and not prev.done.done():  # a cancelled play still fading
                    try:
                        await asyncio.wait_for(asyncio.shield(prev.done), 1.0)
                    except Exception:
                        pass
                out = await self._ensure_output(fmt)
                p = _Playback(loop, fmt.rate, out.rate, self.settings, on_first_audio, key)
                p.lead_in = max(p.lead_in, self._pause_left(pause, out.rate))
                with self._lock:
                    self._current = p
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
                with self._lock:
                    if self._current is p and p.done.done():
                        self._current = None
            with p.lock:
                frames, underruns, xruns, was_cut = p.frames_out, p.underruns, p.xruns, p.cut
            if not was_cut:
                self._ended_at = time.monotonic()
            return PlaybackStats(samples=round(frames * p.src_rate / p.dev_rate),
                                 underruns=underruns, cut=was_cut, device_rate=p.dev_rate,
                                 xruns=xruns)

    # ---------------------------------------------------------------- loop side

    async def _feed(self, p: _Playback, out: _Output, chunks: AsyncIterable[bytes]) -> None:
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

    async def _confirm(self, p: _Playback, chunks: AsyncIterable[bytes]) -> None:
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

    def _set_cue(self, p: _Playback, out: _Output, samples: np.ndarray) -> None:
        with p.lock:
            p.push(samples)
            p.producing = False
        with self._lock:
            if self._cue_key is p.key and self._out is out:  # still wanted, same stream
                self._cue = p

    async def _resample_cue(self, p: _Playback, out: _Output, samples: np.ndarray) -> None:
        resampler = Resampler(p.src_rate, p.dev_rate)
        self._set_cue(p, out, await asyncio.to_thread(
            lambda: np.concatenate([resampler.process(samples), resampler.flush()])))

    def _also_on_first_audio(self, p: _Playback, fn: Callable[[], None] | None) -> None:
        """play()'s first-audio callback for a claimed cue: now if its audio has started,
        else along with the cue's own."""
        if fn is None:
            return
        with p.lock:
            started = p.first_sent
            if not started:
                before = p.on_first_audio

                def both() -> None:
                    if before is not None:
                        before()
                    fn()

                p.on_first_audio = both
        if started:
            fn()

    def _pause_left(self, pause: float, rate: int) -> int:
        """Frames of ``pause`` still to come since the last utterance that ended by itself."""
        if pause <= 0 or self._ended_at is None:
            return 0
        return max(0, int((pause - (time.monotonic() - self._ended_at)) * rate))

    def _cut(self, p: _Playback) -> None:
        """Fade ``p`` out (or end it, if nothing of it is audible yet) and drop the rest."""
        if p.done.done():
            return
        with p.lock:
            p.cut = True
            if p.state is _State.PLAYING and p.frames_out:
                p.state = _State.FADING
            elif p.state in (_State.PLAYING, _State.STARVED, _State.PARKED):
                p.drop()  # nothing audible (lead-in, silence): just end
                p.state = _State.ENDED
        p.space.set()
        self._settle(p)

    async def _push(self, p: _Playback, samples: np.ndarray) -> None:
        with p.lock:
            p.push(samples)
            full = p.buffered > p.max_frames
            if full:
                p.want_space = True
                p.space.clear()
        self._settle(p)
        if full:
            await p.space.wait()

    def _settle(self, p: _Playback) -> None:
        """While the stream is stopped, decide what the utterance needs: a (re)start once
        its pre-roll is there, or the end when there is nothing (more) to play."""
        if p.done.done() or self._running or self._starting:
            return
        with p.lock:
            state, cut, ready = p.state, p.cut, p.ready()
            exhausted = not p.producing and p.buffered == 0
        if state is _State.ENDED or (state in (_State.WAITING, _State.PARKED)
                                     and (cut or exhausted)):
            p.finish()
        elif state in (_State.WAITING, _State.PARKED) and ready:
            self._starting = True
            asyncio.get_running_loop().create_task(self._start_stream(p))

    async def _start_stream(self, p: _Playback) -> None:
        out = self._out
        try:
            if out is None:
                raise SpeakerUnavailable("the sound device was closed")
            with p.lock:
                go = p.state in (_State.WAITING, _State.PARKED) and not p.cut
                if go:
                    p.state = _State.PLAYING
            if not go:  # cut while this task was on its way
                self._starting = False
                self._settle(p)
                return
            self._running = True

            def restart() -> None:
                out.stream.stop()  # a completed stream must be stopped before it restarts
                self._generation += 1  # completion reports from before this are stale
                out.stream.start()

            await self._pa_call(restart, f"start the sound device {out.device_name!r}")
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
        for q in dict.fromkeys((p, self._current)):
            if q is not None:
                self._settle(q)

    async def _wait(self, p: _Playback, feeder: asyncio.Task[None]) -> None:
        """Wait for the utterance to drain; notice a failed feeder or a stalled playback.

        The stall rule: the utterance makes progress while the callback runs (it hands audio
        to the device, or the device drains what it was given), while the stream is being
        started, and while it waits for its source (the pre-roll after a slow synthesis).
        Otherwise nothing can move it: quiet for half the margin, it is reported (``stalled()``,
        for ``/healthz`` and the watchdog); quiet for longer than its audio left could take
        plus the margin, it is ended with SpeakerUnavailable and the device reopened."""
        out = self._out
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
                if self._ticks != ticks or self._starting or p.waits_for_source():
                    ticks, since = self._ticks, now
                    self._quiet = None
                    continue
                self._quiet = _Quiet(since, margin / 2, name)
                left = self._audio_left(p)  # no progress: what it holds is all still to play
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
                await asyncio.wait_for(asyncio.shield(p.done), margin)
            except Exception:
                pass
            raise error
        await p.done  # raises what finish() was given

    def _audio_left(self, p: _Playback) -> float:
        """Seconds of ``p`` still to be heard: buffered, its lead-in, or draining."""
        with p.lock:
            frames = p.buffered + p.lead_in
        return (frames + max(0, p.drain_left)) / p.dev_rate

    def stalled(self) -> str | None:
        """What is wrong, while an utterance has audio to play and the device takes none
        (for longer than a working device would); None otherwise."""
        quiet = self._quiet
        if quiet is None:
            return None
        seconds = time.monotonic() - quiet.since
        if seconds <= quiet.report_after:
            return None
        return (f"the speaker has played nothing for {seconds:.0f} s with audio to play "
                f"(sound device {quiet.device!r})")

    async def _fail(self, p: _Playback | None, error: SpeakerUnavailable) -> None:
        log.warning("speaker: %s", error)
        await self._close_output(error)
        self._reinit = True
        if p is not None and not p.done.done():
            p.finish(error)

    def _log_retry(self, e: SpeakerUnavailable) -> None:
        if self._retries:
            log.warning("speaker: %s; retrying in %.0f s, other outputs keep working",
                        e, self.settings.retry_seconds)

    async def _ensure_output(self, fmt: AudioFormat) -> _Output:
        """The open stream for ``fmt``, (re)opening it if the format or device changed."""
        out = self._out
        if out is not None and out.src_rate == fmt.rate and not self._reinit:
            return out
        now = time.monotonic()
        if self._failed_at is not None and now - self._failed_at < self.settings.retry_seconds:
            wait = self.settings.retry_seconds - (now - self._failed_at)
            raise SpeakerUnavailable(f"{self._failure} (retrying in {wait:.0f} s)")
        await self._close_output()
        try:
            self._out = await self._pa_call(lambda: self._open(fmt), "open the sound device")
        except SpeakerUnavailable as e:
            self._failed_at, self._failure = time.monotonic(), str(e)
            self._reinit = True  # rescan devices on the retry: it may have been plugged in
            self._log_retry(e)
            raise
        self._failed_at, self._reinit = None, False
        o = self._out
        log.info("speaker: %s at %d Hz, %d channel(s)%s, latency %.0f ms", o.device_name,
                 o.rate, o.channels,
                 f", resampling from {fmt.rate} Hz" if o.rate != fmt.rate else "",
                 o.drain_seconds * 1000)
        return o

    async def _close_output(self, error: SpeakerUnavailable | None = None) -> None:
        """Close the stream; whatever it was still playing ends (with ``error``)."""
        out, self._out = self._out, None
        self._running = False
        with self._lock:
            ended = [q for q in (self._current, self._unclaimed, *self._draining)
                     if q is not None]
            self._cue = self._cue_key = self._unclaimed = None
            self._draining = []
        for q in ended:
            if not q.done.done():
                q.finish(error)
        if out is not None:
            def close() -> None:
                out.stream.abort()
                out.stream.close()
                self._generation += 1  # the abort's completion report is stale

            try:
                await self._pa_call(close, "close the sound device")
            except SpeakerUnavailable as e:
                log.warning("speaker: %s", e)

    async def _pa_call(self, fn: Callable[[], T], what: str) -> T:
        """Run a blocking PortAudio call on the speaker thread, with a deadline."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._pa, fn),
                                          self.settings.device_timeout)
        except TimeoutError:
            raise SpeakerUnavailable(
                f"could not {what}: no answer within {self.settings.device_timeout:.0f} s "
                "(is another program holding it?)") from None
        except RuntimeError as e:  # executor shut down: the sink is stopping
            raise SpeakerUnavailable(f"could not {what}: the speaker is stopping") from e

    # ----------------------------------------------------- speaker thread (blocking)

    def _import_sd(self) -> Any:
        if self._sd is None:
            try:
                import sounddevice
            except OSError as e:
                raise SpeakerUnavailable(
                    f"PortAudio is not installed ({e}): install libportaudio2, or set "
                    "speaker.enabled = false") from e
            self._sd = sounddevice
        elif self._reinit and self._out is None:
            # PortAudio lists devices once, when it is initialised: re-initialise so a device
            # plugged in since then can be found. Only safe with no stream open (none is).
            try:
                self._sd._terminate()
                self._sd._initialize()
            except Exception as e:  # an old or new sounddevice without these: keep the list
                log.debug("speaker: could not rescan devices: %s", e)
        return self._sd

    def _devices(self) -> list[tuple[int, str, dict[str, Any]]]:
        sd = self._sd
        return [(i, str(d["name"]), dict(d)) for i, d in enumerate(sd.query_devices())
                if d["max_output_channels"] > 0]

    def _resolve_device(self) -> tuple[int, str, dict[str, Any]]:
        """The device the settings name: a number, a unique (part of a) name, or default."""
        sd = self._sd
        outputs = self._devices()
        spec = self.settings.device
        choices = ", ".join(f"{i} {name!r}" for i, name, _ in outputs) or "(none found)"
        hint = f"`herald say --device` / `speaker.device` takes one of: {choices}"
        if spec is None or str(spec).strip() == "":
            try:
                d = sd.query_devices(kind="output")
            except Exception:
                raise SpeakerUnavailable(
                    f"no default sound output device; {hint}") from None
            return int(d.get("index", -1)), str(d["name"]), dict(d)
        text = str(spec).strip()
        if text.lstrip("-").isdigit():
            found = [o for o in outputs if o[0] == int(text)]
        else:
            found = [o for o in outputs if o[1].lower() == text.lower()]
            found = found or [o for o in outputs if text.lower() in o[1].lower()]
        if not found:
            raise SpeakerUnavailable(f"no sound device {text!r}: {hint}")
        if len(found) > 1:
            names = ", ".join(f"{i} {name!r}" for i, name, _ in found)
            raise SpeakerUnavailable(
                f"sound device {text!r} is ambiguous ({names}): give its number or a longer "
                "part of its name")
        return found[0]

    def _probe(self) -> str:
        self._import_sd()
        return self._resolve_device()[1]

    def _open(self, fmt: AudioFormat) -> _Output:
        sd = self._import_sd()
        index, name, info = self._resolve_device()
        default_rate = int(info.get("default_samplerate") or 0)
        rates = [self.settings.rate] if self.settings.rate else [fmt.rate, default_rate]
        max_channels = int(info.get("max_output_channels") or 1)
        errors: list[str] = []
        for rate in dict.fromkeys(r for r in rates if r):
            for channels in (1, 2) if max_channels >= 2 else (1,):
                try:
                    stream = sd.RawOutputStream(
                        samplerate=rate, channels=channels, dtype="int16",
                        device=index if index >= 0 else None,
                        blocksize=max(16, int(rate * self.settings.block_ms / 1000)),
                        latency=self.settings.latency_ms / 1000,
                        callback=partial(self._callback, channels),
                        finished_callback=self._finished,
                        # Fill the device buffer from the jitter buffer at start, not with
                        # a buffer's worth of silence that would delay the first audio.
                        prime_output_buffers_using_stream_callback=True)
                except Exception as e:  # PortAudioError, or ValueError for odd settings
                    errors.append(f"{rate} Hz/{channels} ch: {e}")
                    continue
                return _Output(stream, index, name, fmt.rate, rate, channels,
                               float(stream.latency))
        raise SpeakerUnavailable(
            f"sound device {name!r} can't be opened ({'; '.join(errors)}): is another "
            "program using it? Check `aplay -l` / `fuser -v /dev/snd/*`, or choose another "
            "with speaker.device")

    # --------------------------------------------------------- PortAudio's thread

    def _callback(self, channels: int, outdata: Any, frames: int, time_info: Any,
                  status: Any) -> None:
        """Fill one device block. Must not block, allocate much, or raise (except Stop)."""
        self._ticks += 1
        stop = False
        try:
            block, stop = self._render(frames, bool(status.output_underflow))
            pcm = np.clip(np.rint(block), -32768, 32767).astype("<i2")
        except Exception:
            log.exception("speaker: audio callback failed; playing silence")
            pcm = np.zeros(frames, dtype="<i2")
        if channels > 1:
            pcm = np.repeat(pcm, channels)
        outdata[:] = pcm.tobytes()
        if stop:
            raise self._sd.CallbackStop

    def _render(self, frames: int, xrun: bool) -> tuple[np.ndarray, bool]:
        """The next block of audio (int16 scale, float), and whether the stream should
        complete after it."""
        block = np.zeros(frames, dtype=np.float32)
        with self._lock:
            self._drain(frames)
            p = self._current
            if p is None:
                self._gain = self._target
                return block, True  # nothing to play: don't keep the device busy
            end = self._fill(p, block, 0, xrun)
            q = self._cue
            with p.lock:
                handover = q is not None and p.state is _State.ENDED and not p.cut
            if q is not None and handover:
                # p ended by itself and the next one is here: go on in this very block. p is
                # heard once the device has played what it holds ahead of this block (its
                # latency), then p's part of the block.
                p.drain_left = self._drain_frames() + end
                self._draining.append(p)
                self._current = self._unclaimed = q
                self._cue = self._cue_key = None
                with q.lock:
                    q.state = _State.PLAYING
                self._fill(q, block, end, False)
                p = q
            with p.lock:
                # WAITING here: a new utterance met the previous one's stream; let it
                # complete and start afresh with the pre-roll.
                stop = p.state in (_State.ENDED, _State.PARKED, _State.DONE, _State.WAITING)
        return block, stop

    def _fill(self, p: _Playback, block: np.ndarray, start: int, xrun: bool) -> int:
        """Fill ``block[start:]`` from ``p``: its lead-in silence, its audio, or its fade-out.
        Returns where ``p``'s part of the block ends."""
        frames = len(block)
        with p.lock:
            if xrun:
                p.xruns += 1
            pos = start
            if p.state is _State.STARVED and p.ready():
                p.state = _State.PLAYING
            elif p.state is _State.STARVED and not p.producing:
                p.state = _State.ENDED
            if p.state is _State.PLAYING and p.lead_in:
                n = min(p.lead_in, frames - pos)
                p.lead_in -= n
                pos += n
            audio_from = pos
            if p.state is _State.PLAYING:
                pos += p.take(block[pos:])
                if pos < frames:
                    if p.producing:
                        p.state = _State.STARVED
                        p.underruns += 1
                        p.starved_frames = 0
                    else:
                        p.state = _State.ENDED
            elif p.state is _State.FADING:
                want = min(frames - pos, p.fade_left)
                got = p.take(block[pos:pos + want])
                block[pos:pos + got] *= (p.fade_left - np.arange(got, dtype=np.float32)
                                         ) / p.fade_total
                p.fade_left -= got
                pos += got
                if p.fade_left <= 0 or got < want:
                    p.drop()
                    p.state = _State.ENDED
            got_audio = pos - audio_from
            p.frames_out += got_audio
            if p.state is _State.STARVED:
                p.starved_frames += frames - pos
                if p.starved_frames >= p.park_after:
                    p.state = _State.PARKED
            if got_audio and not p.first_sent:
                p.first_sent = True
                if p.on_first_audio is not None:
                    p.signal(p.on_first_audio)
            if p.want_space and p.buffered <= p.max_frames // 2:
                p.want_space = False
                p.signal(p.space.set)
            first_sound = got_audio > 0 and p.frames_out == got_audio
        if not got_audio:
            self._gain = self._target  # silence: jump, nobody hears it
        else:
            if first_sound:  # an utterance starts at the volume set, no ramp from before
                self._gain = self._target
            block[audio_from:pos] *= self._gain_curve(got_audio)
        return pos

    def _drain(self, frames: int) -> None:
        """A block more has gone into the device: utterances handed over to a cue whose last
        sample it has now played are finished."""
        if not self._draining:
            return
        still = []
        for d in self._draining:
            d.drain_left -= frames
            if d.drain_left > 0:
                still.append(d)
            else:
                d.signal(d.finish)
        self._draining = still

    def _drain_frames(self) -> int:
        """What the device holds ahead of the block being written, in frames, as PortAudio
        reports it (its output latency; ALSA may hold up to a period more, and buffers past
        the device are not seen, as by PortAudio's own drain)."""
        out = self._out
        return int(out.drain_seconds * out.rate) if out is not None else 0

    def _gain_curve(self, frames: int) -> np.ndarray | float:
        target, current = self._target, self._gain
        if current == target:
            return target
        step = 1.0 / (VOLUME_RAMP_SECONDS * (self._out.rate if self._out else 48000))
        ramp = current + np.sign(target - current) * step * np.arange(1, frames + 1)
        ramp = np.minimum(ramp, target) if target > current else np.maximum(ramp, target)
        self._gain = float(ramp[-1])
        return ramp.astype(np.float32)

    def _finished(self) -> None:
        """PortAudio: the stream has stopped and the device has played what it was given."""
        loop, generation = self._loop, self._generation
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._on_finished, generation)
            except RuntimeError:  # loop closed
                pass

    def _on_finished(self, generation: int) -> None:
        """On the loop: the stream completed (or died)."""
        if generation != self._generation:
            return  # a report from before the latest start
        self._running = False
        with self._lock:  # the stream has drained: whatever was handed over has been heard
            drained, self._draining = self._draining, []
        for d in drained:
            d.finish()
        p = self._current
        if self._closing or p is None or p.done.done():
            return
        with p.lock:
            state = p.state
        if state in (_State.ENDED, _State.PARKED, _State.WAITING):
            self._settle(p)  # finish, or restart once the pre-roll is back
        else:
            name = self._out.device_name if self._out else "?"
            asyncio.get_running_loop().create_task(self._fail(p, SpeakerUnavailable(
                f"the sound device {name!r} stopped unexpectedly (unplugged?); it will be "
                "reopened for the next utterance")))

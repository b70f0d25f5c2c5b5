"""What the audio callback plays: each utterance's jitter buffer and state (``Voice``), and
the ``Mixer`` that fills one device block from them (pre-roll, underrun, park, volume ramp,
fade-out, the hand-over to a cued utterance). Plain numpy and a lock: no PortAudio, no event
loop, so it can be driven (and tested) with arrays.

* pre-roll: a voice is ``ready()`` once ``preroll_ms`` of audio (or the whole utterance, if
  shorter) is buffered, so the first blocks don't underrun;
* underrun: the buffer is empty while the utterance is still producing. The mixer plays
  silence, counts one underrun for the episode, and waits for the pre-roll again before
  resuming. A starvation longer than ``park_ms`` parks the voice: the stream completes;
* volume is a per-sample linear ramp (full scale in 20 ms) towards the target, so changing
  it mid-word doesn't click ("zipper noise"); a cut fades out over ``fade_ms``;
* hand-over: when the current voice ends by itself and a cue is there, the cue's lead-in
  (the pause) and audio go on in the same block, and the current one counts as heard once
  the device has played ``drain_frames`` more;
* a start time: a voice with ``start_at`` (wall clock) plays silence until the block whose
  DAC time reaches that instant, and starts its audio at the frame of it. The instant is
  converted to the device's clock once (``clock``, see ``clock.DeviceClock``) and compared
  with each block's DAC time, not counted in frames, so a device that is late to start is
  caught up with and one that runs ahead is held. When the instant has passed, the audio
  starts at once; ``first_dac`` says when it did.

The mixer never blocks and never raises. Where the loop must hear of something (the first
audio went out, the buffer has room again, a handed-over utterance has been heard), it calls
a ``Voice`` hook from the audio thread; the sink's voices forward those to the loop.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from enum import Enum
from typing import Generic, Protocol, TypeVar

import numpy as np

VOLUME_RAMP_SECONDS = 0.02  # a full 0 -> 1 volume change takes this long


class Timings(Protocol):
    """The settings a voice's buffer runs on (``SpeakerSettings`` has them)."""

    preroll_ms: float  # buffered before the stream starts
    lead_in_ms: float  # silence first: devices that wake late
    fade_ms: float  # fade-out on a cut
    park_ms: float  # starvation before the stream stops
    max_buffer_seconds: float  # jitter buffer bound (feeding waits)


class Clock(Protocol):
    """The device's clock as the mixer needs it (``clock.DeviceClock`` is one)."""

    def to_device(self, wall: float) -> float: ...


class State(Enum):
    WAITING = "waiting"  # stream not running: pre-roll (or re-buffering after a park)
    PLAYING = "playing"  # the callback takes audio from the buffer
    STARVED = "starved"  # buffer empty while producing: silence, counting one underrun
    PARKED = "parked"  # starved too long: stream completing, restarted when audio is back
    FADING = "fading"  # cut while audible: fading out
    ENDED = "ended"  # every sample handed over; waiting for the device to drain
    DONE = "done"


class Voice:
    """One utterance's jitter buffer and state, shared by the loop and the audio callback.

    Fields below the lock line are only touched with ``lock`` held."""

    def __init__(self, src_rate: int, dev_rate: int, timings: Timings,
                 key: object = None) -> None:
        ms = dev_rate / 1000.0
        self.key = key  # what play()/cue() named it, for cut(key)
        self.src_rate, self.dev_rate = src_rate, dev_rate
        self.preroll = int(timings.preroll_ms * ms)
        self.park_after = int(timings.park_ms * ms)
        self.fade_total = max(1, int(timings.fade_ms * ms))
        self.max_frames = int(timings.max_buffer_seconds * dev_rate)
        self.lock = threading.Lock()
        # --- guarded by lock ---
        self.state = State.WAITING
        self.blocks: deque[np.ndarray] = deque()
        self.buffered = 0
        self.producing = True
        self.lead_in = int(timings.lead_in_ms * ms)
        self.starved_frames = 0
        self.fade_left = self.fade_total
        self.want_space = False
        self.first_sent = False
        self.start_at: float | None = None  # wall clock: its first sample at the DAC then
        self.start_dev: float | None = None  # start_at on the device's clock (set once)
        self.first_dac: float | None = None  # device clock: when its first sample went out
        self.cut = False
        self.frames_out = 0
        self.underruns = 0
        self.xruns = 0
        # --- not under lock: the mixer's alone (under its lock), or set before the cue is
        # handed to the mixer
        self.drain_left = 0  # handed over to a cued utterance: frames until it has been heard
        self.cued = 0  # a cue's input samples (what its play() must bring again)

    # Hooks, called from the audio thread (under ``lock``, except ``heard``).

    def first_audio(self) -> None:
        """Its first real audio has been handed to the device."""

    def space_freed(self) -> None:
        """The buffer has drained to half its bound after a push found it full."""

    def heard(self) -> None:
        """Handed over to a cue: the device has now played its last sample."""

    # Buffer and state.

    def ready(self) -> bool:
        """Enough buffered to (re)start: the pre-roll, or all there will be."""
        return self.buffered >= self.preroll or (not self.producing and self.buffered > 0)

    def waits_for_source(self) -> bool:
        """Stopped or starved until its source brings more: not the device's delay."""
        with self.lock:
            return (self.producing and not self.ready()
                    and self.state in (State.WAITING, State.STARVED, State.PARKED))

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

    def interrupt(self) -> None:
        """A cut: fade out if it is being heard, else end at once; the rest is dropped."""
        with self.lock:
            self.cut = True
            if self.state is State.PLAYING and self.frames_out:
                self.state = State.FADING
            elif self.state in (State.PLAYING, State.STARVED, State.PARKED):
                self.drop()  # nothing audible (lead-in, silence): just end
                self.state = State.ENDED

    def seconds_left(self) -> float:
        """Of it still to be heard: buffered, its lead-in, or draining in the device."""
        with self.lock:
            frames = self.buffered + self.lead_in
        return (frames + max(0, self.drain_left)) / self.dev_rate


V = TypeVar("V", bound=Voice)


class Mixer(Generic[V]):
    """Fills device blocks from the current voice, going on with the cue when the current
    one ends by itself. ``lock`` guards which voice is where (the sink switches them too)."""

    def __init__(self, volume: float) -> None:
        self.lock = threading.Lock()
        # --- guarded by lock ---
        self.current: V | None = None  # the one being played
        self.cue: V | None = None  # the next utterance, whole, ready to follow
        self.cue_key: object = None  # the cue asked for last (its audio may be resampling)
        self.unclaimed: V | None = None  # a cue playing before play() claimed it
        self.draining: list[V] = []  # handed over to a cue, still in the device
        # --- set by the sink; read by render()
        self.target = volume  # the volume asked for, 0..1
        self.rate = 48000  # the device's rate (for the volume ramp)
        self.drain_frames = 0  # what the device holds ahead of the block being written
        self.clock: Clock | None = None  # for voices with a start time
        # --- render()'s alone
        self.gain = volume  # the gain reached so far

    def render(self, frames: int, xrun: bool = False, dac: float | None = None
               ) -> tuple[np.ndarray, bool]:
        """The next block of audio (int16 scale, float), and whether the stream should
        complete after it. ``xrun``: the device reported an underflow before this block.
        ``dac``: when the block's first frame reaches the DAC, on the device's clock (None:
        unknown; a voice with a start time then starts at once)."""
        block = np.zeros(frames, dtype=np.float32)
        with self.lock:
            self._drain(frames)
            p = self.current
            if p is None:
                self.gain = self.target
                return block, True  # nothing to play: don't keep the device busy
            end = self._fill(p, block, 0, xrun, dac)
            q = self.cue
            with p.lock:
                handover = q is not None and p.state is State.ENDED and not p.cut
            if q is not None and handover:
                # p ended by itself and the next one is here: go on in this very block. p is
                # heard once the device has played what it holds ahead of this block (its
                # latency), then p's part of the block.
                p.drain_left = self.drain_frames + end
                self.draining.append(p)
                self.current = self.unclaimed = q
                self.cue = self.cue_key = None
                with q.lock:
                    q.state = State.PLAYING
                self._fill(q, block, end, False, dac)
                p = q
            with p.lock:
                # WAITING here: a new utterance met the previous one's stream; let it
                # complete and start afresh with the pre-roll.
                stop = p.state in (State.ENDED, State.PARKED, State.DONE, State.WAITING)
        return block, stop

    def _fill(self, p: V, block: np.ndarray, start: int, xrun: bool, dac: float | None) -> int:
        """Fill ``block[start:]`` from ``p``: its lead-in silence, its audio, or its fade-out.
        Returns where ``p``'s part of the block ends. ``dac``: the block's DAC time."""
        frames = len(block)
        with p.lock:
            if xrun:
                p.xruns += 1
            pos = start
            if p.state is State.STARVED and p.ready():
                p.state = State.PLAYING
            elif p.state is State.STARVED and not p.producing:
                p.state = State.ENDED
            if (p.state is State.PLAYING and p.start_at is not None and not p.first_sent
                    and dac is not None and self.clock is not None):
                # Silence up to the frame that reaches the DAC at the start instant (the
                # first one at or after it), from this block's own DAC time.
                if p.start_dev is None:
                    p.start_dev = self.clock.to_device(p.start_at)
                due = math.ceil(round((p.start_dev - dac) * p.dev_rate, 6))
                p.lead_in = max(0, due - pos)
            if p.state is State.PLAYING and p.lead_in:
                n = min(p.lead_in, frames - pos)
                p.lead_in -= n
                pos += n
            audio_from = pos
            if p.state is State.PLAYING:
                pos += p.take(block[pos:])
                if pos < frames:
                    if p.producing:
                        p.state = State.STARVED
                        p.underruns += 1
                        p.starved_frames = 0
                    else:
                        p.state = State.ENDED
            elif p.state is State.FADING:
                want = min(frames - pos, p.fade_left)
                got = p.take(block[pos:pos + want])
                block[pos:pos + got] *= (p.fade_left - np.arange(got, dtype=np.float32)
                                         ) / p.fade_total
                p.fade_left -= got
                pos += got
                if p.fade_left <= 0 or got < want:
                    p.drop()
                    p.state = State.ENDED
            got_audio = pos - audio_from
            p.frames_out += got_audio
            if p.state is State.STARVED:
                p.starved_frames += frames - pos
                if p.starved_frames >= p.park_after:
                    p.state = State.PARKED
            if got_audio and not p.first_sent:
                p.first_sent = True
                if dac is not None:
                    p.first_dac = dac + audio_from / p.dev_rate
                p.first_audio()
            if p.want_space and p.buffered <= p.max_frames // 2:
                p.want_space = False
                p.space_freed()
            first_sound = got_audio > 0 and p.frames_out == got_audio
        if not got_audio:
            self.gain = self.target  # silence: jump, nobody hears it
        else:
            if first_sound:  # an utterance starts at the volume set, no ramp from before
                self.gain = self.target
            block[audio_from:pos] *= self._gain_curve(got_audio)
        return pos

    def _drain(self, frames: int) -> None:
        """A block more has gone into the device: voices handed over to a cue whose last
        sample it has now played are heard."""
        if not self.draining:
            return
        still = []
        for d in self.draining:
            d.drain_left -= frames
            if d.drain_left > 0:
                still.append(d)
            else:
                d.heard()
        self.draining = still

    def _gain_curve(self, frames: int) -> np.ndarray | float:
        target, current = self.target, self.gain
        if current == target:
            return target
        step = 1.0 / (VOLUME_RAMP_SECONDS * self.rate)
        ramp = current + np.sign(target - current) * step * np.arange(1, frames + 1)
        ramp = np.minimum(ramp, target) if target > current else np.maximum(ramp, target)
        self.gain = float(ramp[-1])
        curve: np.ndarray = ramp.astype(np.float32)
        return curve

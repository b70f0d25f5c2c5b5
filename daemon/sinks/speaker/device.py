"""The sound device: finding the one the settings name, opening a PortAudio output stream on
it, retrying one that failed (no sooner than ``retry_seconds``, rescanning devices so one
plugged in meanwhile is found), and closing it when it is gone.

An open or a start that PortAudio refuses is tried twice more, a moment apart
(``RETRY_AFTER``), before it counts as a failure: on a busy host PortAudio gives up starting
a stream whose audio thread has not got going within its one second ("Wait timed out"), and
a device may be busy for a moment (another program closing it). Both tend to pass. A stream
whose start was refused is replaced by a new one on the same terms before the next try.

Every PortAudio call that can block (open, start, stop, close) runs in one dedicated thread,
which also serialises them; the loop awaits them with a deadline (``device_timeout``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from tts import AudioFormat

from ...thread_pools import pool
from ..protocol import SpeakerUnavailable

if TYPE_CHECKING:
    from ...settings import SpeakerSettings

log = logging.getLogger("herald.speaker")

T = TypeVar("T")

# PortAudio's stream callback for a stream of n channels: (outdata, frames, time, status).
Callback = Callable[[Any, int, Any, Any], None]

# Seconds before the second and the third try of an open or start PortAudio refused.
RETRY_AFTER = (0.1, 0.3)
PA_TIMED_OUT = -9987  # PortAudio's paTimedOut: a start whose audio thread did not get going


class Refused(SpeakerUnavailable):
    """PortAudio refused to open or start the stream (its message says why): worth trying
    again before it is reported. ``code``: PortAudio's error code, if one came."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def retry_pause(tries: int, start_by: float | None = None) -> float | None:
    """Seconds to wait after ``tries`` refused attempts before the next one; None: no more.
    ``start_by`` (``time.monotonic()``): when the stream must be going for an utterance's
    start time; the pause never runs past it (past it, the next try is at once: a late start
    is heard late, a missed one not at all)."""
    if tries > len(RETRY_AFTER):
        return None
    pause = RETRY_AFTER[tries - 1]
    if start_by is not None:
        pause = min(pause, max(0.0, start_by - time.monotonic()))
    return pause


def gave_up(error: Refused, tries: int) -> SpeakerUnavailable:
    """What is reported after ``tries`` refused attempts: what failed, and what to do."""
    if error.code == PA_TIMED_OUT:
        advice = ("PortAudio gives its audio thread a second to start, and this host was too "
                  "busy to run it in time: give herald more CPU (fewer busy processes beside "
                  "it)")
    else:
        advice = ("is another program using it? Check `aplay -l` / `fuser -v /dev/snd/*`, or "
                  "choose another with speaker.device")
    return SpeakerUnavailable(f"{error} (tried {tries} times); {advice}")


@dataclass
class Output:
    """An open PortAudio stream and what it was opened for."""

    stream: Any  # sounddevice.RawOutputStream
    device: int
    device_name: str
    src_rate: int  # the input rate this stream was chosen for
    rate: int  # the device's rate
    channels: int
    drain_seconds: float  # device latency PortAudio reports
    # The stream's callbacks: the stream callback for this many channels, the finished one.
    callback: Callback
    finished: Callable[[], None]
    refused: bool = False  # PortAudio refused to start the stream: it won't start again


class Device:
    """The open stream (``out``), the thread PortAudio is called on, and what is known about
    the device's failures."""

    def __init__(self, settings: SpeakerSettings, retries: bool = True) -> None:
        """``retries=False``: a one-off player (``herald say``) that reports a failed device
        to its caller alone, without the daemon's "retrying" log line."""
        self.settings = settings
        self.retries = retries
        self.out: Output | None = None
        self.reinit = False  # re-scan devices before the next open
        self.generation = 0  # stream starts so far: tells stale completion reports apart
        self._sd: Any = None  # the sounddevice module, imported on first use
        self._pa = pool("herald-speaker")
        self._pa_closed = False
        self._failed_at: float | None = None
        self._failure = ""

    @property
    def callback_stop(self) -> type[BaseException]:
        """What the stream callback raises to complete the stream."""
        return self._sd.CallbackStop  # type: ignore[no-any-return]

    def retry_now(self) -> None:
        """Forget a failure: the next open tries at once (and rescans the devices)."""
        self._failed_at = None
        self.reinit = True

    def gone(self, error: SpeakerUnavailable) -> None:
        """The device failed: rescan before the next open, and don't retry for a while."""
        self._failed_at, self._failure, self.reinit = time.monotonic(), str(error), True
        self._log_retry(error)

    def reopen_thread(self) -> None:
        if self._pa_closed:
            self._pa = pool("herald-speaker")
            self._pa_closed = False

    def close_thread(self) -> None:
        self._pa.shutdown(wait=False, cancel_futures=True)
        self._pa_closed = True

    async def call(self, fn: Callable[[], T], what: str) -> T:
        """Run a blocking PortAudio call on the speaker thread, with a deadline."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.settings.device_timeout):
                return await loop.run_in_executor(self._pa, fn)
        except TimeoutError:
            raise SpeakerUnavailable(
                f"could not {what}: no answer within {self.settings.device_timeout:.0f} s "
                "(is another program holding it?)") from None
        except RuntimeError as e:  # executor shut down: the sink is stopping
            raise SpeakerUnavailable(f"could not {what}: the speaker is stopping") from e

    async def probe(self) -> str:
        """The name of the device the settings name (SpeakerUnavailable if there is none)."""
        def probe() -> str:
            self._import_sd()
            return self._resolve()[1]

        return await self.call(probe, "look up the sound device")

    async def open(self, fmt: AudioFormat, callback: Callable[[int], Callback],
                   finished: Callable[[], None], start_by: float | None = None) -> Output:
        """Open a stream for ``fmt`` (the stream before must be closed). Within
        ``retry_seconds`` of a failure it fails at once; one PortAudio refuses is tried
        again first (``retry_pause``, ``start_by``). ``callback(channels)``: the stream
        callback for a stream of that many channels."""
        now = time.monotonic()
        if self._failed_at is not None and now - self._failed_at < self.settings.retry_seconds:
            wait = self.settings.retry_seconds - (now - self._failed_at)
            raise SpeakerUnavailable(f"{self._failure} (retrying in {wait:.0f} s)")
        try:
            o = await self.trying(lambda: self._open(fmt, callback, finished),
                                  "open the sound device", start_by)
        except SpeakerUnavailable as e:
            self.gone(e)  # rescan devices on the retry: it may have been plugged in
            raise
        assert o is not None  # (tried while wanted: always, here)
        self.out = o
        self._failed_at, self.reinit = None, False
        log.info("speaker: %s at %d Hz, %d channel(s)%s, latency %.0f ms", o.device_name,
                 o.rate, o.channels,
                 f", resampling from {fmt.rate} Hz" if o.rate != fmt.rate else "",
                 o.drain_seconds * 1000)
        return o

    async def start(self, out: Output, wanted: Callable[[], bool],
                    start_by: float | None = None) -> bool:
        """(Re)start the stream, trying again if PortAudio refuses (``trying``). False: not
        started, as ``wanted()`` said no before a try."""
        return await self.trying(partial(self._restart, out),
                                 f"start the sound device {out.device_name!r}", start_by,
                                 wanted) is not None

    async def trying(self, fn: Callable[[], T], what: str, start_by: float | None = None,
                     wanted: Callable[[], bool] = lambda: True) -> T | None:
        """``call(fn, what)``, tried again after a pause (``retry_pause``) while PortAudio
        refuses it (Refused) and ``wanted()``, asked before every try (None: it said no);
        then SpeakerUnavailable saying what failed and what to do (``gave_up``)."""
        tries = 0
        while wanted():
            try:
                return await self.call(fn, what)
            except Refused as e:
                tries += 1
                pause = retry_pause(tries, start_by)
                if pause is None:
                    raise gave_up(e, tries) from e
                log.info("speaker: %s; trying again in %.0f ms", e, pause * 1000)
                await asyncio.sleep(pause)
        return None

    async def close(self) -> None:
        """Close the stream, if one is open."""
        out, self.out = self.out, None
        if out is None:
            return

        def close() -> None:
            out.stream.abort()
            out.stream.close()
            self.generation += 1  # the abort's completion report is stale

        try:
            await self.call(close, "close the sound device")
        except SpeakerUnavailable as e:
            log.warning("speaker: %s", e)

    def _log_retry(self, e: SpeakerUnavailable) -> None:
        if self.retries:
            log.warning("speaker: %s; retrying in %.0f s, other outputs keep working",
                        e, self.settings.retry_seconds)

    # ----------------------------------------------------- speaker thread (blocking)

    def _restart(self, out: Output) -> bool:
        """True once started (``trying`` tells a start from a start not wanted by None)."""
        try:
            if out.refused:
                self._renew(out)
            out.stream.stop()  # a completed stream must be stopped before it restarts
            self.generation += 1  # completion reports from before this are stale
            out.stream.start()
            return True
        except self._sd.PortAudioError as e:
            # PortAudio has ended the audio thread it started (and reported it finished).
            out.refused = True
            code = e.args[1] if len(e.args) > 1 else None
            raise Refused(f"could not start the sound device {out.device_name!r}: {e}",
                          code) from e

    def _renew(self, out: Output) -> None:
        """Put a new stream on the same terms in place of one whose start PortAudio refused:
        that one does not start again (ALSA's host API fails to stop the thread it ended
        already, and a start then does nothing)."""
        out.stream.abort()
        out.stream.close()
        self.generation += 1  # the abort's completion report is stale
        out.stream = self._stream(out.device, out.rate, out.channels, out.callback,
                                  out.finished)
        out.refused = False

    def _stream(self, index: int, rate: int, channels: int, callback: Callback,
                finished: Callable[[], None]) -> Any:
        return self._sd.RawOutputStream(
            samplerate=rate, channels=channels, dtype="int16",
            device=index if index >= 0 else None,
            blocksize=max(16, int(rate * self.settings.block_ms / 1000)),
            latency=self.settings.latency_ms / 1000, callback=callback,
            finished_callback=finished,
            # Fill the device buffer from the jitter buffer at start, not with a buffer's
            # worth of silence that would delay the first audio.
            prime_output_buffers_using_stream_callback=True)

    def _import_sd(self) -> Any:
        if self._sd is None:
            try:
                import sounddevice
            except OSError as e:
                raise SpeakerUnavailable(
                    f"PortAudio is not installed ({e}): install libportaudio2, or set "
                    "speaker.enabled = false") from e
            self._sd = sounddevice
        elif self.reinit and self.out is None:
            # PortAudio lists devices once, when it is initialised: re-initialise so a device
            # plugged in since then can be found. Only safe with no stream open (none is).
            try:
                self._sd._terminate()
                self._sd._initialize()
            except Exception as e:  # an old or new sounddevice without these: keep the list
                log.debug("speaker: could not rescan devices: %s", e)
        return self._sd

    def _outputs(self) -> list[tuple[int, str, dict[str, Any]]]:
        sd = self._sd
        return [(i, str(d["name"]), dict(d)) for i, d in enumerate(sd.query_devices())
                if d["max_output_channels"] > 0]

    def _resolve(self) -> tuple[int, str, dict[str, Any]]:
        """The device the settings name: a number, a unique (part of a) name, or default."""
        sd = self._sd
        outputs = self._outputs()
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

    def _open(self, fmt: AudioFormat, callback: Callable[[int], Callback],
              finished: Callable[[], None]) -> Output:
        self._import_sd()
        index, name, info = self._resolve()
        default_rate = int(info.get("default_samplerate") or 0)
        rates = [self.settings.rate] if self.settings.rate else [fmt.rate, default_rate]
        max_channels = int(info.get("max_output_channels") or 1)
        errors: list[str] = []
        for rate in dict.fromkeys(r for r in rates if r):
            for channels in (1, 2) if max_channels >= 2 else (1,):
                fn = callback(channels)
                try:
                    stream = self._stream(index, rate, channels, fn, finished)
                except Exception as e:  # PortAudioError, or ValueError for odd settings
                    errors.append(f"{rate} Hz/{channels} ch: {e}")
                    continue
                return Output(stream, index, name, fmt.rate, rate, channels,
                              float(stream.latency), fn, finished)
        raise Refused(f"sound device {name!r} can't be opened ({'; '.join(errors)})")

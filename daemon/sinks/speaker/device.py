"""The sound device: finding the one the settings name, opening a PortAudio output stream on
it, retrying one that failed (no sooner than ``retry_seconds``, rescanning devices so one
plugged in meanwhile is found), and closing it when it is gone.

Every PortAudio call that can block (open, start, stop, close) runs in one dedicated thread,
which also serialises them; the loop awaits them with a deadline (``device_timeout``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tts import AudioFormat

from ..protocol import SpeakerUnavailable

if TYPE_CHECKING:
    from .playback import SpeakerSettings

log = logging.getLogger("herald.speaker")

T = TypeVar("T")

# PortAudio's stream callback for a stream of n channels: (outdata, frames, time, status).
Callback = Callable[[Any, int, Any, Any], None]


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
        self._pa = ThreadPoolExecutor(max_workers=1, thread_name_prefix="herald-speaker")
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
            self._pa = ThreadPoolExecutor(max_workers=1, thread_name_prefix="herald-speaker")
            self._pa_closed = False

    def close_thread(self) -> None:
        self._pa.shutdown(wait=False, cancel_futures=True)
        self._pa_closed = True

    async def call(self, fn: Callable[[], T], what: str) -> T:
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

    async def probe(self) -> str:
        """The name of the device the settings name (SpeakerUnavailable if there is none)."""
        def probe() -> str:
            self._import_sd()
            return self._resolve()[1]

        return await self.call(probe, "look up the sound device")

    async def open(self, fmt: AudioFormat, callback: Callable[[int], Callback],
                   finished: Callable[[], None]) -> Output:
        """Open a stream for ``fmt`` (the stream before must be closed). Within
        ``retry_seconds`` of a failure it fails at once. ``callback(channels)``: the stream
        callback for a stream of that many channels."""
        now = time.monotonic()
        if self._failed_at is not None and now - self._failed_at < self.settings.retry_seconds:
            wait = self.settings.retry_seconds - (now - self._failed_at)
            raise SpeakerUnavailable(f"{self._failure} (retrying in {wait:.0f} s)")
        try:
            self.out = await self.call(lambda: self._open(fmt, callback, finished),
                                       "open the sound device")
        except SpeakerUnavailable as e:
            self.gone(e)  # rescan devices on the retry: it may have been plugged in
            raise
        self._failed_at, self.reinit = None, False
        o = self.out
        log.info("speaker: %s at %d Hz, %d channel(s)%s, latency %.0f ms", o.device_name,
                 o.rate, o.channels,
                 f", resampling from {fmt.rate} Hz" if o.rate != fmt.rate else "",
                 o.drain_seconds * 1000)
        return o

    def restart(self, out: Output) -> None:
        """On the speaker thread: (re)start the stream."""
        out.stream.stop()  # a completed stream must be stopped before it restarts
        self.generation += 1  # completion reports from before this are stale
        out.stream.start()

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
        sd = self._import_sd()
        index, name, info = self._resolve()
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
                        callback=callback(channels), finished_callback=finished,
                        # Fill the device buffer from the jitter buffer at start, not with
                        # a buffer's worth of silence that would delay the first audio.
                        prime_output_buffers_using_stream_callback=True)
                except Exception as e:  # PortAudioError, or ValueError for odd settings
                    errors.append(f"{rate} Hz/{channels} ch: {e}")
                    continue
                return Output(stream, index, name, fmt.rate, rate, channels,
                              float(stream.latency))
        raise SpeakerUnavailable(
            f"sound device {name!r} can't be opened ({'; '.join(errors)}): is another "
            "program using it? Check `aplay -l` / `fuser -v /dev/snd/*`, or choose another "
            "with speaker.device")

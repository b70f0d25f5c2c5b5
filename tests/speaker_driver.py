"""Runs the speaker sink in its own process, for tests/test_speaker.py.

PortAudio reads the ALSA configuration once, when sounddevice is imported, so each test
starts this script with ``ALSA_CONFIG_PATH`` pointing the default PCM at a file or a FIFO.

Usage: ``python tests/speaker_driver.py SPEC.json``; prints one JSON line per play.

Plays follow each other once the device has gone quiet, unless a play says
``"back_to_back": true`` (then it is called the moment the previous one returns, as the
scheduler does). ``"late": [[i, seconds], ...]``: chunk i comes that much later (audio from
the network); ``"pause": {"at": i, "extra": seconds}``: chunk i comes that long after the
chunks before it have played (counted from the play's first audio): a starved device;
``"preroll"`` is play()'s. ``"fail_at_chunk": i``: the source raises instead of sending
chunk i (with ``"fail_after_first_audio": seconds``, that long after the play's first
audio). ``"key"`` names a play for ``cut(key)``/``cue(key, ...)``, ``"gap"`` is its
``pause``; ``"after_first_audio": [[seconds, action], ...]`` and ``"after_return": [action,
...]`` run actions: ``{"cue": {"pcm", "key", "gap"}}`` or ``{"cut": key}``. ``"start_at"``
(wall clock) or ``"start_in"`` (seconds after the play is called) is its ``start_at``; with
``"start_at": "stdin"`` the driver prints ``{"ready": true}`` and reads it from a line on
its standard input (several drivers, started under load, can be given one start time).

With ``fifo`` in the spec, this process also plays the part of the sound card's clock: a
thread reads the FIFO (shrunk to one page) at ``bytes_per_second`` and appends what it reads
to ``out``. ALSA's null/file plugins take audio as fast as it is written; the pacer makes
the device consume in real time, like hardware, so pre-roll, underruns, cut and drain mean
what they mean on a real speaker. It must be reading before sounddevice is imported
(PortAudio opens the default PCM while it scans devices, and the FIFO blocks until read).
The tests also run a pacer of their own in front of a ``herald run`` (tests/test_speaker.py).
With ``"stamp": true`` the pacer notes the wall-clock time of each read, printed at the end
(``stamps``): when the sound card played which byte.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

FIRST_AUDIO_TIMEOUT = 10.0  # seconds a play may take to signal its first audio

F_SETPIPE_SZ = 1031


class Pacer:
    """Reads a FIFO at a fixed byte rate: a stand-in for a sound card's clock.

    By default ``out`` holds only what was written, back to back. With ``silence_after``
    (seconds) the clock never stops: once nothing has been written for that long (the
    stream stopped between utterances, or isn't open), it records zeros for all the time
    that passes without audio, from the moment the audio stopped, as a sound card plays
    silence. ``out`` is then what a listener heard, second for second: a pause between two
    utterances is a run of zeros as long as the pause. A shorter lull is taken for the
    writer running late (a loaded test machine descheduling herald's audio thread) and the
    clock waits for it, like a device with that much more buffer.
    """

    def __init__(self, fifo: str, out: str, bytes_per_second: float,
                 hold: dict[str, float] | None = None,
                 silence_after: float | None = None, stamp: bool = False) -> None:
        self.fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        fcntl.fcntl(self.fd, F_SETPIPE_SZ, 4096)
        # Blocking reads wait for the writer; the clock that records silence must notice
        # that nobody writes.
        os.set_blocking(self.fd, silence_after is None)
        self.out = open(out, "wb")  # noqa: SIM115 - closed by stop() or at exit
        self.rate = bytes_per_second
        self.silence_after = silence_after
        self.consumed = 0
        # (bytes consumed before a read, wall-clock time of the read), with ``stamp``
        self.stamps: list[tuple[int, float]] | None = [] if stamp else None
        self.last_empty = 0.0  # monotonic time the FIFO was last found empty (silence_after)
        # {"after_bytes": N, "seconds": S}: stop reading for S seconds once N bytes are in,
        # like a sound card whose driver hangs.
        self.hold = hold
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pacer")
        self._thread.start()

    async def quiet(self, settle: float = 0.3) -> None:
        """Wait until nothing has arrived for ``settle`` seconds."""
        seen, since = self.consumed, time.monotonic()
        while time.monotonic() - since < settle:
            await asyncio.sleep(0.02)
            if self.consumed != seen:
                seen, since = self.consumed, time.monotonic()

    def stop(self) -> None:
        """Stop the clock and close the FIFO and the output file."""
        self._stop.set()
        self._thread.join(5)
        os.close(self.fd)
        self.out.close()

    def _record(self, data: bytes) -> None:
        if self.stamps is not None:
            self.stamps.append((self.consumed, time.time()))
        self.out.write(data)
        self.out.flush()
        self.consumed += len(data)

    def _run(self) -> None:
        due = time.monotonic()  # when the audio taken so far has been played
        lull: float | None = None  # since when nothing was written
        while not self._stop.is_set():
            try:
                data = os.read(self.fd, 512)
            except BlockingIOError:  # a writer is connected but has nothing for us
                data = b""
            if not data:  # nothing written right now (between opens, or between streams)
                if self.silence_after is not None:
                    now = self.last_empty = time.monotonic()
                    lull = now if lull is None else lull
                    owed = int((now - due) * self.rate) // 2 * 2
                    if now - lull > self.silence_after and owed > 0:
                        self._record(bytes(owed))
                        due += owed / self.rate
                time.sleep(0.005)
                continue
            lull = None
            self._record(data)
            if self.hold and self.consumed >= self.hold["after_bytes"]:
                time.sleep(self.hold["seconds"])
                self.hold = None
            now = time.monotonic()
            due = max(due, now - 0.01) + len(data) / self.rate
            if due > now:
                time.sleep(due - now)


async def first_heard(state: dict[str, Any]) -> float:
    """When the play signalled its first audio (``time.monotonic()``), once it has. A sink
    that never signals it must fail the test, not hang the driver: then the time it was
    given up on (FIRST_AUDIO_TIMEOUT)."""
    give_up = time.monotonic() + FIRST_AUDIO_TIMEOUT
    while state["first_audio"] is None and time.monotonic() < give_up:
        await asyncio.sleep(0.005)
    return state["first_audio"] if state["first_audio"] is not None else time.monotonic()


async def chunks(pcm: bytes, chunk_bytes: int, play: dict[str, Any], state: dict[str, Any],
                 sink: Any) -> AsyncIterator[bytes]:
    pause = play.get("pause")  # {"at": chunk index, "extra": seconds of starvation}
    rate_bytes = play["rate"] * 2
    count = (len(pcm) + chunk_bytes - 1) // chunk_bytes
    for i in range(count):
        if pause and i == pause["at"]:
            # Wait until what was sent has played, then starve the device for `extra` s.
            played_by = await first_heard(state) + i * chunk_bytes / rate_bytes + pause["extra"]
            await asyncio.sleep(max(0.0, played_by - time.monotonic()))
        if play.get("slow"):
            await asyncio.sleep(play["slow"])
        late = dict(play.get("late", [])).get(i)
        if late:
            await asyncio.sleep(late)
        if play.get("fail_at_chunk") == i:
            if play.get("fail_after_first_audio") is not None:  # while what came before plays
                await first_heard(state)
                await asyncio.sleep(play["fail_after_first_audio"])
            raise RuntimeError("synthesis failed (on purpose)")
        state["sent"] = i + 1
        state["sent_at"].append(time.time())
        yield pcm[i * chunk_bytes:(i + 1) * chunk_bytes]
        if play.get("cut_after_chunk") == i:
            await asyncio.sleep(0.05)
            sink.cut()
    state["last_sent"] = time.monotonic()


async def main(spec: dict[str, Any]) -> None:
    pacer = Pacer(spec["fifo"], spec["out"], spec["bytes_per_second"], spec.get("hold"),
                  stamp=spec.get("stamp", False)) if spec.get("fifo") else None

    from daemon.jobs.metrics import Metrics
    from daemon.settings import SpeakerSettings
    from daemon.sinks.speaker import SpeakerSink, SpeakerUnavailable
    from tts import AudioFormat

    sink = SpeakerSink(SpeakerSettings(**spec.get("settings", {})), Metrics())
    await sink.start(AudioFormat(spec["start_rate"]) if spec.get("start_rate") else None)
    keys: dict[str, object] = {}  # the sink tells keys apart by identity

    def key_of(name: str | None) -> object:
        return None if name is None else keys.setdefault(name, object())

    def act(what: dict[str, Any], rate: int) -> None:
        if "cue" in what:
            cue = what["cue"]
            sink.cue(key_of(cue["key"]), AudioFormat(rate), Path(cue["pcm"]).read_bytes(),
                     cue.get("gap", 0.0))
        else:
            sink.cut(key_of(what["cut"]))

    for play in spec["plays"]:
        if pacer and not play.get("back_to_back"):  # once the device is quiet, what the
            await pacer.quiet()  # pacer got so far is all the previous plays' audio
        consumed_before = pacer.consumed if pacer else None
        await asyncio.sleep(play.get("sleep_before", 0.0))
        for key, value in play.get("settings", {}).items():
            setattr(sink.settings, key, value)
        if "device" in play:
            sink.device = play["device"]
        if "volume" in play:
            sink.volume = play["volume"]
        pcm = Path(play["pcm"]).read_bytes()
        if play.get("start_at") == "stdin":
            print(json.dumps({"ready": True}), flush=True)
            line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            play["start_at"] = float(line)
        state: dict[str, Any] = {"first_audio": None, "sent": 0, "last_sent": None,
                                 "sent_at_first_audio": None, "sent_at": [],
                                 "first_audio_at": None}

        def first_audio(state: dict[str, Any] = state) -> None:
            state["first_audio"] = time.monotonic()
            state["first_audio_at"] = time.time()
            state["sent_at_first_audio"] = state["sent"]

        async def after_first_audio(delay: float, action: Any,
                                    state: dict[str, Any] = state) -> None:
            await first_heard(state)
            if state["first_audio"] is None:
                return  # never heard: the test's own assertions report it
            await asyncio.sleep(delay)
            action()

        helpers = []
        if play.get("cut_after_first_audio") is not None:
            helpers.append(asyncio.create_task(
                after_first_audio(play["cut_after_first_audio"], sink.cut)))
        if play.get("volume_after_first_audio") is not None:
            delay, value = play["volume_after_first_audio"]
            helpers.append(asyncio.create_task(
                after_first_audio(delay, lambda v=value: setattr(sink, "volume", v))))
        for delay, what in play.get("after_first_audio", []):
            helpers.append(asyncio.create_task(after_first_audio(
                delay, lambda w=what, r=play["rate"]: act(w, r))))
        result: dict[str, Any] = {"error": None, "stats": None, "cancelled": False}
        t0 = time.monotonic()
        result["called_at"] = time.time()
        start_at = play.get("start_at")
        if play.get("start_in") is not None:
            start_at = result["called_at"] + play["start_in"]
        result["start_at"] = start_at
        task = asyncio.create_task(sink.play(
            AudioFormat(play["rate"]), chunks(pcm, play.get("chunk_bytes", 4096), play, state,
                                              sink), first_audio,
            key=key_of(play.get("key")), pause=play.get("gap", 0.0), start_at=start_at,
            preroll=play.get("preroll", 0.0)))
        if play.get("cancel_after_first_audio") is not None:  # what SIGTERM does to a play
            helpers.append(asyncio.create_task(
                after_first_audio(play["cancel_after_first_audio"], task.cancel)))
        try:
            result["stats"] = (await task).__dict__
        except SpeakerUnavailable as e:
            result["error"] = str(e)
        except asyncio.CancelledError:
            result["cancelled"] = True
        except RuntimeError as e:  # the source's own error, handed through
            result["source_error"] = str(e)
        result["consumed_before"] = consumed_before
        result["consumed_at_return"] = pacer.consumed if pacer else None
        for what in play.get("after_return", []):
            act(what, play["rate"])
        result["file_size"] = os.path.getsize(spec["file"]) if spec.get("file") and \
            os.path.exists(spec["file"]) else None
        result["seconds"] = time.monotonic() - t0
        result["sent_at_first_audio"] = state["sent_at_first_audio"]
        result["sent_at"] = state["sent_at"]  # wall clock, each chunk as it was handed over
        result["first_audio_at"] = state["first_audio_at"]  # wall clock
        result["chunks"] = (len(pcm) + play.get("chunk_bytes", 4096) - 1) // play.get(
            "chunk_bytes", 4096)
        for task in helpers:
            task.cancel()
        print(json.dumps(result), flush=True)
    await sink.stop()
    if pacer:
        await pacer.quiet()  # let the pacer take what is still in the pipe
        print(json.dumps({"consumed_total": pacer.consumed, "stamps": pacer.stamps}),
              flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    # The sink's log on stderr: what a failing test shows, and what some tests look for.
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    asyncio.run(main(json.loads(Path(sys.argv[1]).read_text())))

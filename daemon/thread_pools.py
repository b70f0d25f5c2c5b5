"""herald's thread pools: how many threads each may start, under a name the OS shows.

A pool starts its threads lazily, one more each time a job finds all of them busy, up to
its size: how many it has at a moment depends on how its jobs happened to overlap. Each
pool's threads carry its name where ``top -H`` and ``ps -L`` read it, so they can be told
from the rest: a person sees which pool a busy thread is in, and ``bench.soak`` bounds each
pool's threads by its size while it holds every other thread count exact.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from tts.native_names import name_native

SIZES: dict[str, int] = {
    # asyncio's default executor (``asyncio.to_thread``): what would block the event loop
    # (resampling for the speaker, file reads, catalog scans, waits for a publish), as many
    # threads as Python would give it.
    "herald-io": min(32, (os.cpu_count() or 1) + 4),
    # HTTP's mp3 and opus encoding: jobs are short and each response runs one at a time;
    # two threads keep a stream from waiting behind another's job without letting encoders
    # crowd the synthesis workers.
    "herald-encode": 2,
    "herald-mqtt-enc": 1,  # the MQTT audio topic's encoding, in the order it was asked
    "herald-speaker": 1,  # PortAudio's blocking calls, one at a time (``sinks.speaker``)
}
"""Threads each pool may start; a name is at most 15 bytes, all the OS keeps."""


def pool(name: str) -> ThreadPoolExecutor:
    """A new pool of ``SIZES[name]`` threads, each named ``name`` for the OS."""
    return ThreadPoolExecutor(SIZES[name], thread_name_prefix=name, initializer=name_native,
                              initargs=(name,))

"""What a long request may keep after it ends, measured on a real ``herald run`` through
``/proc``: its resident anonymous memory once idle again must come back to within a bound of
where it rested before (``tts.memory``: oneDNN's kernel cache and PyTorch's cache of
convolution descriptions are bounded; ``Engine.rest`` hands the freed heap back once the job
is over).

Anonymous memory (the heap, the weights) is what herald keeps. Its file-backed pages (the
code of torch's libraries) are the kernel's: dropped while the host's memory is in demand
(other tests' processes) and read back as the request runs them, they move the total by
tens of megabytes from run to run whatever herald does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import free_port, wait_port
from fresh_python import run_python
from herald_process import start_herald

from bench.resting import SENTENCES, long_text, resting, synthesize

# A fresh process: a 40 MB buffer held at the first hand-back and freed after it (the warm
# probe's, a first request's one-off work), then a request's heap: 14 MB of half-megabyte
# pieces, freed but resident at the heap's top (below glibc's trim threshold, as herald sets
# it), over a slack of 8 MB.
RESTING_CODE = """
import json
import numpy as np
from tts.memory import RestingLevel, anonymous_mb, pin_allocator_thresholds
pin_allocator_thresholds()
rest = RestingLevel(slack_mb=8)
held = np.ones(40 << 17)
rest.idle()
del held
rest.observe()  # a synthesis starts from idle
pieces = [np.ones(1 << 16) for _ in range(28)]
del pieces
before = anonymous_mb()
due = rest.due()
rest.idle()
print(json.dumps([due, before - anonymous_mb()]))
"""
LONG_CHARS = 3000  # about 160 s of speech
KEEP_MB = 24.0  # what the long request may leave resident, once idle


def test_what_is_freed_after_a_hand_back_lowers_the_resting_level() -> None:
    """The level a hand-back reads can hold what is freed a moment later. Left there, a
    request's growth hides under it and is never handed back: the level follows the
    readings at rest down."""
    out = run_python(RESTING_CODE).stdout
    due, handed_back = json.loads(out.splitlines()[-1])
    assert due, "14 MB of freed heap above where the process rests was not due to go back"
    assert handed_back > 10, f"only {handed_back:.0f} MB of the 14 MB freed went back"


@pytest.mark.slow
@pytest.mark.alone  # a neighbour changes how work overlaps, so the threads and arenas it grows
def test_a_long_request_does_not_raise_the_resting_level(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "herald.toml"
    config.write_text(f'[mqtt]\nenabled = false\n[speaker]\nenabled = false\n'
                      f'[http]\nenabled = false\n[wyoming]\nuri = "tcp://127.0.0.1:{port}"\n')
    herald = start_herald(config, tmp_path / "herald.log")
    try:
        wait_port(port, 120)
        pid = herald.proc.pid
        for text in SENTENCES[:4]:  # what a running herald has served before: warm
            assert asyncio.run(synthesize(port, text)) > 1.0
        before = resting(pid, anonymous=True)
        text = long_text(LONG_CHARS)
        seconds = asyncio.run(synthesize(port, text))
        assert seconds > 120, f"{len(text)} characters gave only {seconds:.0f} s of audio"
        after = resting(pid, anonymous=True)
        assert after - before <= KEEP_MB, (
            f"a {len(text)}-character request ({seconds:.0f} s of audio) left herald at "
            f"{after:.0f} MB of anonymous memory, {after - before:.0f} MB above its resting level "
            f"{before:.0f} MB (allowed: {KEEP_MB:.0f})")
        assert asyncio.run(synthesize(port, SENTENCES[0])) > 2.0  # and it serves on
        assert herald.terminate() == 0, herald.tail()
    finally:
        herald.kill()

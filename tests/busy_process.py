"""A process that keeps a core busy, as a neighbour on the machine would."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def busy_process() -> Iterator[subprocess.Popen[str]]:
    """A Python busy loop, running once this yields, killed after."""
    busy = subprocess.Popen([sys.executable, "-c", "print('busy', flush=True)\nwhile True: pass"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout is not None and busy.stdout.readline() == "busy\n"
        yield busy
    finally:
        busy.kill()
        busy.wait()

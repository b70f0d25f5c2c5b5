"""A thread's name as the OS shows it (``top -H``, ``ps -L``, ``/proc/PID/task/TID/comm``).

Torch-free: a fleet satellite names its threads too, and loads no model.
"""

from __future__ import annotations

import ctypes
import threading

_PR_SET_NAME = 15  # prctl's option that names the calling thread (linux/prctl.h)


def name_native(name: str | None = None) -> None:
    """Show the calling thread's name (``name``, else its Python name) to the OS, as its
    first 15 bytes. Python 3.11 keeps a thread's name to itself, so without this every
    thread reads as the one that started it. Nothing happens where there is no ``prctl``
    (not Linux)."""
    label = (name or threading.current_thread().name).encode(errors="replace")[:15]
    try:
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return
    prctl(_PR_SET_NAME, ctypes.c_char_p(label), 0, 0, 0)

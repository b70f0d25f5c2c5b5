"""systemd integration: readiness, status and watchdog notifications, journald logging.

Notifications go through ``systemd.daemon.notify`` (systemd-python); without that package
they are written to ``$NOTIFY_SOCKET`` directly (the protocol is one datagram of
``KEY=value`` lines). Outside systemd (no ``NOTIFY_SOCKET``) every call is a cheap no-op, so
the service calls them unconditionally.

Watchdog contract (``WatchdogSec=`` in the unit). A watchdog that a timer pets no matter what
only proves the event loop runs; herald's failure mode is a synthesis or a sound device that
hangs while the loop is fine. So:

* the service calls ``Watchdog.progress()`` whenever work advances: a chunk synthesized, a
  block of audio played, a request finished;
* ``busy()`` (given to the ``Watchdog``) says whether any synthesis or playback is in flight;
  an idle daemon is healthy as long as the loop runs, which the pet task itself proves;
* ``problem()`` (optional) names work in hand that can't move (a speaker that takes no
  audio): while it does, the pets stop at once, whatever ``progress()`` said;
* every ``interval / 2`` the pet task sends ``WATCHDOG=1`` only if there is no problem and
  herald is idle or progress was seen within the last ``stall_after`` seconds (default: the
  whole interval).

A stuck synthesis or playback therefore stops the pets, and systemd restarts herald
(``Restart=on-failure``) at most ``stall_after + interval`` after the last progress; a
blocked event loop stops them too, because the pet task can't run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from collections.abc import Callable

from .logs import RequestIdFilter

log = logging.getLogger("herald.systemd")

JOURNAL_SOCKET = "/run/systemd/journal/socket"

# Log record attributes that become journal fields, so ``journalctl -u herald
# HERALD_REQUEST_ID=abc`` finds one request's lines. ``request_id`` is set from the request
# being served (daemon.logs); the others only where a call passes them in ``extra``.
JOURNAL_FIELDS = {
    "request_id": "HERALD_REQUEST_ID",
    "front": "HERALD_FRONT",
    "sink": "HERALD_SINK",
    "voice": "HERALD_VOICE",
    "client": "HERALD_CLIENT",
}


# ---------------------------------------------------------------- notifications

def notify(message: str) -> bool:
    """Send one sd_notify message; False when not under systemd (or it failed)."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return False
    try:
        from systemd import daemon as sd_daemon  # type: ignore[attr-defined, unused-ignore]
    except ImportError:
        return _notify_socket(message)
    try:
        return bool(sd_daemon.notify(message))
    except Exception as e:  # a notification must never take the daemon down
        log.debug("sd_notify(%r) failed: %s", message, e)
        return False


def _notify_socket(message: str) -> bool:
    """The sd_notify protocol by hand: one datagram to ``$NOTIFY_SOCKET``."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall(message.encode())
        return True
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path, text not encodable
        log.debug("writing to NOTIFY_SOCKET %s failed: %s", address, e)
        return False


def _one_line(text: str) -> str:
    return " ".join(text.split())


def ready(status_text: str | None = None) -> bool:
    """READY=1: start-up is complete; ``systemctl start`` returns now (Type=notify)."""
    return notify("READY=1" + (f"\nSTATUS={_one_line(status_text)}" if status_text else ""))


def status(text: str) -> bool:
    """STATUS=…: the line ``systemctl status herald`` shows."""
    return notify(f"STATUS={_one_line(text)}")


def stopping() -> bool:
    """STOPPING=1: shutting down (cutting the current utterance, saying goodbye on MQTT)."""
    return notify("STOPPING=1")


def watchdog_ping() -> bool:
    """WATCHDOG=1. Call it through ``Watchdog``, which only pets while work progresses."""
    return notify("WATCHDOG=1")


def watchdog_interval() -> float | None:
    """The watchdog timeout systemd set (seconds), or None when there is none for us."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None  # meant for another process (we were started by the service's child)
    return int(usec) / 1_000_000


def watchdog_enabled() -> bool:
    return watchdog_interval() is not None


class Watchdog:
    """Pets systemd's watchdog only while herald is idle or making progress (see the
    module docstring for the contract)."""

    def __init__(self, busy: Callable[[], bool] | None = None, interval: float | None = None,
                 stall_after: float | None = None,
                 problem: Callable[[], str | None] | None = None) -> None:
        self.interval = interval if interval is not None else watchdog_interval()
        self.stall_after = stall_after if stall_after is not None else self.interval
        self.busy = busy or (lambda: True)  # without busy(): progress() must keep coming
        self.problem = problem or (lambda: None)
        self.pets = 0
        self._last = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._starving = False

    def progress(self) -> None:
        """Work advanced (a chunk synthesized or played, a request done). Cheap: call often."""
        self._last = time.monotonic()

    def healthy(self) -> bool:
        if self.problem() is not None:
            return False
        if not self.busy():
            self._last = time.monotonic()
            return True
        return self.stall_after is not None and time.monotonic() - self._last <= self.stall_after

    def start(self) -> None:
        """Begin petting (no-op when systemd set no watchdog for us)."""
        if self.interval is not None and self._task is None:
            self._last = time.monotonic()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="watchdog")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        assert self.interval is not None
        while True:
            if self.healthy():
                if self._starving:
                    log.warning("work is progressing again; petting the systemd watchdog")
                self._starving = False
                watchdog_ping()
                self.pets += 1
            elif not self._starving:
                self._starving = True
                problem = self.problem() or (f"no synthesis/playback progress for "
                                             f"{time.monotonic() - self._last:.0f} s")
                log.error("%s: no longer petting the systemd watchdog, systemd will restart "
                          "herald unless it recovers", problem)
            await asyncio.sleep(self.interval / 2)


# ---------------------------------------------------------------------- logging

def under_systemd() -> bool:
    """True when systemd started us: stderr is its journal stream, or it set INVOCATION_ID."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    if stream:
        try:
            dev, ino = (int(v) for v in stream.split(":"))
            st = os.fstat(sys.stderr.fileno())
            if (st.st_dev, st.st_ino) == (dev, ino):
                return True
        except (ValueError, OSError, AttributeError):
            pass
    return bool(os.environ.get("INVOCATION_ID"))


class _JournalFields(RequestIdFilter):
    """Copies ``request_id`` & co. onto the record under their journal field names; the
    request id comes from the log context (``daemon.logs``) where the call passed none."""

    def filter(self, record: logging.LogRecord) -> bool:
        super().filter(record)
        for attr, field in JOURNAL_FIELDS.items():
            value = record.__dict__.get(attr)
            if value is not None:
                setattr(record, field, str(value))
        return True


class _ReadableFormatter(logging.Formatter):
    """``2026-05-01 12:00:00,123 INFO herald.speaker: [req-1] message``."""

    def __init__(self, timestamps: bool = True) -> None:
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s" if timestamps else \
            "%(levelname)s %(name)s: %(message)s"
        super().__init__(fmt)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging API
        request_id = record.__dict__.get("request_id")
        if request_id is not None:
            record.message = f"[{request_id}] {record.message}"
        return super().formatMessage(record)


class _PriorityPrefix(_ReadableFormatter):
    """stderr under systemd without systemd-python: ``<3>`` prefixes let journald keep each
    line's priority; it adds its own timestamps."""

    PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4),
                  (logging.INFO, 6))

    def __init__(self) -> None:
        super().__init__(timestamps=False)

    def format(self, record: logging.LogRecord) -> str:
        pri = next((p for level, p in self.PRIORITIES if record.levelno >= level), 7)
        return f"<{pri}>" + super().format(record).replace("\n", f"\n<{pri}>")


def setup_logging(level: int | str = logging.INFO) -> logging.Handler:
    """Route herald's logs: straight to journald (with ``HERALD_*`` fields) when systemd runs
    us, else readable lines on stderr. Takes over the root logger (handlers set up before,
    e.g. by ``logging.basicConfig``, are removed so nothing is logged twice)."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler: logging.Handler | None = None
    if under_systemd():
        try:
            from systemd.journal import JournalHandler
        except ImportError:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(_PriorityPrefix())
        else:
            if os.path.exists(JOURNAL_SOCKET):
                handler = JournalHandler(SYSLOG_IDENTIFIER="herald")
            else:  # a container without journald: stderr is what's collected
                handler = logging.StreamHandler(sys.stderr)
                handler.setFormatter(_PriorityPrefix())
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_ReadableFormatter())
    handler.addFilter(_JournalFields())
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler

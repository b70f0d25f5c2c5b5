"""Helper processes: the cores a synthesis uses besides its own lane.

A sentence's audio is cut into pieces that decode at the same time and join exactly
(``tts.pieces``). Decoded on threads of this process they would take turns on the
interpreter's lock: a window is hundreds of small tensor operations, each taking the lock
to be dispatched, and two threads doing that ran slower together than one alone
(bench/README.md, "Where the time goes"). Intra-op threads avoid the lock but stop at a
barrier after every operation, and collapse whenever another process wants a core. So the
pieces a synthesis hands out go to helper *processes*: each computes one piece at a time on
one thread and sends its audio back as it comes.

The helpers are forked from herald once its voices are loaded, while no synthesis runs: they
share the loaded weights (and torch's own memory) with it, page for page, until either side
writes them, which neither does. A voice loaded later is loaded by each helper from its
file when a piece of it first comes.

A helper that dies (killed, out of memory) is noticed at once: the pieces it held fail over
to the lane that plays them, which decodes them itself, and no piece is given to it again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import numpy as np

from tts import VoiceCatalog
from tts.neighbours import count_as_own
from tts.pieces import HelperFailed, Helping, PieceJob
from tts.vits import Vits

log = logging.getLogger(__name__)

WINDOW = 256  # frames a helper decodes at a time (its flow runs as far ahead)
REST_AFTER = 1.0  # seconds without a piece after which a helper hands back its freed heap
_PR_SET_PDEATHSIG = 1


@dataclass
class _Job:
    """A piece handed to a helper, as the lane that plays it sees it."""

    pool: HelperPool
    helper: _Helper
    id: int
    state: str = "queued"  # queued, begun, claimed, cancelled, done, failed
    audio: deque[tuple[np.ndarray, bool]] = field(default_factory=deque)
    error: str | None = None
    changed: threading.Condition = field(default_factory=threading.Condition)

    def claim(self) -> bool:
        with self.changed:
            if self.state == "failed":
                return True  # nothing of it was taken yet: decoded by the caller
            if self.state != "queued":
                return False
            self.state = "claimed"
        self.helper.send(("cancel", self.id, None))
        return True

    def queued(self) -> bool:
        return self.state == "queued"

    def take(self, wait: bool) -> list[tuple[np.ndarray, bool]]:
        with self.changed:
            while wait and not self.audio and self.state == "begun":
                self.changed.wait()
            if not self.audio and self.state == "failed":
                raise HelperFailed(self.error or "the helper process failed")
            got = list(self.audio)
            self.audio.clear()
            return got

    def cancel(self) -> None:
        with self.changed:
            if self.state not in ("queued", "begun"):
                return
            self.state = "cancelled"
        self.helper.forget(self.id)
        self.helper.send(("cancel", self.id, None))

    def arrived(self, kind: str, payload: Any) -> None:
        """A message from the helper about this job (on the helper's reader thread)."""
        with self.changed:
            if kind == "begun" and self.state == "queued":
                self.state = "begun"
            elif kind == "audio" and self.state == "begun":
                self.audio.append(payload)
                if payload[1]:
                    self.state = "done"
                    self.pool.decoded += 1
            elif kind == "failed" and self.state in ("queued", "begun"):
                self.state, self.error = "failed", payload
            self.changed.notify_all()


class _Helper:
    """One helper process, seen from herald: its connection, what it has been given."""

    def __init__(self, pid: int, conn: Connection) -> None:
        self.pid = pid
        self.conn = conn
        self.alive = True
        self.closing = False  # herald is ending it: its end is no news
        self.voices: set[str] = set()
        self.jobs: dict[int, _Job] = {}
        self._outbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, name=f"herald-helper-{pid}",
                                        daemon=True)
        self._writer = threading.Thread(target=self._write,
                                        name=f"herald-helper-{pid}-send", daemon=True)

    def start(self) -> None:
        """Start reading and writing its messages (threads: once every helper is forked)."""
        self._reader.start()
        self._writer.start()

    def close(self) -> None:
        """Close the connection once the process has ended: its reader has met the end of
        the connection by then (closed under a reader still inside ``recv``, the connection
        fails there with a TypeError)."""
        if self._reader.is_alive():
            self._reader.join(timeout=1.0)
        self._outbox.put(None)
        if self._writer.is_alive():
            self._writer.join(timeout=1.0)
        with contextlib.suppress(OSError):
            self.conn.close()

    @property
    def load(self) -> int:
        return len(self.jobs)

    def send(self, message: tuple[Any, ...]) -> bool:
        """Hand a message to the writer thread; False if the helper is known to have ended.

        The caller (a synthesis's playing lane) never waits for the helper to read: a
        helper reads its messages only between pieces, and a sentence's frames (a few
        hundred kilobytes) fill the socket's buffer, so writing one while the helper is
        busy would hold the playing lane until the helper's piece is done. A message the
        writer cannot deliver means the helper has ended: the reader meets the end of the
        connection and fails the helper's jobs over to the lanes that play them."""
        if not self.alive:
            return False
        self._outbox.put(message)
        return True

    def _write(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                self.conn.send(message)
            except OSError:
                self.alive = False
                return

    def forget(self, job_id: int) -> None:
        self.jobs.pop(job_id, None)

    def _read(self) -> None:
        while True:
            try:
                kind, job_id, payload = self.conn.recv()
            except (EOFError, OSError):
                break
            job = self.jobs.get(job_id)
            if job is not None:
                job.arrived(kind, payload)
                if kind in ("failed", "skipped") or (kind == "audio" and payload[1]):
                    self.forget(job_id)
        self.alive = False
        count_as_own(self.pid, own=False)
        for job in list(self.jobs.values()):
            job.arrived("failed", f"helper process {self.pid} ended")
        self.jobs.clear()
        if not self.closing:
            log.warning("helper process %d ended; the pieces it had are decoded by the lanes "
                        "that play them, and syntheses use one core fewer", self.pid)


class HelperPool:
    """``processes`` helper processes; a synthesis cut into ``lanes`` pieces."""

    def __init__(self, catalog: VoiceCatalog, processes: int) -> None:
        self.catalog = catalog
        self.decoded = 0  # pieces a helper decoded to the end and sent
        self.handed = 0  # pieces handed to a helper
        self._helpers: list[_Helper] = []
        self._lock = threading.Lock()
        self._next_id = 0
        for _ in range(processes):
            helper = self._fork()
            if helper is not None:
                self._helpers.append(helper)
        for helper in self._helpers:
            helper.start()
        if self._helpers:
            log.info("synthesis: %d helper process(es) (pids %s)", len(self._helpers),
                     ", ".join(str(h.pid) for h in self._helpers))

    @property
    def lanes(self) -> int:
        return 1 + sum(1 for h in self._helpers if h.alive)

    @property
    def pids(self) -> list[int]:
        return [h.pid for h in self._helpers if h.alive]

    def decode(self, model: Vits, job: PieceJob) -> Helping:
        voice = self._voice_of(model)
        with self._lock:
            alive = [h for h in self._helpers if h.alive]
            self._next_id += 1
            job_id = self._next_id
        if voice is None or not alive:
            return _Refused()
        helper = min(alive, key=lambda h: h.load)
        handle = _Job(self, helper, job_id)
        helper.jobs[job_id] = handle
        if voice not in helper.voices:
            helper.voices.add(voice)
            helper.send(("voice", 0, voice))
        if not helper.send(("job", job_id, (voice, _plain(job)))):
            helper.forget(job_id)
            return _Refused()
        self.handed += 1
        return handle

    def close(self) -> None:
        """End the helpers (they end by themselves when herald does, too)."""
        for h in self._helpers:
            h.closing = True
            h.send(("stop", 0, None))
        for h in self._helpers:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(h.pid, 0)
            h.close()
        self._helpers.clear()

    def _voice_of(self, model: Vits) -> str | None:
        for synth in self.catalog.loaded():
            if synth.model is model:
                return synth.voice.name
        return None

    def _fork(self) -> _Helper | None:
        ours, theirs = socket.socketpair()
        herald = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            log.warning("cannot start a helper process (%s): syntheses use one core each", e)
            return None
        if pid == 0:  # the helper
            ours.close()
            _helper_main(theirs, self.catalog, herald)
        theirs.close()
        count_as_own(pid)
        return _Helper(pid, Connection(ours.detach()))


class Lent:
    """The pool as one synthesis sees it: all its lanes while that synthesis runs alone,
    none beside others.

    A playing lane that gets to a piece a helper has begun waits for its audio, and that
    wait holds the engine's worker, which every other synthesis needs for its own windows
    (``daemon.synthesis.workers`` orders them by deadline). Shared out to several syntheses, one's
    piece would queue behind another's at a helper while its lane held the worker, and
    concurrent streams would hear gaps (bench/README.md, "Concurrent streams"). So pieces
    are handed out only by a synthesis alone; beside others it decodes on the worker, by
    deadline, and what it handed out before goes on.
    """

    def __init__(self, pool: HelperPool, alone: Callable[[], bool]) -> None:
        self.pool = pool
        self.alone = alone

    @property
    def lanes(self) -> int:
        return self.pool.lanes if self.alone() else 1

    def decode(self, model: Vits, job: PieceJob) -> Helping:
        return self.pool.decode(model, job)


class _Refused:
    """A piece no helper took: the playing lane decodes it."""

    def claim(self) -> bool:
        return True

    def queued(self) -> bool:
        return False

    def take(self, wait: bool) -> list[tuple[np.ndarray, bool]]:
        return []

    def cancel(self) -> None:
        pass


def _plain(job: PieceJob) -> dict[str, Any]:
    """The job as plain arrays (pickled by value: no shared memory for a few hundred KB)."""
    return {"z": job.z.numpy(), "start": job.start, "end": job.end,
            "g": None if job.g is None else job.g.numpy(), "gain": job.gain,
            "flowed": job.flowed}


def _helper_main(sock: socket.socket, catalog: VoiceCatalog, herald: int) -> NoReturn:
    """The helper process: pieces in, audio out, until herald (PID ``herald``) closes the
    connection."""
    code = 0
    try:
        _detach(sock.fileno(), herald)
        _serve(Connection(sock.detach()), catalog)
    except (EOFError, OSError):  # herald closed the connection or is gone
        pass
    except BaseException:  # nothing above this frame belongs to the helper: say why, end
        code = 1
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _detach(keep: int, herald: int) -> None:
    """What a forked helper must not keep of herald: its other file descriptors (sockets
    that would outlive herald), its signal handlers, and a life after herald's."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is herald's to handle
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    os.closerange(3, keep)
    os.closerange(keep + 1, _max_fd())
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    # herald's log handlers wrote to descriptors just closed: warnings go to stderr, which
    # systemd's journal (or the terminal) takes as herald's own.
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"herald helper {os.getpid()}: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    # herald already gone: the helper has another parent now. (Not "the parent is PID 1":
    # in a container herald itself is PID 1.)
    if os.getppid() != herald:
        os._exit(0)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 4096


def _serve(conn: Connection, catalog: VoiceCatalog) -> None:
    import torch

    from tts.memory import release_free_memory
    from tts.threads import prepare_thread

    prepare_thread()
    pending: deque[tuple[int, tuple[str, dict[str, Any]]]] = deque()
    cancelled: set[int] = set()
    worked = False  # since the freed heap was last handed back
    while True:
        while not pending or conn.poll():
            if not pending and worked and not conn.poll(REST_AFTER):
                # Idle: what the pieces freed goes back to the system, as herald's own
                # process does once it rests (tts.memory).
                release_free_memory("helper idle")
                worked = False
            kind, job_id, payload = conn.recv()
            if kind == "stop":
                return
            if kind == "voice":
                catalog.synthesizer(payload)  # loaded here unless herald had it at the fork
            elif kind == "job":
                pending.append((job_id, payload))
            elif kind == "cancel" and any(k == job_id for k, _ in pending):
                cancelled.add(job_id)  # one begun or done already is not in ``pending``
        job_id, (voice, plain) = pending.popleft()
        if job_id in cancelled:
            cancelled.discard(job_id)
            conn.send(("skipped", job_id, None))
            continue
        conn.send(("begun", job_id, None))
        worked = True
        try:
            model = catalog.synthesizer(voice).model
            job = PieceJob(torch.from_numpy(plain["z"]), plain["start"], plain["end"],
                           None if plain["g"] is None else torch.from_numpy(plain["g"]),
                           plain["gain"], plain["flowed"])
            for samples, last in job.decode(model, WINDOW):
                conn.send(("audio", job_id, (samples, last)))
        except Exception as e:  # the playing lane raises it
            conn.send(("failed", job_id, f"{type(e).__name__}: {e}"))

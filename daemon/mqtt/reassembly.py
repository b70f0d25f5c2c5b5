"""``say/stream`` reassembly: pieces that may arrive twice, late or out of order, put back in
``seq`` order and fed to their request's text stream.

Broker-free and clock-free on purpose: the caller hands in the submit function and a
``call_later`` (the event loop's, in the daemon), so every rule here (order, duplicates,
``mqtt.max_text`` across held pieces, the timeout) is tested with plain function calls.

A stream that was refused or has ended takes no more pieces, and a client that keeps
sending them (a loop gone wrong, a flood) must not cost one error event each: the first is
refused, the rest are dropped and counted, and reported in one summary after
``SUMMARY_EVERY`` seconds, then after twice as long each time (up to ``SUMMARY_MAX``) while
they keep coming: a flood of any length costs a handful of reports. ``DropGate`` lets the
MQTT network thread drop them before they reach the event loop at all, so that a flood
cannot queue up there ahead of a ``stop`` or a ``say``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import RequestError
from ..jobs.request import Request, TextStream
from .payload import StreamPiece

log = logging.getLogger(__name__)

REMEMBERED_IDS = 2000
SUMMARY_EVERY = 5.0  # seconds before the first "dropped N pieces" report of a stream
SUMMARY_MAX = 60.0  # ... and the longest wait between two of them
_GATE_MAX_BYTES = 65536  # larger pieces are left to the event loop (and refused there)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], Cancellable]


class RecentIds:
    """The last ``size`` request ids taken: a request sent twice (a QoS 1 redelivery, a
    client's retry) is refused rather than spoken twice."""

    def __init__(self, size: int = REMEMBERED_IDS) -> None:
        self._size = size
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def add(self, request_id: str) -> None:
        self._ids[request_id] = None
        while len(self._ids) > self._size:
            self._ids.popitem(last=False)


class DropGate:
    """The ids whose ``say/stream`` pieces are being dropped, and how many were.

    ``drop`` runs in the MQTT network thread for every ``say/stream`` message, so it costs
    nothing while no stream is being dropped, and only a JSON parse while one is; the rest
    (opening, reading the counts) happens on the event loop. The lock makes the count exact
    across the two threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def drop(self, payload: bytes) -> bool:
        """True if ``payload`` is a piece of a dropped stream (it is counted)."""
        if not self._counts or len(payload) > _GATE_MAX_BYTES:
            return False
        try:
            data = json.loads(payload)
        except ValueError:  # not JSON: the event loop refuses it, saying why
            return False
        rid = data.get("id") if isinstance(data, dict) else None
        if not isinstance(rid, str):
            return False
        with self._lock:
            if rid not in self._counts:
                return False
            self._counts[rid] += 1
        return True

    def open(self, request_id: str) -> None:
        with self._lock:
            self._counts.setdefault(request_id, 0)

    def take(self, request_id: str) -> int:
        """The pieces dropped since the last call (0 for an id not being dropped)."""
        with self._lock:
            n = self._counts.get(request_id, 0)
            if request_id in self._counts:
                self._counts[request_id] = 0
            return n

    def close(self, request_id: str) -> int:
        with self._lock:
            return self._counts.pop(request_id, 0)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._counts


@dataclass(eq=False)
class _Dropping:
    """A stream whose further pieces are dropped: why, and how many since the last report."""

    why: str
    count: int = 0
    every: float = SUMMARY_EVERY  # until the next report
    timer: Cancellable | None = None


@dataclass(eq=False)
class _Stream:
    """A say/stream utterance being assembled: pieces are fed in ``seq`` order."""

    req: Request
    next_seq: int = 0
    pending: dict[int, tuple[str, bool]] = field(default_factory=dict)
    held: int = 0  # characters waiting in `pending` (each piece counts at least one)
    empty: int = 0  # empty pieces fed: they count as one character each too
    timer: Cancellable | None = None

    @property
    def stream(self) -> TextStream:
        assert self.req.stream is not None  # stream_request always sets one
        return self.req.stream


class Reassembly:
    """The ``say/stream`` utterances in progress, by request id."""

    def __init__(self, max_text: int, timeout: float, call_later: CallLater,
                 seen: RecentIds, report: Callable[[RequestError], None]) -> None:
        """``report``: publishes an error found outside a ``take`` (a drop summary)."""
        self.max_text = max_text
        self.timeout = timeout
        self.gate = DropGate()
        self._call_later = call_later
        self._seen = seen
        self._report = report
        self._streams: dict[str, _Stream] = {}
        self._ended: OrderedDict[str, int] = OrderedDict()  # ended stream -> its next seq
        self._dropping: dict[str, _Dropping] = {}

    def take(self, piece: StreamPiece, open_request: Callable[[StreamPiece], Request],
             submit: Callable[[Request], object]) -> None:
        """One piece. The first of a stream opens its request (``open_request``) and queues it
        (``submit``); either may raise RequestError, which the caller reports."""
        st = self._streams.get(piece.id)
        if st is None:
            ended_at = self._ended.get(piece.id)
            if ended_at is not None and piece.seq is not None and piece.seq < ended_at:
                log.debug("MQTT say/stream %s: late duplicate piece %d ignored", piece.id,
                          piece.seq)
                return
            if piece.id in self._seen:
                self._drop(piece.id, "has already ended")
                return
            # Remember the id even if the first piece is refused, so the pieces after it
            # don't start the stream from the middle: they are dropped, its refusal said why.
            self._seen.add(piece.id)
            try:
                req = open_request(piece)
                st = _Stream(req)
                self._streams[req.id] = st
                submit(req)
            except RequestError:
                self._streams.pop(piece.id, None)
                self._start_dropping(piece.id, "was refused")
                raise
        if piece.seq is None:
            self._feed(st, piece.text, piece.final)
        elif piece.seq < st.next_seq or piece.seq in st.pending:
            log.debug("MQTT say/stream %s: duplicate piece %d ignored", piece.id, piece.seq)
        else:
            size = max(1, len(piece.text))  # so that empty pieces cannot pile up either
            if not self._too_long(st, size):
                st.pending[piece.seq] = (piece.text, piece.final)
                st.held += size
            while st.next_seq in st.pending and st.req.id in self._streams:
                text, final = st.pending.pop(st.next_seq)
                st.held -= max(1, len(text))
                st.next_seq += 1
                self._feed(st, text, final)
        if st.req.id in self._streams:
            if st.timer:
                st.timer.cancel()
            rid = st.req.id
            st.timer = self._call_later(self.timeout, lambda: self.expire(rid))

    def _too_long(self, st: _Stream, more: int) -> bool:
        """End the stream with an error if ``more`` characters would take it past
        mqtt.max_text. Pieces held for a missing earlier one count too: they would otherwise
        pile up unchecked for as long as pieces keep coming (stream_timeout restarts)."""
        if st.stream.total_chars + st.empty + st.held + more <= self.max_text:
            return False
        self.end(st.req.id)
        self._start_dropping(st.req.id, f"was refused: longer than {self.max_text} characters")
        st.stream.fail(RequestError(f"stream text exceeds {self.max_text} characters "
                                    "(mqtt.max_text); the rest is not spoken", st.req.id))
        return True

    def _feed(self, st: _Stream, text: str, final: bool) -> None:
        if self._too_long(st, max(1, len(text))):
            return
        st.empty += not text
        st.req.text += text
        if final and not st.req.text.strip():
            self.end(st.req.id)
            st.stream.fail(RequestError("empty 'text': nothing to say", st.req.id))
            return
        st.stream.feed(text, final)
        if final:
            self.end(st.req.id)

    def end(self, request_id: str) -> None:
        """Forget a stream (complete, failed, stopped); its late pieces are ignored."""
        st = self._streams.pop(request_id, None)
        if st is None:
            return
        if st.timer:
            st.timer.cancel()
        self._ended[request_id] = st.next_seq  # pieces below this are duplicates
        while len(self._ended) > REMEMBERED_IDS:
            self._ended.popitem(last=False)

    # --- what comes after the end

    def _start_dropping(self, request_id: str, why: str) -> _Dropping:
        """From now on, this stream's pieces are dropped and counted (its end was reported)."""
        d = self._dropping.get(request_id)
        if d is None:
            d = self._dropping[request_id] = _Dropping(why)
            self.gate.open(request_id)
            d.timer = self._call_later(SUMMARY_EVERY, lambda: self._summarize(request_id))
        return d

    def _drop(self, request_id: str, why: str) -> None:
        """A piece of a stream that takes none: the first is refused, the rest counted."""
        d = self._dropping.get(request_id)
        if d is not None:
            d.count += 1
            return
        self._start_dropping(request_id, why)
        raise RequestError(f"stream {request_id!r} {why}: this piece and the ones after it are "
                           "dropped (and reported as a count, not one by one); start a new "
                           "stream with a new id", request_id)

    def _summarize(self, request_id: str) -> None:
        """Report what was dropped since the last report; once nothing was, stop counting."""
        d = self._dropping.get(request_id)
        if d is None:
            return
        n = d.count + self.gate.take(request_id)
        d.count = 0
        if n == 0:
            del self._dropping[request_id]
            self.gate.close(request_id)
            return
        waited, d.every = d.every, min(2 * d.every, SUMMARY_MAX)
        d.timer = self._call_later(d.every, lambda: self._summarize(request_id))
        self._report(RequestError(
            f"stream {request_id!r} {d.why}: dropped {n} more piece{'s' * (n != 1)} of it in "
            f"the last {waited:g} s; start a new stream with a new id", request_id))

    def expire(self, request_id: str) -> None:
        """Nothing usable came within the timeout: end the stream with an error saying why."""
        st = self._streams.get(request_id)
        if st is None:
            return
        self.end(request_id)
        self._start_dropping(request_id, "timed out")
        why = (f"piece {st.next_seq} never arrived (have {min(st.pending)}..)" if st.pending
               else "no final piece")
        st.stream.fail(RequestError(
            f"stream {request_id!r}: nothing usable for {self.timeout:g} s "
            f"and {why} (mqtt.stream_timeout); seq starts at 0, and a piece with "
            "\"final\": true ends a stream", request_id))

    def close(self) -> None:
        """Cancel every pending timeout (shutting down)."""
        for st in self._streams.values():
            if st.timer:
                st.timer.cancel()
        for d in self._dropping.values():
            if d.timer:
                d.timer.cancel()

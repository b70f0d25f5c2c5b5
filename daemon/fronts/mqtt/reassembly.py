"""``say/stream`` reassembly: pieces that may arrive twice, late or out of order, put back in
``seq`` order and fed to their request's text stream.

Broker-free and clock-free on purpose: the caller hands in the submit function and a
``call_later`` (the event loop's, in the daemon), so every rule here (order, duplicates,
``mqtt.max_text`` across held pieces, the timeout) is tested with plain function calls.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ...request import Request, RequestError, StreamPiece, TextStream

log = logging.getLogger(__name__)

REMEMBERED_IDS = 2000


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


@dataclass(eq=False)
class _Stream:
    """A say/stream utterance being assembled: pieces are fed in ``seq`` order."""

    req: Request
    next_seq: int = 0
    pending: dict[int, tuple[str, bool]] = field(default_factory=dict)
    held: int = 0  # characters waiting in `pending` (each piece counts at least one)
    timer: Cancellable | None = None

    @property
    def stream(self) -> TextStream:
        assert self.req.stream is not None  # stream_request always sets one
        return self.req.stream


class Reassembly:
    """The ``say/stream`` utterances in progress, by request id."""

    def __init__(self, max_text: int, timeout: float, call_later: CallLater,
                 seen: RecentIds) -> None:
        self.max_text = max_text
        self.timeout = timeout
        self._call_later = call_later
        self._seen = seen
        self._streams: dict[str, _Stream] = {}
        self._ended: OrderedDict[str, int] = OrderedDict()  # ended stream -> its next seq

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
                raise RequestError(f"stream {piece.id!r} has already ended; start a new "
                                   "stream with a new id", piece.id)
            # Remember the id even if the first piece is refused, so the pieces after it
            # don't start the stream from the middle.
            self._seen.add(piece.id)
            req = open_request(piece)
            st = _Stream(req)
            self._streams[req.id] = st
            try:
                submit(req)
            except RequestError:
                del self._streams[req.id]
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
        if st.stream.total_chars + st.held + more <= self.max_text:
            return False
        self.end(st.req.id)
        st.stream.fail(RequestError(f"stream text exceeds {self.max_text} characters "
                                    "(mqtt.max_text); the rest is not spoken", st.req.id))
        return True

    def _feed(self, st: _Stream, text: str, final: bool) -> None:
        if self._too_long(st, len(text)):
            return
        st.req.text += text
        if final and not st.req.text.strip():
            self.end(st.req.id)
            st.stream.fail(RequestError("empty text: nothing to say", st.req.id))
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

    def expire(self, request_id: str) -> None:
        """Nothing usable came within the timeout: end the stream with an error saying why."""
        st = self._streams.get(request_id)
        if st is None:
            return
        self.end(request_id)
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

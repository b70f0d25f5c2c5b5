"""``say/stream`` reassembly as a unit: pieces in, the request's text out, with plain function
calls (no broker, no event loop; the timeout is a clock the test fires by hand)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from daemon.fronts.mqtt.reassembly import Reassembly, RecentIds
from daemon.request import Limits, Request, RequestError, parse_stream_piece, stream_request

LIMITS = Limits(100, ("mqtt",), lambda name: name or "voice", lambda voice, speaker: None)


class Timer:
    def __init__(self, delay: float, fn: Callable[[], None]) -> None:
        self.delay, self.fn, self.cancelled = delay, fn, False

    def cancel(self) -> None:
        self.cancelled = True


class Harness:
    def __init__(self, max_text: int = 100) -> None:
        self.timers: list[Timer] = []
        self.submitted: list[Request] = []
        self.seen = RecentIds()
        self.r = Reassembly(max_text, 5.0, self._later, self.seen)

    def _later(self, delay: float, fn: Callable[[], None]) -> Timer:
        self.timers.append(Timer(delay, fn))
        return self.timers[-1]

    def piece(self, **fields: object) -> None:
        self.r.take(parse_stream_piece(json.dumps(fields).encode()),
                    lambda p: stream_request(p, LIMITS), self.submitted.append)

    def text(self, i: int = 0) -> str:
        """All the text the i-th stream delivered, up to its end (raises its error)."""
        stream = self.submitted[i].stream
        assert stream is not None and stream.closed

        async def drain() -> str:
            out = ""
            while (part := await stream._take()) is not None:
                out += part
            return out
        return asyncio.run(drain())


def test_pieces_out_of_order_and_repeated_come_out_once_in_order() -> None:
    h = Harness()
    h.piece(id="s", seq=1, text="world. See")
    h.piece(id="s", seq=0, text="Hello ")
    h.piece(id="s", seq=1, text="world. See")  # duplicate
    h.piece(id="s", seq=2, text=" you.", final=True)
    h.piece(id="s", seq=2, text=" you.")  # late duplicate after the end: ignored
    assert len(h.submitted) == 1
    assert h.submitted[0].text == "Hello world. See you."
    assert h.text() == "Hello world. See you."


def test_a_stream_that_ended_cannot_restart_under_its_id() -> None:
    h = Harness()
    h.piece(id="s", seq=0, text="Hi.", final=True)
    with pytest.raises(RequestError, match="already ended"):
        h.piece(id="s", text="again")  # no seq: not a late duplicate


def test_held_pieces_count_towards_max_text() -> None:
    h = Harness(max_text=10)
    h.piece(id="s", seq=0, text="abc")
    for seq in range(2, 10):  # seq 1 never comes: held; the eighth is one too many
        h.piece(id="s", seq=seq, text="x")
    with pytest.raises(RequestError, match="exceeds 10 characters"):
        h.text()


def test_the_timeout_says_which_piece_is_missing_and_is_cancelled_at_the_end() -> None:
    h = Harness()
    h.piece(id="s", seq=0, text="Hello ")
    h.piece(id="s", seq=2, text="there.", final=True)
    assert [t.delay for t in h.timers] == [5.0, 5.0] and h.timers[0].cancelled
    h.timers[-1].fn()
    with pytest.raises(RequestError, match="piece 1 never arrived"):
        h.text()

    done = Harness()
    done.piece(id="d", seq=0, text="Done.", final=True)
    assert all(t.cancelled for t in done.timers)


def test_an_empty_final_text_is_an_error_not_silence() -> None:
    h = Harness()
    h.piece(id="s", seq=0, text="  ")
    h.piece(id="s", seq=1, text="", final=True)
    with pytest.raises(RequestError, match="empty text"):
        h.text()


def test_a_refused_first_piece_leaves_no_stream_behind_but_its_id_is_remembered() -> None:
    h = Harness()

    def refuse(req: Request) -> None:
        raise RequestError("queue full", req.id)
    with pytest.raises(RequestError, match="queue full"):
        h.r.take(parse_stream_piece(b'{"id": "s", "seq": 0, "text": "Hi"}'),
                 lambda p: stream_request(p, LIMITS), refuse)
    assert "s" in h.seen
    with pytest.raises(RequestError, match="already ended"):
        h.piece(id="s", seq=1, text="there.")

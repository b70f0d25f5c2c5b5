"""``say/stream`` reassembly as a unit: pieces in, the request's text out, with plain function
calls (no broker, no event loop; the timeout is a clock the test fires by hand)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from daemon.errors import RequestError
from daemon.jobs.request import Request
from daemon.mqtt.payload import Limits, parse_stream_piece, stream_request
from daemon.mqtt.reassembly import Reassembly, RecentIds

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
        self.reported: list[RequestError] = []
        self.r = Reassembly(max_text, 5.0, self._later, self.seen, self.reported.append)

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
    with pytest.raises(RequestError, match="empty 'text'"):
        h.text()


def test_a_refused_first_piece_leaves_no_stream_behind_but_its_id_is_remembered() -> None:
    h = Harness()

    def refuse(req: Request) -> None:
        raise RequestError("queue full", req.id)
    with pytest.raises(RequestError, match="queue full"):
        h.r.take(parse_stream_piece(b'{"id": "s", "seq": 0, "text": "Hi"}'),
                 lambda p: stream_request(p, LIMITS), refuse)
    assert "s" in h.seen
    h.piece(id="s", seq=1, text="there.")  # dropped: the refusal already said why
    assert not h.submitted and "s" in h.r.gate


def fire(h: Harness) -> float:
    """Run the pending drop-summary timer (a clock, by hand); returns its delay."""
    due = [t for t in h.timers if not t.cancelled and t.fn.__qualname__.split(".")[1] in
           ("_start_dropping", "_summarize")]
    assert len(due) == 1, due
    due[0].cancelled = True
    due[0].fn()
    return due[0].delay


def test_a_flood_after_a_refusal_is_dropped_and_summarized_not_answered_piece_by_piece() -> None:
    h = Harness(max_text=10)
    h.piece(id="f", seq=0, text="abcdefgh")
    h.piece(id="f", seq=1, text="ijk")  # one too many: the stream is refused here
    with pytest.raises(RequestError, match="exceeds 10 characters"):
        h.text()
    # Pieces already on their way reach the reassembly: dropped and counted, no error each.
    for seq in range(2, 5):
        h.piece(id="f", seq=seq, text="more")
    # The rest never gets that far: the network thread's gate takes them.
    gate = h.r.gate
    assert all(gate.drop(json.dumps({"id": "f", "seq": s, "text": "x"}).encode())
               for s in range(5, 1005))
    assert not gate.drop(b'{"id": "other", "seq": 0, "text": "x"}')
    assert not gate.drop(b"not json")
    assert not h.reported
    assert fire(h) == 5.0
    assert len(h.reported) == 1 and h.reported[0].id == "f"
    assert "dropped 1003 more pieces of it in the last 5 s" in str(h.reported[0])
    assert "longer than 10 characters" in str(h.reported[0])
    # While pieces keep coming, each report waits twice as long as the one before.
    waits = []
    for _ in range(6):
        gate.drop(b'{"id": "f", "seq": 5000, "text": "x"}')
        waits.append(fire(h))
    assert waits == [10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
    assert len(h.reported) == 7 and "in the last 60 s" in str(h.reported[-1])
    fire(h)  # a quiet interval: nothing to report, and the gate closes
    assert len(h.reported) == 7 and "f" not in gate
    assert not gate.drop(b'{"id": "f", "seq": 9999, "text": "x"}')
    # A new burst of the same id: the first piece is refused again, the rest counted.
    with pytest.raises(RequestError, match="dropped"):
        h.piece(id="f", seq=9999, text="x")
    h.piece(id="f", seq=10000, text="x")
    assert fire(h) == 5.0
    assert "dropped 1 more piece of it" in str(h.reported[-1])
    assert len(h.submitted) == 1


def test_a_stream_that_ended_takes_no_more_pieces_and_says_so_once() -> None:
    h = Harness()
    h.piece(id="s", seq=0, text="Hi.", final=True)
    with pytest.raises(RequestError, match="has already ended"):
        h.piece(id="s", seq=1, text="again")
    for seq in range(2, 50):
        h.piece(id="s", seq=seq, text="again")  # no error each
    fire(h)
    assert [str(e).count("dropped 48 more") for e in h.reported] == [1]


def test_empty_pieces_count_towards_max_text_too() -> None:
    h = Harness(max_text=10)
    for seq in range(11):  # in order, each fed at once: the eleventh is one too many
        h.piece(id="e", seq=seq, text="")
    with pytest.raises(RequestError, match="exceeds 10 characters"):
        h.text()

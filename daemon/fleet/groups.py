"""A member's side of its announcement groups (``fleet.groups``): the group's commands and
events on the fleet topics.

* ``F/group/<g>/say`` comes through the share group ``$share/<share_group>-<g>/...``: one
  member takes each announcement and owns it (``Pool.announce``): synthesized once, streamed
  once to ``F/group/<g>/audio``, played by every member from the same moment.
* ``F/group/<g>/say/stream`` comes through the share group too, but the broker deals out its
  pieces one by one, to any member. A group's stream needs ``seq``: the member that gets
  piece 0 owns the stream; a member that gets a later piece of a stream it does not own
  relays it on ``F/group/<g>/stream/<id>``, which every member hears, and the owner puts the
  pieces back in order (``daemon.mqtt.reassembly``), keeping those relayed before its
  piece 0 came.
* ``F/group/<g>/stop`` reaches every member: each cuts the group's announcement, and its
  owner cancels the job.
* ``F/group/<g>/event``: the owner's events for the announcement (``queued``, ``started``
  and ``finished`` of the job, ``stopped``, ``error``, ``resumed``); a member whose owner
  reports an error or a stop ends its playback with it.

Retained commands are refused here as on the device's own topics (``retained``).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, get_args

from ..errors import Code, RequestError
from ..jobs.metrics import Timeline
from ..jobs.request import Request
from ..mqtt.payload import Limits, parse_say, parse_stream_piece, stream_request
from ..mqtt.reassembly import Cancellable, Reassembly, RecentIds
from ..mqtt.retained import RetainedRefusals, refusal
from ..mqtt.stop import stop_target
from ..settings import Settings
from .link import FleetLink
from .pool import Pool
from .receiver import Receiver
from .topics import FleetTopics

log = logging.getLogger(__name__)

Handle = Callable[[str, str, bytes], None]  # group, topic, payload
HELD_STREAMS = 64  # streams whose relayed pieces a member keeps, not knowing their owner yet
HELD_PIECES = 256  # ... and pieces of each


class Groups:
    name = "fleet groups"

    def __init__(self, link: FleetLink, settings: Settings, pool: Pool, receiver: Receiver,
                 limits: Callable[[], Limits],
                 call_later: Callable[[float, Callable[[], None]], Cancellable]) -> None:
        self.link = link
        self.topics: FleetTopics = link.topics
        self.groups = list(settings.fleet.groups)
        self.pool = pool
        self.receiver = receiver
        self.limits = limits
        self.seen = RecentIds()
        self._retained = RetainedRefusals()
        self._streams = {g: Reassembly(settings.mqtt.max_text, settings.mqtt.stream_timeout,
                                       call_later, self.seen, self._reporter(g))
                         for g in self.groups}
        self._owned: set[str] = set()  # group streams this member owns (got piece 0)
        self._held: OrderedDict[str, list[bytes]] = OrderedDict()  # relayed, owner unknown

    def attach(self, link: FleetLink) -> None:
        t = self.topics
        for g in self.groups:
            for filter_, handle in ((t.group_say_shared(g), self._on_say),
                                    (t.group_say_stream_shared(g), self._on_stream),
                                    (t.group_stop(g), self._on_stop)):
                link.subscribe(filter_, self._command(g, handle))
            link.subscribe(t.group_event(g), self._for(g, self._on_event))
            link.subscribe(t.group_relay(g), self._for(g, self._on_relayed))

    async def start(self) -> None:
        if self.groups:
            log.info("fleet: member of group(s) %s", ", ".join(self.groups))

    async def stop(self) -> None:
        for streams in self._streams.values():
            streams.close()

    # ------------------------------------------------------------------ dispatch

    def _for(self, group: str, handle: Handle) -> Callable[[str, bytes], None]:
        return lambda topic, payload: handle(group, topic, payload)

    def _command(self, group: str, handle: Handle) -> Callable[[str, bytes], None]:
        """A command: refused when retained, its error reported on the group's events."""
        def run(topic: str, payload: bytes) -> None:
            if self.link.retained:
                if self._retained.first(topic, payload):
                    self.error(group, topic, RequestError(refusal(topic)))
                return
            try:
                handle(group, topic, payload)
            except RequestError as e:
                self.error(group, topic, e)
        return run

    def event(self, group: str, ev: dict[str, Any]) -> None:
        """One of the owner's events for the group's announcement."""
        self.link.publish(self.topics.group_event(group), json.dumps(ev))

    def error(self, group: str, topic: str, e: RequestError) -> None:
        log.warning("fleet %s: %s", topic, e)
        ev: dict[str, Any] = {"event": "error"}
        if e.id is not None:
            ev["id"] = e.id
        ev.update(error=str(e), code=e.code, topic=topic)
        self.event(group, ev)

    def _reporter(self, group: str) -> Callable[[RequestError], None]:
        return lambda e: self.error(group, self.topics.group_say_stream(group), e)

    # ------------------------------------------------------------------ say

    def _on_say(self, group: str, topic: str, payload: bytes) -> None:
        req = parse_say(payload, self.limits(), "mqtt", Timeline())
        if req.id in self.seen:
            raise RequestError(f"duplicate request id {req.id!r}: already received, not "
                               "spoken twice", req.id)
        self._announce(req, group)
        self.seen.add(req.id)

    def _announce(self, req: Request, group: str) -> None:
        log.info("fleet: announcement %s to group %s (%d chars, voice %s)", req.id, group,
                 len(req.text), req.voice)
        self.pool.announce(req, group, lambda ev: self.event(group, ev))

    # ------------------------------------------------------------------ say/stream

    def _on_stream(self, group: str, topic: str, payload: bytes) -> None:
        piece = parse_stream_piece(payload)
        if piece.id in self._owned:
            self._take(group, payload)
        elif piece.seq == 0:
            self._owned.add(piece.id)
            self._take(group, payload)
            for payload in self._held.pop(piece.id, []):
                self._take(group, payload)
        elif piece.seq is None:
            raise RequestError("a group's say/stream needs seq (0, 1, ...): the member that "
                               "gets piece 0 speaks it", piece.id)
        else:
            self.link.publish(self.topics.group_relay(group, piece.id), payload)

    def _on_relayed(self, group: str, topic: str, payload: bytes) -> None:
        rid = self.topics.relayed_stream(group, topic)
        if rid is None:
            return
        if rid in self._owned:
            try:
                self._take(group, payload)
            except RequestError as e:
                self.error(group, self.topics.group_say_stream(group), e)
            return
        held = self._held.setdefault(rid, [])
        self._held.move_to_end(rid)
        if len(held) < HELD_PIECES:
            held.append(payload)
        while len(self._held) > HELD_STREAMS:
            self._held.popitem(last=False)

    def _take(self, group: str, payload: bytes) -> None:
        piece = parse_stream_piece(payload)
        self._streams[group].take(
            piece, lambda p: stream_request(p, self.limits(), "mqtt", Timeline()),
            lambda req: self._announce(req, group))

    def on_end(self, rid: str) -> None:
        """An announcement ended (its job is done or given up): its stream takes no more."""
        if rid in self._owned:
            self._owned.discard(rid)
            for streams in self._streams.values():
                streams.end(rid)

    # ------------------------------------------------------------------ stop, events

    def _on_stop(self, group: str, topic: str, payload: bytes) -> None:
        rid = stop_target(payload)
        owned = self.pool.stop_announcements(group, rid)
        cut = [j for j in self.receiver.jobs_of(group) if rid in (None, j)]
        for job in cut:
            self.receiver.cut(job)
        log.info("fleet: group %s stop: %s", group, ", ".join(sorted({*owned, *cut}))
                 or "nothing was playing")

    def _on_event(self, group: str, topic: str, payload: bytes) -> None:
        try:
            ev = json.loads(payload)
        except ValueError:
            return
        if not isinstance(ev, dict) or not isinstance(ev.get("id"), str):
            return
        rid, kind = ev["id"], ev.get("event")
        if kind == "stopped":
            self.receiver.cut(rid)
        elif kind == "error":
            code = ev.get("code")
            self.receiver.end(rid, RequestError(
                str(ev.get("error", "the announcement failed")), rid,
                code if code in get_args(Code) else "unavailable"))
        if kind in ("finished", "stopped", "error"):
            self.on_end(rid)

"""herald's own MQTT commands: ``say``, ``say/stream``, ``stop``, ``set/volume`` and
``set/voice`` under the base topic.

``say/stream`` comes on a connection of its own, and ``stop`` on both (see ``front``).
The main connection's copy of a ``stop`` comes at once, even during a flood of pieces, and
stops what is queued or playing. The stream connection's copy comes in order with the
pieces: it stops the streams whose first piece was published before the stop but was still
queued behind others when the first copy came, and spares a stream started after the stop
(whose pieces come after it). An ``{"id"}`` that neither copy finds gets its error event
once both have come (or at once, while the stream connection is down): until then it may be
a stream whose first piece is on its way.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from typing import Any

from tts import VoiceError

from ...errors import RequestError
from ...jobs.fields import parse_json
from ...jobs.request import Request
from ...jobs.scheduler import TERMINAL
from ...mqtt.payload import decode_text, parse_say, parse_stream_piece, stream_request
from ...mqtt.reassembly import Cancellable, Reassembly
from ...mqtt.stop import stop_target
from .extension import Extension, Front, Message, Route

log = logging.getLogger(__name__)

_UNRESOLVED_MAX = 256  # stops whose other copy is still to come


class Commands(Extension):
    name = "commands"

    def __init__(self, front: Front) -> None:
        super().__init__(front)
        topics = front.topics
        self.streams = Reassembly(front.settings.max_text, front.settings.stream_timeout,
                                  self._call_later, front.seen,
                                  lambda e: front.error(topics.say_stream, str(e), e.id, e.code))
        self._streaming: set[str] = set()  # say/stream requests not yet ended
        # A stop of an id whose other copy is still to come: which copy ("main", "stream")
        # found nothing and waits for it (see the module docstring), or "stopped": the main
        # copy stopped it, and the stream's has nothing to add.
        self._unresolved: OrderedDict[str, str] = OrderedDict()
        self._routes = {topics.say: Route(self._on_say),
                        topics.say_stream: Route(self._on_stream),
                        topics.stop: Route(self._on_stop),
                        topics.set_volume: Route(self._on_volume),
                        topics.set_voice: Route(self._on_voice)}

    def _call_later(self, delay: float, fn: Any) -> Cancellable:
        return self.front.loop.call_later(delay, fn)

    def stop(self) -> None:
        self.streams.close()

    def subscriptions(self) -> list[str]:
        return self.front.topics.commands()

    def stream_subscriptions(self) -> list[str]:
        return self.front.topics.stream_commands()

    def route(self, topic: str) -> Route | None:
        return self._routes.get(topic)

    def drop(self, topic: str, payload: bytes) -> bool:
        return topic == self.front.topics.say_stream and self.streams.gate.drop(payload)

    def on_event(self, ev: dict[str, Any]) -> None:
        if ev["event"] in TERMINAL:
            self.streams.end(ev["id"])
            self._streaming.discard(ev["id"])

    def _on_say(self, msg: Message) -> None:
        front = self.front
        req = parse_say(msg.payload, front.limits(), front.name, msg.timeline)
        if req.id in front.seen:
            raise RequestError(f"duplicate request id {req.id!r}: already received, not "
                               "spoken twice", req.id)
        front.scheduler_for(req.id).submit(req)
        front.seen.add(req.id)  # only once accepted: a refused request may be sent again

    def _on_stream(self, msg: Message) -> None:
        front = self.front
        piece = parse_stream_piece(msg.payload)
        self.streams.take(
            piece, lambda p: stream_request(p, front.limits(), front.name, msg.timeline),
            self._submit_stream)

    def _submit_stream(self, req: Request) -> None:
        self.front.scheduler_for(req.id).submit(req)
        self._streaming.add(req.id)

    def _on_stop(self, msg: Message) -> None:
        if msg.via_stream:
            self._on_stop_in_order(msg)
            return
        request_id = stop_target(msg.payload)
        scheduler = self.front.scheduler_for()
        if request_id is None:
            stopped = scheduler.stop()
            log.info("MQTT stop: stopped %s", ", ".join(stopped) or "nothing (idle)")
            return
        try:
            scheduler.stop(request_id)
        except RequestError:
            if self._unresolved.pop(request_id, None) == "stream" or (
                    not self.front.stream_connected):
                raise
            log.info("MQTT stop: nothing has id %s yet; a say/stream of it may still be on "
                     "its way, so the stop's copy on the stream connection decides", request_id)
            self._wait_for_other_copy(request_id, "main")
        else:
            if self._unresolved.pop(request_id, None) is None and self.front.stream_connected:
                self._wait_for_other_copy(request_id, "stopped")

    def _on_stop_in_order(self, msg: Message) -> None:
        """The stream connection's copy of a stop (see the module docstring). A bad payload
        or a missing scheduler is reported for the main connection's copy."""
        try:
            request_id = stop_target(msg.payload)
            scheduler = self.front.scheduler_for()
        except RequestError:
            return
        waiting = None if request_id is None else self._unresolved.pop(request_id, None)
        if waiting == "main":
            assert request_id is not None
            scheduler.stop(request_id)  # if nothing has that id after all, the error says so
            return
        if waiting == "stopped":
            return
        if request_id is not None and request_id not in self._streaming:
            self._wait_for_other_copy(request_id, "stream")
            return
        for rid in [request_id] if request_id is not None else sorted(self._streaming):
            try:
                scheduler.stop(rid)
            except RequestError:  # it ended meanwhile
                continue
            log.debug("MQTT stop: stopped stream %s (in order with its pieces)", rid)

    def _wait_for_other_copy(self, request_id: str, copy: str) -> None:
        self._unresolved[request_id] = copy
        while len(self._unresolved) > _UNRESOLVED_MAX:
            self._unresolved.popitem(last=False)

    def _on_volume(self, msg: Message) -> None:
        payload = msg.payload
        text = decode_text(payload[:64]).strip() if len(payload) <= 64 else None
        try:
            value = float(json.loads(text)) if text else math.nan
        except (ValueError, TypeError):
            value = math.nan
        if not 0.0 <= value <= 1.0:
            shown = repr(text) if text is not None else f"{len(payload)} bytes"
            raise RequestError(f"volume must be a number from 0 to 1 (got {shown})")
        log.info("MQTT: volume set to %.2f", value)
        self.front.ctx.state.set_volume(value)  # the speaker and the status follow

    def _on_voice(self, msg: Message) -> None:
        ctx = self.front.ctx
        text = decode_text(msg.payload).strip()
        if text.startswith("{") or text.startswith('"'):
            data = parse_json(text)
            name = data.get("voice") if isinstance(data, dict) else data
            if not isinstance(name, str):
                raise RequestError("set/voice takes a voice name, or {\"voice\": \"NAME\"}")
            text = name.strip()
        if not text:
            raise RequestError("empty voice name; installed: " + ", ".join(
                ctx.voice_list.voice_names()))
        try:
            voice = self.front.resolve_voice(text)
        except VoiceError as e:
            raise RequestError(str(e)) from None
        log.info("MQTT: default voice set to %s", voice)
        ctx.state.set_voice(voice)  # the status follows
        if ctx.model is not None:  # a satellite's workers load their voices themselves
            self.front.spawn(self._preload(voice))

    async def _preload(self, voice: str) -> None:
        try:
            await self.front.ctx.engine.preload(voice)
        except Exception as e:
            log.error("could not load voice %s: %s", voice, e)


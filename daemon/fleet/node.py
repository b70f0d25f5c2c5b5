"""One herald's place in the fleet, built from ``node.role`` and ``[fleet]``: the fleet
connection and presence (``link``), the view of the other nodes (``voices``), and the parts
its role needs: the pool of the jobs it owns and the player of the audio addressed to it
(``pool``, ``receiver``) when it has a speaker, and its announcement groups (``groups``).

It starts and stops as one part of the service; each part inside it answers for its own
topics on the one connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..fronts.mqtt.discovery import group_discovery_payload, group_discovery_topic
from ..request import Limits
from ..settings import Settings
from .groups import Groups
from .link import FleetLink
from .messages import Presence, VoiceInfo
from .pool import Pool
from .receiver import Receiver
from .topics import FleetTopics
from .voices import FleetVoices

if TYPE_CHECKING:
    from ..context import Context
    from ..fronts.mqtt import MqttFront

log = logging.getLogger(__name__)


class FleetNode:
    """Made before the rest (a satellite's fronts resolve voices with ``voices``), wired to
    them with ``attach``, then started."""

    name = "fleet"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = FleetTopics.from_settings(settings)
        self.voices = FleetVoices(self.topics, settings.voices.default)
        # What this node offers to synthesize (a worker's part fills these in).
        self.offered: Callable[[], list[VoiceInfo]] = list
        self.slots: Callable[[], int] = lambda: 0
        self.link = FleetLink(settings, self.topics, self.presence)
        self.voices.attach(self.link)
        self.front: MqttFront | None = None
        self.groups: Groups | None = None

    def attach(self, ctx: Context, front: MqttFront | None) -> None:
        """Wire the parts this node's role needs to the service's context and MQTT front."""
        settings = self.settings
        self.ctx = ctx
        self.front = front
        plays = settings.node.plays and ctx.scheduler.speaker is not None
        self.receiver = Receiver(self.topics, settings.fleet,
                                 ctx.scheduler if settings.node.plays else None)
        self.receiver.attach(self.link)
        self.pool = Pool(self.link, settings, self.voices, self.receiver, lambda: ctx.synthesis,
                         self._device_event)
        if settings.node.plays and settings.fleet.groups:
            if not plays:
                log.warning("fleet: this node plays group(s) %s, but its speaker is off or "
                            "failed: it takes their announcements and plays none",
                            ", ".join(settings.fleet.groups))
            self.groups = Groups(self.link, settings, self.pool, self.receiver,
                                 self._group_limits, self._call_later)
            self.groups.attach(self.link)
        if front is not None:
            front.discovery_extra = self._discovery
            self.voices.add_listener(front.publish_discovery)
        if not settings.node.synthesizes:
            ctx.scheduler.make_source = self.pool.source

    def presence(self) -> Presence:
        s = self.settings
        return Presence(state="online", role=s.node.role, version=__version__,
                        voices=self.offered(), slots=self.slots(),
                        groups=list(s.fleet.groups) if self.groups is not None else [])

    async def start(self) -> None:
        await self.receiver.start()
        if self.groups is not None:
            await self.groups.start()
        await self.link.start()

    async def stop(self) -> None:
        await self.pool.stop()
        if self.groups is not None:
            await self.groups.stop()
        await self.receiver.stop()
        await self.link.stop()

    # ------------------------------------------------------------------ what the parts need

    def _device_event(self, ev: dict[str, Any]) -> None:
        if self.front is not None:
            self.front.publish_event(ev)

    def _group_limits(self) -> Limits:
        """A group announcement's limits: the device's, but a request naming no voice gets
        the fleet's default voice, not this member's ``set/voice``."""
        mqtt = self.settings.mqtt
        voices = self.ctx.voice_list
        return Limits(mqtt.max_text, ("speaker",), lambda name: voices.resolve_voice(name),
                      voices.check_speaker, mqtt.max_age)

    def _call_later(self, delay: float, fn: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, fn)

    def _discovery(self) -> list[tuple[str, dict[str, Any]]]:
        """Home Assistant's notify entity of each group, the same from every member."""
        if self.groups is None or self.front is None:
            return []
        prefix = self.settings.mqtt.discovery.prefix
        out = []
        for g in self.groups.groups:
            members = set(self.voices.members(g)) | {self.settings.device_id}
            payload = group_discovery_payload(g, self.topics.group_say(g),
                                              [self.topics.node(m) for m in members])
            out.append((group_discovery_topic(prefix, g), payload))
        return out

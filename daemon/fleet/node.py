"""One herald's place in the fleet, built from ``node.role`` and ``[fleet]``: the fleet
connection and presence (``link``), the view of the other nodes (``voices``), and the parts
its role needs: the worker (``worker``) where there is a model; the pool of the jobs it owns
and the player of the audio addressed to it (``pool``, ``receiver``) where there is a
speaker; and its announcement groups (``groups``).

The service starts each part in its own error boundary (``parts``), the connection last, so
every part has subscribed by the time the first message comes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .. import __version__
from ..mqtt.discovery import group_discovery_payload, group_discovery_topic
from ..mqtt.payload import Limits
from ..settings import Settings
from .groups import Groups
from .link import FleetLink
from .pool import Pool
from .receiver import Receiver
from .voices import FleetVoices

if TYPE_CHECKING:
    from ..context import Context
    from ..service import Part

log = logging.getLogger(__name__)


class DeviceFront(Protocol):
    """What the node uses of the device's MQTT front: it shows the node's announcement groups
    to Home Assistant beside the device, and the pool's events about the device's own
    requests on the device's event topic."""

    # More discovery messages (topic, payload) the front publishes with the device's own.
    discovery_extra: Callable[[], list[tuple[str, dict[str, Any]]]]

    def publish_discovery(self) -> None:
        """Publish the discovery messages again (the groups' members changed)."""

    def publish_event(self, payload: dict[str, Any]) -> None:
        """One event on the device's event topic."""


class FleetNode:
    """Made before the rest (a satellite resolves its requests' voices with ``voices``),
    wired to them with ``attach``, then started part by part."""

    name = "fleet"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.link = FleetLink(settings, __version__)
        self.topics = self.link.topics
        self.voices = FleetVoices(self.topics, settings.voices.default)
        self.voices.attach(self.link)
        self.front: DeviceFront | None = None
        self.groups: Groups | None = None
        self._parts: list[Part] = []

    def attach(self, ctx: Context, front: DeviceFront | None) -> None:
        """Wire the parts this node's role needs to the service's context and MQTT front."""
        settings = self.settings
        self.ctx = ctx
        self.front = front
        scheduler = ctx.scheduler
        if settings.node.synthesizes:
            from .worker import Worker

            self._parts.append(Worker(settings, self.link, ctx, scheduler))
        if not settings.node.plays:
            self._parts.append(self.link)
            return
        receiver = Receiver(self.topics, settings.fleet, scheduler)
        receiver.attach(self.link)
        self.pool = Pool(self.link, settings, self.voices, receiver, lambda: ctx.synthesis,
                         self._device_event)
        self._parts += [receiver, self.pool]
        if settings.fleet.groups:
            if scheduler.speaker is None:
                log.warning("fleet: this node plays group(s) %s, but its speaker is off or "
                            "failed: it takes their announcements and plays none",
                            ", ".join(settings.fleet.groups))
            self.groups = Groups(self.link, settings, self.pool, receiver,
                                 self._group_limits, self._call_later)
            self.groups.attach(self.link)
            self._parts.append(self.groups)
        if front is not None:
            front.discovery_extra = self._discovery
            self.voices.add_listener(front.publish_discovery)
        if not settings.node.synthesizes:
            scheduler.make_source = self.pool.source
        self._parts.append(self.link)

    def parts(self) -> list[Part]:
        """What to start, in order (and to stop in the reverse order)."""
        return list(self._parts)

    # ------------------------------------------------------------------ what the parts need

    def _device_event(self, ev: dict[str, Any]) -> None:
        if self.front is not None:
            self.front.publish_event(ev)

    def _group_limits(self) -> Limits:
        """A group announcement's limits: the device's, but its voice is one the fleet's
        workers offer (the fleet's default if it names none, not this member's
        ``set/voice``), whatever this node has itself."""
        mqtt = self.settings.mqtt
        voices = self.voices
        return Limits(mqtt.max_text, ("speaker",), lambda name: voices.resolve_voice(name),
                      voices.check_speaker, mqtt.max_age)

    def _call_later(self, delay: float, fn: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, fn)

    def _discovery(self) -> list[tuple[str, dict[str, Any]]]:
        """Home Assistant's notify entity of each group, the same from every member."""
        if self.groups is None:
            return []
        prefix = self.settings.mqtt.discovery.prefix
        out = []
        for g in self.groups.groups:
            members = set(self.voices.members(g)) | {self.settings.device_id}
            payload = group_discovery_payload(g, self.topics.group_say(g),
                                              [self.topics.node(m) for m in members])
            out.append((group_discovery_topic(prefix, g), payload))
        return out

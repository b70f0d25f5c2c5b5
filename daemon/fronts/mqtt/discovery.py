"""The MQTT front's Home Assistant discovery: herald's device message (built in
``daemon.mqtt.discovery``) published on every connect, with whatever more the front was
given to publish beside it (a fleet member's announcement groups).
"""

from __future__ import annotations

import json
import logging

from ...mqtt.discovery import discovery_payload
from ...mqtt.topics import AVAILABILITY_ONLINE
from .extension import Extension, Message, Route

log = logging.getLogger(__name__)


class Discovery(Extension):
    """Publishes the discovery message on every connect, and again whenever Home Assistant
    says it is back online (it forgets retained discovery only if the broker lost it)."""

    name = "discovery"

    def subscriptions(self) -> list[str]:
        return [self.front.topics.ha_status]

    def route(self, topic: str) -> Route | None:
        if topic == self.front.topics.ha_status:
            return Route(self._on_ha_status, retained_ok=True)
        return None

    def connected(self) -> None:
        self.publish()

    def publish(self) -> None:
        front = self.front
        # A satellite lists the voices its fleet's online workers offer: none while no
        # worker is online, when the select still shows the device's default.
        voices = front.ctx.voice_list.voice_names() or [front.ctx.state.voice]
        payload = discovery_payload(front.topics, front.ctx.version, voices)
        front.publish(front.topics.discovery, json.dumps(payload), 1, True)
        for topic, extra in front.discovery_extra():
            front.publish(topic, json.dumps(extra), 1, True)

    def _on_ha_status(self, msg: Message) -> None:
        if msg.payload.strip() == b"online":
            log.info("MQTT: Home Assistant is online: republishing discovery")
            self.front.publish(self.front.topics.availability, AVAILABILITY_ONLINE, 1, True)
            self.front.publish_status()
            self.publish()

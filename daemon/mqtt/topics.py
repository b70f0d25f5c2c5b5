"""Every MQTT topic herald uses, in one place: the base topic, the names under it, the last
will, and the refusal to publish anywhere a wildcard could end up.

A wildcard in a *publish* topic is a protocol error that brokers answer by disconnecting the
client; in a device id or a request id it would silently turn a topic into a subscription
pattern for someone else. Both are refused here, before anything reaches the broker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import HeraldError

AVAILABILITY_ONLINE = "online"
AVAILABILITY_OFFLINE = "offline"

# Request ids become one topic level of the audio topics.
_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class TopicError(HeraldError, ValueError):
    """A topic (or a piece of one) that herald refuses to publish to."""


def check_publish_topic(topic: str) -> str:
    """Return ``topic`` if it is a valid, wildcard-free publish topic; raise otherwise."""
    if not topic:
        raise TopicError("empty MQTT topic")
    if "+" in topic or "#" in topic:
        raise TopicError(f"refusing to publish to {topic!r}: '+' and '#' are wildcards, "
                         "not allowed in a publish topic")
    if "\x00" in topic:
        raise TopicError(f"refusing to publish to {topic!r}: NUL character")
    if len(topic.encode()) > 65535:
        raise TopicError("MQTT topic longer than 65535 bytes")
    return topic


def check_level(value: str, what: str) -> str:
    """One topic level (device id, request id): no wildcards, no '/', not empty."""
    if not value or any(c in value for c in "+#/\x00"):
        raise TopicError(f"{what} {value!r} cannot be part of an MQTT topic: it must be "
                         "non-empty and contain no '+', '#' or '/'")
    return value


def check_request_id(value: str) -> str:
    if not _ID_RE.match(value):
        shown = repr(value) if len(value) <= 64 else f"of {len(value)} characters"
        raise TopicError(f"id {shown} is not usable: use 1-64 letters, digits, '_', '-', "
                         "'.' or ':' (it becomes part of the audio topics)")
    return value


@dataclass(frozen=True)
class Topics:
    """The topic names for one herald device (base topic ``herald/<device_id>`` by default)."""

    base: str
    device_id: str
    discovery_prefix: str = "homeassistant"

    def __post_init__(self) -> None:
        check_level(self.device_id, "device_id")
        check_publish_topic(self.base)
        check_publish_topic(self.discovery_prefix)

    def _t(self, suffix: str) -> str:
        return f"{self.base}/{suffix}"

    # out
    @property
    def availability(self) -> str:
        return self._t("availability")

    @property
    def status(self) -> str:
        return self._t("status")

    @property
    def event(self) -> str:
        return self._t("event")

    @property
    def latency(self) -> str:
        return self._t("latency")

    def audio_start(self, request_id: str) -> str:
        return self._t(f"audio/{check_level(request_id, 'request id')}/start")

    def audio_chunk(self, request_id: str, seq: int) -> str:
        return self._t(f"audio/{check_level(request_id, 'request id')}/chunk/{seq}")

    def audio_stop(self, request_id: str) -> str:
        return self._t(f"audio/{check_level(request_id, 'request id')}/stop")

    # in
    @property
    def say(self) -> str:
        return self._t("say")

    @property
    def say_stream(self) -> str:
        return self._t("say/stream")

    @property
    def stop(self) -> str:
        return self._t("stop")

    @property
    def set_volume(self) -> str:
        return self._t("set/volume")

    @property
    def set_voice(self) -> str:
        return self._t("set/voice")

    def commands(self) -> list[str]:
        """Topics herald's main connection subscribes to for commands (QoS 1, never
        retained)."""
        return [self.say, self.stop, self.set_volume, self.set_voice]

    def stream_commands(self) -> list[str]:
        """Topics herald's say/stream connection subscribes to: the stream pieces, so that a
        flood of them queues apart from the other commands, and ``stop`` once more, which
        there arrives in order with the pieces."""
        return [self.say_stream, self.stop]

    # Home Assistant
    @property
    def ha_status(self) -> str:
        return f"{self.discovery_prefix}/status"

    @property
    def discovery(self) -> str:
        return f"{self.discovery_prefix}/device/{self.device_id}/config"

    # Hermes (Rhasspy) compatibility
    HERMES_SAY = "hermes/tts/say"
    HERMES_SAY_FINISHED = "hermes/tts/sayFinished"

    @staticmethod
    def hermes_play_bytes(site_id: str) -> str:
        """What we subscribe to: WAV files for this site, the request id as the last level."""
        return f"hermes/audioServer/{check_level(site_id, 'mqtt.hermes.site_id')}/playBytes/+"

    @staticmethod
    def hermes_play_bytes_id(topic: str, site_id: str) -> str | None:
        """The request id of a ``playBytes`` topic for ``site_id``; None for any other topic."""
        prefix = f"hermes/audioServer/{site_id}/playBytes/"
        rest = topic.removeprefix(prefix)
        return rest if rest != topic and rest and "/" not in rest else None

    @staticmethod
    def hermes_play_finished(site_id: str) -> str:
        return f"hermes/audioServer/{check_level(site_id, 'mqtt.hermes.site_id')}/playFinished"

    def will(self) -> tuple[str, str, int, bool]:
        """(topic, payload, qos, retain) of the last will: the broker marks us offline."""
        return self.availability, AVAILABILITY_OFFLINE, 1, True

"""What a feature of the MQTT front looks like to the front that runs it, and what it may use
of that front.

As in zigbee2mqtt, each feature (commands, Home Assistant discovery, Hermes) is an extension:
it names the topics it takes, handles their messages on the event loop, hears the
scheduler's events, and is started and stopped by the front, each inside its own error
boundary, so one that fails is logged and the rest keep serving. An extension reaches the
front only through ``Front``, so what the extensions share of it is written in one place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ...jobs.metrics import Timeline

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

    from ...context import Context
    from ...errors import Code
    from ...jobs.scheduler import Scheduler
    from ...mqtt.payload import Limits
    from ...mqtt.reassembly import RecentIds
    from ...mqtt.topics import Topics
    from ...settings import MqttSettings


@dataclass(frozen=True)
class Message:
    """One message as paho delivered it, stamped with its arrival in paho's thread.
    ``via_stream``: it came on the say/stream connection (see ``front``)."""

    topic: str
    payload: bytes
    retained: bool
    timeline: Timeline
    via_stream: bool = False


@dataclass(frozen=True)
class Route:
    """Who handles a topic. Commands refuse a retained message (it would be spoken again on
    every reconnect); status-like topics (``homeassistant/status``, Hermes) take it."""

    handle: Callable[[Message], None]
    retained_ok: bool = False


class Front(Protocol):
    """What an extension may use of the MQTT front (``front.MqttFront``)."""

    @property
    def name(self) -> str:
        """The front's name, which its requests carry and its metrics are counted under."""

    @property
    def settings(self) -> MqttSettings:
        """The ``[mqtt]`` section: the limits of a request, Hermes' site."""

    @property
    def ctx(self) -> Context:
        """What every front shares: the voice list, the device state, the model (``model``
        is None on a satellite, whose fleet workers load their voices themselves), the
        version."""

    @property
    def topics(self) -> Topics:
        """The device's topic names."""

    @property
    def seen(self) -> RecentIds:
        """The request ids taken on any topic of the front, so none is spoken twice. An id is
        added only once its request is accepted: a refused request may be sent again."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the handlers run on (for timers)."""

    @property
    def stream_connected(self) -> bool:
        """Whether the say/stream connection is up: while it is not, no copy of a ``stop``
        will come on it."""

    @property
    def discovery_extra(self) -> Callable[[], list[tuple[str, dict[str, Any]]]]:
        """More discovery messages (topic, payload) to publish with the device's own (a fleet
        member's announcement groups)."""

    def publish(self, topic: str, payload: bytes | str, qos: int = 1,
                retain: bool = False) -> mqtt.MQTTMessageInfo | None:
        """Publish from any thread on the main connection; None while it is not open."""

    def publish_status(self) -> None:
        """Publish the retained device status again."""

    def error(self, topic: str, message: str, request_id: str | None = None,
              code: Code = "bad-request") -> None:
        """Log and count a refused message, and answer it with an ``error`` event."""

    def refuse_retained(self, msg: Message) -> None:
        """Refuse a retained command (it would run again on every reconnect), reported once
        per topic and payload."""

    def limits(self) -> Limits:
        """The limits and defaults of a request arriving now."""

    def resolve_voice(self, name: str | None) -> str:
        """A voice name or language as an installed voice; None: the device's default."""

    def scheduler_for(self, request_id: str | None = None) -> Scheduler:
        """The scheduler, or the RequestError a request gets when there is none."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a coroutine as a task the front holds until it ends."""


class Extension:
    """One feature of the MQTT front; the defaults do nothing."""

    name = "extension"

    def __init__(self, front: Front) -> None:
        self.front = front

    def start(self) -> None:
        """Called once before the first connection."""

    def stop(self) -> None:
        """Called once when the front stops, before it disconnects."""

    def subscriptions(self) -> list[str]:
        """Topics to subscribe to on every (re)connect (QoS 1)."""
        return []

    def stream_subscriptions(self) -> list[str]:
        """Topics to subscribe to on the say/stream connection (see ``front``): only
        what may come in floods, and what has to arrive in order with it."""
        return []

    def route(self, topic: str) -> Route | None:
        """The handler for a message on ``topic``; None: not ours."""
        return None

    def drop(self, topic: str, payload: bytes) -> bool:
        """True: drop this message before it reaches the event loop (the extension counts
        it and reports it later). Runs in paho's network thread for every message, so it
        must be cheap and thread-safe: it is what keeps a flood from queueing up ahead of
        the messages after it."""
        return False

    def connected(self) -> None:
        """After every (re)connect, once availability and status are published."""

    def on_event(self, ev: dict[str, Any]) -> None:
        """A scheduler event (queued, started, finished, stopped, error)."""

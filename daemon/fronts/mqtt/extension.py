"""What a feature of the MQTT front looks like to the session that runs it.

As in zigbee2mqtt, each feature (commands, Home Assistant discovery, Hermes) is an extension:
it names the topics it takes, handles their messages on the event loop, hears the
scheduler's events, and is started and stopped by the session, each inside its own error
boundary, so one that fails is logged and the rest keep serving.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...jobs.metrics import Timeline

if TYPE_CHECKING:
    from .front import MqttFront


@dataclass(frozen=True)
class Message:
    """One message as paho delivered it, stamped with its arrival in paho's thread.
    ``via_stream``: it came on the say/stream connection (see ``session``)."""

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


class Extension:
    """One feature of the MQTT front; the defaults do nothing."""

    name = "extension"

    def __init__(self, front: MqttFront) -> None:
        self.front = front

    def start(self) -> None:
        """Called once before the first connection."""

    def stop(self) -> None:
        """Called once when the front stops, before it disconnects."""

    def subscriptions(self) -> list[str]:
        """Topics to subscribe to on every (re)connect (QoS 1)."""
        return []

    def stream_subscriptions(self) -> list[str]:
        """Topics to subscribe to on the say/stream connection (see ``session``): only
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

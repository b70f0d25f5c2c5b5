"""The MQTT front: commands in, events / status / latency / audio out.

``session`` owns the client and dispatches each message to an extension: ``commands``
(herald's own topics, with ``reassembly`` putting ``say/stream`` pieces in order),
``discovery`` (Home Assistant) and ``hermes`` (Rhasspy)."""

from .front import MqttFront

__all__ = ["MqttFront"]

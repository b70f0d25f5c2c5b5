"""The MQTT front: commands in, events / status / latency / audio out.

``front`` owns the connections and dispatches each message to an extension (``extension``
says what one may use of the front): ``commands`` (herald's own topics, with
``daemon.mqtt.reassembly`` putting ``say/stream`` pieces in order), ``discovery`` (Home
Assistant) and ``hermes`` (Rhasspy)."""

from .front import MqttFront

__all__ = ["MqttFront"]

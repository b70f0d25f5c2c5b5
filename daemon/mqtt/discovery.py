"""Home Assistant MQTT device discovery: one retained message describes the whole device.
These are the messages; the MQTT front publishes the device's
(``daemon.fronts.mqtt.discovery``) and every member of an announcement group publishes the
group's (``daemon.fleet.node``).

Device-based discovery (``<prefix>/device/<device_id>/config``) carries the device (``dev``),
the origin (``o``) and every entity (``cmps``) at once, so HA creates a herald device with:
a notify entity (say), a stop button, a voice select, a volume number and sensors for state,
queue length, last time-to-first-audio and real-time factor. All entities share herald's
availability topic, so they go unavailable when herald's last will fires.

Two things Home Assistant does not do the way one would guess:

* It does not pass the device-level ``qos`` down to the components: each component with a
  command or state topic carries its own ``qos: 1``, or HA would publish ``say``, ``stop``
  and ``set/*`` (and subscribe to the status) at QoS 0, and a command sent while the broker
  connection blips would be lost.
* The notify entity publishes the message as it is, so a message that happens to begin with
  ``{`` ("{kitchen} timer done.") would reach ``say`` looking like malformed JSON. Its
  ``command_template`` wraps the message in a JSON ``say`` instead. HA renders that template
  with the message as ``value`` only (the notify entity drops the title), so the title cannot
  be spoken from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .topics import Topics

# The latency sensors read the retained status, whose last_latency is null until the first
# utterance; rendering None makes HA show "unknown" instead of logging a template error.
_LAST = "value_json.last_latency"


# The notify message as a JSON ``say`` (Jinja's ``tojson`` quotes and escapes it), so no
# message is ever mistaken for JSON of its own.
NOTIFY_TEMPLATE = '{"text": {{ value | tojson }}}'


def _latency_template(key: str) -> str:
    return f"{{{{ {_LAST}.{key} if {_LAST} else None }}}}"


def discovery_payload(topics: Topics, version: str, voices: Sequence[str],
                      device_name: str | None = None) -> dict[str, Any]:
    """herald's device, with ``voices`` as the choices of its voice select."""
    uid = f"herald_{topics.device_id}"

    def entity(key: str, platform: str, name: str, **options: Any) -> dict[str, Any]:
        qos = {"qos": 1} if "command_topic" in options or "state_topic" in options else {}
        return {"p": platform, "unique_id": f"{uid}_{key}", "name": name, **options, **qos}

    status = {"state_topic": topics.status}
    components = {
        "say": entity("say", "notify", "Say", command_topic=topics.say,
                      command_template=NOTIFY_TEMPLATE, retain=False, icon="mdi:account-voice"),
        "stop": entity("stop", "button", "Stop", command_topic=topics.stop,
                       payload_press="PRESS", retain=False, icon="mdi:stop"),
        "voice": entity("voice", "select", "Voice", command_topic=topics.set_voice,
                        options=list(voices), value_template="{{ value_json.voice }}",
                        retain=False, icon="mdi:account-music", **status),
        "volume": entity("volume", "number", "Volume", command_topic=topics.set_volume,
                         min=0, max=1, step=0.05, mode="slider",
                         value_template="{{ value_json.volume }}", retain=False,
                         icon="mdi:volume-high", **status),
        "state": entity("state", "sensor", "State", device_class="enum",
                        options=["idle", "speaking"], value_template="{{ value_json.state }}",
                        icon="mdi:account-voice", **status),
        "queue": entity("queue", "sensor", "Queue", state_class="measurement",
                        value_template="{{ value_json.queue }}", icon="mdi:tray-full",
                        **status),
        "first_audio": entity("first_audio", "sensor", "Time to first audio",
                              device_class="duration", unit_of_measurement="ms",
                              state_class="measurement", suggested_display_precision=0,
                              value_template=_latency_template("first_audio_ms"),
                              entity_category="diagnostic", **status),
        "rtf": entity("rtf", "sensor", "Real-time factor", state_class="measurement",
                      suggested_display_precision=3, value_template=_latency_template("rtf"),
                      entity_category="diagnostic", icon="mdi:speedometer", **status),
    }
    return {
        "dev": {"ids": [uid], "name": device_name or f"herald {topics.device_id}",
                "mf": "herald", "mdl": "herald text-to-speech", "sw": version},
        "o": {"name": "herald", "sw": version},
        "availability_topic": topics.availability,
        "payload_available": "online",
        "payload_not_available": "offline",
        "qos": 1,
        "cmps": components,
    }


def group_discovery_payload(group: str, say_topic: str, presence_topics: Sequence[str]
                            ) -> dict[str, Any]:
    """An announcement group of the fleet (``daemon.fleet.groups``) as a device of its own
    with one notify entity, whose messages go to the group's ``say``. Every member publishes
    it, the same bytes (no version in it, the members in order): Home Assistant sees one
    device, available while any member is (each member's presence says ``online``)."""
    uid = f"herald_group_{group}"
    return {
        "dev": {"ids": [uid], "name": f"herald group {group}", "mf": "herald",
                "mdl": "herald announcement group"},
        "o": {"name": "herald"},
        "availability": [{"topic": t, "value_template": "{{ value_json.state }}"}
                         for t in sorted(presence_topics)],
        "availability_mode": "any",
        "payload_available": "online",
        "payload_not_available": "offline",
        "qos": 1,
        "cmps": {"say": {"p": "notify", "unique_id": f"{uid}_say", "name": "Announce",
                         "command_topic": say_topic, "command_template": NOTIFY_TEMPLATE,
                         "retain": False, "qos": 1, "icon": "mdi:bullhorn"}},
    }


def group_discovery_topic(prefix: str, group: str) -> str:
    """Where a group's discovery message goes: a device of its own, apart from any member's."""
    return f"{prefix}/device/herald_group_{group}/config"

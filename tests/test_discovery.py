"""The Home Assistant discovery payload, checked key by key against HA's documented schema.

The allowed keys below are transcribed from Home Assistant's MQTT documentation (device
discovery payload; the notify, button, select, number and sensor platforms). An unknown key
is silently dropped by HA (or rejects the whole component), so a typo here would make an
entity vanish without an error anywhere: hence an explicit allow-list per platform.
(Republishing on ``homeassistant/status`` is tested against the daemon in test_mqtt.py.)
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from daemon import __version__
from daemon.mqtt.discovery import discovery_payload
from daemon.mqtt.topics import TopicError, Topics, check_publish_topic

ABBREVIATIONS = {"p": "platform", "dev": "device", "o": "origin", "cmps": "components",
                 "ids": "identifiers", "mf": "manufacturer", "mdl": "model", "mdl_id": "model_id",
                 "sw": "sw_version", "hw": "hw_version", "sn": "serial_number",
                 "sa": "suggested_area", "cu": "configuration_url", "cns": "connections",
                 "url": "support_url"}

ROOT_KEYS = {"device", "origin", "components", "availability", "availability_mode",
             "availability_template", "availability_topic", "payload_available",
             "payload_not_available", "state_topic", "command_topic", "qos", "encoding"}
DEVICE_KEYS = {"configuration_url", "connections", "hw_version", "identifiers", "manufacturer",
               "model", "model_id", "name", "serial_number", "suggested_area", "sw_version",
               "via_device"}
ORIGIN_KEYS = {"name", "sw_version", "support_url"}

ENTITY_KEYS = {"platform", "unique_id", "name", "availability", "availability_mode",
               "availability_template", "availability_topic", "payload_available",
               "payload_not_available", "device", "enabled_by_default", "encoding",
               "entity_category", "entity_picture", "icon", "json_attributes_template",
               "json_attributes_topic", "object_id", "default_entity_id", "qos"}
PLATFORM_KEYS = {
    "notify": ENTITY_KEYS | {"command_template", "command_topic", "retain"},
    "button": ENTITY_KEYS | {"command_template", "command_topic", "device_class",
                             "payload_press", "retain"},
    "select": ENTITY_KEYS | {"command_template", "command_topic", "optimistic", "options",
                             "retain", "state_topic", "value_template"},
    "number": ENTITY_KEYS | {"command_template", "command_topic", "device_class", "max", "min",
                             "mode", "optimistic", "payload_reset", "retain", "state_topic",
                             "step", "unit_of_measurement", "value_template"},
    "sensor": ENTITY_KEYS | {"device_class", "expire_after", "force_update",
                             "last_reset_value_template", "options", "state_class",
                             "state_topic", "suggested_display_precision",
                             "unit_of_measurement", "value_template"},
}
REQUIRED = {"notify": {"command_topic"}, "button": {"command_topic"},
            "select": {"command_topic", "options"}, "number": {"command_topic"},
            "sensor": {"state_topic"}}
STATUS_KEYS = {"state", "queue", "current_id", "voice", "volume", "version", "last_latency"}
LATENCY_KEYS = {"id", "front", "sink", "voice", "queue_ms", "first_audio_ms", "synth_ms",
                "audio_ms", "rtf", "underruns", "outcome"}


def expand(d: dict[str, Any]) -> dict[str, Any]:
    return {ABBREVIATIONS.get(k, k): v for k, v in d.items()}


TOPICS = Topics("herald/kitchen", "kitchen")
VOICES = ["en_US-joe-medium", "de_DE-thorsten-high"]


def payload() -> dict[str, Any]:
    p = discovery_payload(TOPICS, __version__, VOICES)
    return json.loads(json.dumps(p))  # what goes over the wire


def test_root_device_and_origin_use_documented_keys() -> None:
    root = expand(payload())
    assert set(root) <= ROOT_KEYS, set(root) - ROOT_KEYS
    assert {"device", "origin", "components"} <= set(root)
    device, origin = expand(root["device"]), expand(root["origin"])
    assert set(device) <= DEVICE_KEYS and device["identifiers"] == ["herald_kitchen"]
    assert device["sw_version"] == __version__
    assert set(origin) <= ORIGIN_KEYS and origin["name"] == "herald"
    assert root["availability_topic"] == "herald/kitchen/availability"
    assert (root["payload_available"], root["payload_not_available"]) == ("online", "offline")
    assert TOPICS.discovery == "homeassistant/device/kitchen/config"


def test_components_use_documented_keys_per_platform() -> None:
    components = expand(payload())["components"]
    platforms: dict[str, str] = {}
    unique_ids = set()
    for key, raw in components.items():
        assert re.fullmatch(r"[a-zA-Z0-9_-]+", key)
        c = expand(raw)
        platform = c["platform"]
        assert platform in PLATFORM_KEYS, platform
        assert set(c) <= PLATFORM_KEYS[platform], (key, set(c) - PLATFORM_KEYS[platform])
        assert REQUIRED[platform] <= set(c), (key, REQUIRED[platform] - set(c))
        assert c["unique_id"] not in unique_ids
        unique_ids.add(c["unique_id"])
        platforms[key] = platform
        if c.get("retain") is not None:
            assert c["retain"] is False, "commands are never retained"
        if platform == "sensor" and "options" in c:
            assert c["device_class"] == "enum" and c["options"]
            assert "state_class" not in c and "unit_of_measurement" not in c
        if c.get("entity_category") is not None:
            assert c["entity_category"] in ("diagnostic", "config")
            if platform == "sensor":
                assert c["entity_category"] == "diagnostic"
    assert sorted(platforms.values()).count("sensor") >= 4
    assert {"notify", "button", "select", "number"} <= set(platforms.values())


def test_components_point_at_herald_topics_and_status_fields() -> None:
    c = {k: expand(v) for k, v in expand(payload())["components"].items()}
    assert c["say"]["command_topic"] == TOPICS.say
    assert c["stop"]["command_topic"] == TOPICS.stop and c["stop"]["payload_press"] == "PRESS"
    assert c["voice"]["command_topic"] == TOPICS.set_voice
    assert c["voice"]["options"] == VOICES
    assert c["volume"]["command_topic"] == TOPICS.set_volume
    assert 0 <= c["volume"]["min"] < c["volume"]["max"] <= 1 and c["volume"]["step"] >= 0.001
    assert c["first_audio"]["unit_of_measurement"] == "ms"
    for comp in c.values():
        template = comp.get("value_template", "")
        if "state_topic" in comp:
            assert comp["state_topic"] == TOPICS.status
            fields = set(re.findall(r"value_json\.(\w+)", template))
            assert fields and fields <= STATUS_KEYS, template
            nested = set(re.findall(r"last_latency\.(\w+)", template))
            assert nested <= LATENCY_KEYS, template


def test_topics_refuse_wildcards() -> None:
    for bad in ("herald/+/say", "herald/#", ""):
        with pytest.raises(TopicError):
            check_publish_topic(bad)
    with pytest.raises(TopicError):
        Topics("herald/x", "kit+chen")
    with pytest.raises(TopicError):
        TOPICS.audio_chunk("a/b", 0)
    assert TOPICS.audio_chunk("r1", 3) == "herald/kitchen/audio/r1/chunk/3"
    assert TOPICS.will() == ("herald/kitchen/availability", "offline", 1, True)


def test_every_component_with_a_topic_carries_its_own_qos() -> None:
    """Home Assistant does not hand the device-level qos down to the components: without
    their own, it publishes say/stop/set at QoS 0 and subscribes to the status at QoS 0."""
    components = {k: expand(v) for k, v in expand(payload())["components"].items()}
    with_topics = {k: c for k, c in components.items()
                   if "command_topic" in c or "state_topic" in c}
    assert set(with_topics) == set(components)  # every herald entity has one
    assert {k: c.get("qos") for k, c in with_topics.items()} == {k: 1 for k in with_topics}


def test_notify_sends_its_message_as_a_json_say() -> None:
    """The notify entity renders its command_template with the message as ``value`` (Home
    Assistant's Jinja has ``tojson``); the result is a JSON `say` whatever the message holds."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    say = expand(payload()["cmps"]["say"])
    template = ImmutableSandboxedEnvironment().from_string(say["command_template"])
    for message in ("{kitchen} timer done.", '{"text": "not me"}', "Tom & Jerry's <b>", "ü\n"):
        assert json.loads(template.render(value=message)) == {"text": message}

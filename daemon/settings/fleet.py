"""The ``[node]`` and ``[fleet]`` sections: what this herald is in a fleet of heralds sharing
one MQTT 5 broker (``daemon.fleet``), and the checks that need more than one section.

A worker has the model and no speaker, a satellite the speaker and no model; either one
only makes sense in a fleet, so the role turns ``fleet.enabled`` on. The fleet speaks MQTT 5
only (shared subscriptions balance the jobs; a fleet connection's session ends with it), so
it needs an external broker: the embedded one speaks 3.1.1.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .sections import check_topic

GROUP_RE = re.compile(r"^[A-Za-z0-9_-]+$")

Role = Literal["all", "worker", "satellite"]


class NodeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # all: model and speaker (today's herald); worker: model, no speaker; satellite:
    # speaker, no model (every request is synthesized by the fleet's workers).
    role: Role = "all"

    @field_validator("role", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return v.strip().lower() if isinstance(v, str) else v

    @property
    def synthesizes(self) -> bool:
        """Whether this node loads voices and runs the model."""
        return self.role != "satellite"

    @property
    def plays(self) -> bool:
        """Whether this node has a speaker."""
        return self.role != "worker"


class FleetSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False  # node.role worker or satellite turns it on
    topic: str = "herald/fleet"  # every fleet topic is under it; not under the base topic
    share_group: str = "herald"  # workers subscribe $share/<share_group>/<topic>/jobs
    groups: list[str] = []  # announcement groups this node's speaker plays
    sync_delay: float = Field(0.4, ge=0, le=10)  # a group's audio starts this long after
    # A request's audio from a worker (a satellite's own say) starts once this much of it
    # is buffered (or all of it came): a second chunk that comes late is no gap.
    preroll: float = Field(0.15, ge=0, le=5)
    claim_timeout: float = Field(2.0, gt=0, le=60)  # a job nobody claimed is sent again
    heartbeat: float = Field(0.5, gt=0, le=30)  # a worker's "working" state, this often
    dead_after: float = Field(3.0, gt=0, le=300)  # silent this long: the worker is gone
    attempts: int = Field(4, ge=1, le=100)  # sends of a job before "no worker answered"
    slots: int = Field(0, ge=0, le=256)  # jobs a worker holds at once; 0: 2 x engine workers

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        check_topic(v, "fleet topic")
        if v.startswith("$"):
            raise ValueError("must not start with '$' (reserved by brokers for $SYS, $share)")
        return v

    @field_validator("share_group")
    @classmethod
    def _share_group(cls, v: str) -> str:
        if not GROUP_RE.match(v):
            raise ValueError("use letters, digits, '-' and '_' only (it is a $share level)")
        return v

    @field_validator("groups")
    @classmethod
    def _groups(cls, v: list[str]) -> list[str]:
        for name in v:
            if not GROUP_RE.match(name):
                raise ValueError(f"group {name!r}: use letters, digits, '-' and '_' only (it "
                                 "is an MQTT topic level)")
        if len(set(v)) != len(v):
            raise ValueError("a group is listed twice")
        return v


def fleet_problem(role: Role, fleet: FleetSettings, mqtt_enabled: bool, mqtt_host: str,
                  mqtt_protocol: str, base_topic: str) -> str | None:
    """Why these settings cannot run a fleet node, as the line to show; None if they can.
    Each line names the key to set and why."""
    if not fleet.enabled:
        return None
    why = (f'node.role = "{role}" puts this herald in a fleet' if role != "all"
           else "fleet.enabled = true")
    if not mqtt_enabled:
        return (f"mqtt.enabled: {why}, which talks over MQTT: set mqtt.enabled = true and "
                "mqtt.host to the broker the fleet shares")
    if not mqtt_host:
        return (f"mqtt.host: {why}, which needs an external MQTT 5 broker every node reaches: "
                "set mqtt.host (and mqtt.port) to it. The embedded broker speaks MQTT 3.1.1 "
                "only, without shared subscriptions")
    if mqtt_protocol != "5":
        return (f'mqtt.protocol: {why}, which needs MQTT 5 (shared subscriptions, sessions '
                f'that end with the connection): set mqtt.protocol = "5" (got '
                f'"{mqtt_protocol}")')
    if fleet.topic == base_topic or fleet.topic.startswith(base_topic + "/"):
        return (f"fleet.topic: {fleet.topic!r} is the device's base topic {base_topic!r} or "
                "under it, where the device's own commands and audio are: choose one apart "
                "from it, e.g. herald/fleet")
    return None

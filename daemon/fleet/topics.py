"""Every fleet topic, in one place, as ``daemon.mqtt.topics`` does for a device's own topics.

F is ``fleet.topic`` (``herald/fleet``):

* ``F/nodes/<device_id>``: each node's presence, retained (its last will says offline);
* ``F/jobs``: jobs, which workers take through ``$share/<share_group>/F/jobs``;
* ``F/job/<job>/state``, ``.../text``, ``.../cancel``: one job's state (worker → owner), its
  streamed text and its cancellation (owner → worker);
* ``F/device/<device_id>/audio/<job>/...`` and ``F/group/<group>/audio/<job>/...``: a job's
  audio (``start``, ``chunk/<seq>``, ``stop``) for one satellite or for every member;
* ``F/group/<group>/say``, ``.../say/stream`` (one member takes each, through
  ``$share/<share_group>-<group>/...``), ``.../stop`` and ``.../event``; ``.../stream/<id>``
  (a stream's pieces relayed to the member that owns it).

Device ids, group names and job ids each become one topic level: they are checked here, so a
job id from the wire can never turn a topic into a wildcard or reach outside the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..mqtt.topics import TopicError, check_level, check_publish_topic, check_request_id
from ..settings.fleet import GROUP_RE

if TYPE_CHECKING:
    from ..settings import Settings

AudioPart = Literal["start", "chunk", "stop"]


def check_group(name: str) -> str:
    if not GROUP_RE.match(name):
        raise TopicError(f"group {name!r} cannot be a fleet topic level: use letters, digits, "
                         "'-' and '_' only")
    return name


@dataclass(frozen=True)
class AudioTopic:
    """What an audio topic names: whose audio (``prefix``), which job, which part."""

    prefix: str
    job: str
    part: AudioPart
    seq: int | None = None


@dataclass(frozen=True)
class FleetTopics:
    """The fleet's topics as one node (``device_id``) sees them."""

    base: str  # F
    device_id: str
    share_group: str = "herald"

    def __post_init__(self) -> None:
        check_publish_topic(self.base)
        if self.base.startswith("$"):
            raise TopicError(f"fleet topic {self.base!r} must not start with '$'")
        check_level(self.device_id, "device_id")
        check_group(self.share_group)

    @classmethod
    def from_settings(cls, settings: Settings) -> FleetTopics:
        return cls(settings.fleet.topic, settings.device_id, settings.fleet.share_group)

    def _t(self, suffix: str) -> str:
        return f"{self.base}/{suffix}"

    # presence
    def node(self, device_id: str | None = None) -> str:
        """A node's retained presence (this node's when ``device_id`` is None)."""
        return self._t(f"nodes/{check_level(device_id or self.device_id, 'device_id')}")

    @property
    def nodes(self) -> str:
        """Subscription: every node's presence."""
        return self._t("nodes/+")

    def node_id(self, topic: str) -> str | None:
        """The device id of a presence topic; None for any other topic."""
        rest = topic.removeprefix(self._t("nodes/"))
        return rest if rest != topic and rest and "/" not in rest else None

    # jobs
    @property
    def jobs(self) -> str:
        return self._t("jobs")

    @property
    def jobs_shared(self) -> str:
        """Subscription: the jobs, one worker of the share group getting each."""
        return f"$share/{self.share_group}/{self.jobs}"

    def job_state(self, job: str) -> str:
        return self._t(f"job/{check_request_id(job)}/state")

    def job_text(self, job: str) -> str:
        return self._t(f"job/{check_request_id(job)}/text")

    def job_cancel(self, job: str) -> str:
        return self._t(f"job/{check_request_id(job)}/cancel")

    def job_of(self, topic: str, kind: Literal["state", "text", "cancel"]) -> str | None:
        """The job id of a ``job/<job>/<kind>`` topic; None for any other topic."""
        rest = topic.removeprefix(self._t("job/"))
        if rest == topic or not rest.endswith("/" + kind):
            return None
        job = rest[: -len(kind) - 1]
        return job if job and "/" not in job else None

    # audio
    def device_audio(self, device_id: str | None = None) -> str:
        """The audio prefix of one satellite (this node when ``device_id`` is None)."""
        return self._t(f"device/{check_level(device_id or self.device_id, 'device_id')}/audio")

    def group_audio(self, group: str) -> str:
        """The audio prefix every member of ``group`` plays."""
        return self._t(f"group/{check_group(group)}/audio")

    def check_audio_prefix(self, prefix: str) -> str:
        """``prefix`` if it is a device's or a group's audio prefix in this fleet: a job
        names where its audio goes, and a worker publishes nowhere else."""
        parts = prefix.split("/")
        base = self.base.split("/")
        tail = parts[len(base):]
        ok = parts[: len(base)] == base and len(tail) == 3 and tail[2] == "audio"
        if ok and tail[0] == "device":
            check_level(tail[1], "device_id")
            return check_publish_topic(prefix)
        if ok and tail[0] == "group":
            check_group(tail[1])
            return check_publish_topic(prefix)
        raise TopicError(f"audio prefix {prefix!r} is not {self.base}/device/<id>/audio or "
                         f"{self.base}/group/<group>/audio")

    @staticmethod
    def audio_start(prefix: str, job: str) -> str:
        return f"{prefix}/{check_request_id(job)}/start"

    @staticmethod
    def audio_chunk(prefix: str, job: str, seq: int) -> str:
        return f"{prefix}/{check_request_id(job)}/chunk/{int(seq)}"

    @staticmethod
    def audio_stop(prefix: str, job: str) -> str:
        return f"{prefix}/{check_request_id(job)}/stop"

    @staticmethod
    def audio_filter(prefix: str) -> str:
        """Subscription: every job's audio under ``prefix``."""
        return f"{prefix}/#"

    @staticmethod
    def audio_topic(prefix: str, topic: str) -> AudioTopic | None:
        """What an audio topic under ``prefix`` names; None for anything else (a malformed
        seq included)."""
        rest = topic.removeprefix(prefix + "/")
        if rest == topic:
            return None
        parts = rest.split("/")
        if len(parts) == 2 and parts[1] in ("start", "stop") and parts[0]:
            return AudioTopic(prefix, parts[0], "start" if parts[1] == "start" else "stop")
        if len(parts) == 3 and parts[1] == "chunk" and parts[0] and parts[2].isdecimal() \
                and parts[2].isascii() and len(parts[2]) <= 9:
            return AudioTopic(prefix, parts[0], "chunk", int(parts[2]))
        return None

    # groups
    def group_say(self, group: str) -> str:
        return self._t(f"group/{check_group(group)}/say")

    def group_say_stream(self, group: str) -> str:
        return self._t(f"group/{check_group(group)}/say/stream")

    def group_share(self, group: str) -> str:
        """The share group the members of ``group`` take its ``say`` through."""
        return f"{self.share_group}-{check_group(group)}"

    def group_say_shared(self, group: str) -> str:
        """Subscription: the group's ``say``, one member getting each."""
        return f"$share/{self.group_share(group)}/{self.group_say(group)}"

    def group_say_stream_shared(self, group: str) -> str:
        return f"$share/{self.group_share(group)}/{self.group_say_stream(group)}"

    def group_relay(self, group: str, stream: str | None = None) -> str:
        """Where members relay the pieces of a group's say/stream that the share group gave
        them but another member owns (``daemon.fleet.groups``); None: the subscription."""
        level = "+" if stream is None else check_request_id(stream)
        return self._t(f"group/{check_group(group)}/stream/{level}")

    def relayed_stream(self, group: str, topic: str) -> str | None:
        """The stream id of a relay topic of ``group``; None for any other topic."""
        rest = topic.removeprefix(self._t(f"group/{group}/stream/"))
        return rest if rest != topic and rest and "/" not in rest else None

    def group_stop(self, group: str) -> str:
        return self._t(f"group/{check_group(group)}/stop")

    def group_event(self, group: str) -> str:
        return self._t(f"group/{check_group(group)}/event")

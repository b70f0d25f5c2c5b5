"""The fleet as the nodes' presence messages describe it: which workers are online, the
voices they offer (what a satellite's requests may name, and the rate each one's audio comes
at), and which nodes play which groups.

Presence is retained, and a node's last will replaces it with ``offline`` the moment the
broker loses the node, so this view follows the fleet without any polling. ``FleetVoices``
is the voice list (``daemon.synthesis.contracts.VoiceList``) a satellite resolves its
requests' voice names with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tts.audio import AudioFormat
from tts.errors import UnknownVoice, VoiceError
from tts.options import DEFAULT_VOICE

from ..errors import RequestError
from ..listeners import Listeners
from ..synthesis.contracts import pick_voice
from .link import FleetLink
from .messages import Presence, VoiceInfo, decode
from .topics import FleetTopics

log = logging.getLogger(__name__)

WORKER_ROLES = ("worker", "all")
NO_WORKER = ("no herald worker is online in the fleet ({topic}): start one (node.role = "
             "\"worker\" on a machine with the voices; see README, \"A fleet\")")


class FleetVoices:
    """Every node's last presence, and the voice list of the online workers."""

    def __init__(self, topics: FleetTopics, default: str | None = None) -> None:
        self.topics = topics
        self.configured_default = default  # voices.default of this node, if set
        self.nodes: dict[str, Presence] = {}
        self._listeners: Listeners[[]] = Listeners(log, "fleet: a presence listener failed")

    def attach(self, link: FleetLink) -> None:
        link.subscribe(self.topics.nodes, self._on_presence)

    def add_listener(self, fn: Callable[[], None]) -> None:
        """``fn()`` after every change of a node's presence."""
        self._listeners.add(fn)

    def _on_presence(self, topic: str, payload: bytes) -> None:
        device = self.topics.node_id(topic)
        if device is None:
            return
        if not payload:  # a cleared presence: the node is gone for good
            changed = self.nodes.pop(device, None) is not None
        else:
            presence = decode(Presence, payload, topic)
            if presence is None:
                return
            changed = self.nodes.get(device) != presence
            self.nodes[device] = presence
            if changed:
                log.info("fleet: %s is %s (%s%s)", device, presence.state, presence.role,
                         f", {len(presence.voices)} voice(s)" if presence.voices else "")
        if changed:
            self._listeners()

    # ------------------------------------------------------------------ reading it

    def workers(self) -> dict[str, Presence]:
        """The online nodes that take jobs."""
        return {d: p for d, p in sorted(self.nodes.items())
                if p.state == "online" and p.role in WORKER_ROLES and p.voices}

    def gone(self, device: str) -> bool:
        """The node said ``offline`` (its last will, when the broker lost it)."""
        presence = self.nodes.get(device)
        return presence is not None and presence.state == "offline"

    def members(self, group: str) -> list[str]:
        """The nodes that play ``group``, online or not (their presence says so)."""
        return sorted(d for d, p in self.nodes.items() if group in p.groups)

    def _offered(self) -> dict[str, VoiceInfo]:
        voices: dict[str, VoiceInfo] = {}
        for presence in self.workers().values():
            for v in presence.voices:
                voices.setdefault(v.name, v)
        return voices

    def _require_workers(self) -> dict[str, VoiceInfo]:
        offered = self._offered()
        if not offered:
            raise RequestError(NO_WORKER.format(topic=self.topics.base), code="unavailable")
        return offered

    # ------------------------------------------------------------------ VoiceList

    @property
    def default_voice(self) -> str:
        """This node's voices.default, if a worker offers it; else the bundled voice, if
        one does; else the first voice offered (by name). With no worker online: the one
        this node would like."""
        offered = self._offered()
        for wanted in (self.configured_default, DEFAULT_VOICE):
            if wanted and (wanted in offered or not offered):
                return wanted
        return min(offered)

    def voice_names(self) -> list[str]:
        return sorted(self._offered())

    def resolve_voice(self, name: str | None = None, language: str | None = None,
                      default: str | None = None) -> str:
        """As the engine resolves voices, over the online workers' voices; with no worker
        online, RequestError ``unavailable`` saying to start one. A default (``set/voice``'s)
        that no online worker offers gives way to ``default_voice``: which voices there are
        depends on which workers run."""
        offered = self._require_workers()
        languages = {n: v.language for n, v in sorted(offered.items())}
        voice = pick_voice(languages, self.default_voice, name, language, default,
                           where="the fleet's workers offer")
        if voice not in offered:
            log.debug("fleet: default voice %s is offered by no online worker; using %s",
                      voice, self.default_voice)
            voice = self.default_voice
        return voice

    def check_speaker(self, voice: str, speaker: str | int | None) -> None:
        """A speaker number is checked against the voice's count; a name only the worker
        can check (presence carries counts)."""
        info = self._offered().get(voice)
        if info is None or speaker in (None, ""):
            return
        if info.speakers <= 1 and speaker not in (0, "0"):
            raise VoiceError(f"voice {voice} has a single speaker; got {speaker!r}")
        if isinstance(speaker, int) and not 0 <= speaker < info.speakers:
            raise VoiceError(f"voice {voice} has no speaker {speaker}: speakers are "
                             f"0..{info.speakers - 1}")

    def audio_format(self, voice: str | None = None) -> AudioFormat:
        offered = self._require_workers()
        info = offered.get(voice or self.default_voice)
        if info is None:
            raise UnknownVoice(f"voice {voice!r} is offered by no online worker")
        return AudioFormat(info.rate)

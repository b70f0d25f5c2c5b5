"""The fleet's messages (``/work/fleet-spec.md``), each a small typed dataclass.

``to_json()`` gives the payload to publish; ``from_json()`` checks what came off the wire
strictly (types, ranges, ids that become topic levels) and raises ``MessageError`` saying
what is wrong. Keys a message does not know are ignored, so a newer node can add fields
without breaking an older one. ``decode()`` is what a subscriber calls from its callback: a
malformed message is logged (once for the same fault) and dropped, never raised into the
caller. Audio chunks are raw PCM and carry no JSON: only their ``start`` and ``stop`` are
here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import OrderedDict
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from ..errors import Code, HeraldError
from ..jobs.fields import NOISE_RANGE, RATE_RANGE, SEED_RANGE
from ..settings.fleet import Role

log = logging.getLogger(__name__)

# Strict: a number in a string, a float for a count, NaN or infinity are malformed, not
# something to guess at. Unknown keys are ignored (a newer node's additions).
_CONFIG = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

JobId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]  # daemon.mqtt.topics ids
DeviceId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
GroupName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
Attempt = Annotated[int, Field(ge=1, le=1_000_000)]
Count = Annotated[int, Field(ge=0, le=2**40)]
Epoch = Annotated[float, Field(ge=0)]
VoiceName = Annotated[str, Field(min_length=1, max_length=200)]
ErrorText = Annotated[str, Field(max_length=2000)]
# A text piece, or a job's text: bounded on the wire; each worker's own limit
# (mqtt.max_text) applies when it builds the request.
WireText = Annotated[str, Field(max_length=1_000_000)]

JobStateName = Literal["claimed", "working", "done", "failed", "busy"]
Outcome = Literal["finished", "stopped", "error"]


class MessageError(HeraldError, ValueError):
    """A fleet message that is malformed: what is wrong with it, for the log."""


class _Message:
    """``to_json``/``from_json`` for the dataclasses below."""

    kind: ClassVar[str] = "message"
    # Optional fields left out of the payload when unset (``error``/``code`` of a state).
    omit_none: ClassVar[tuple[str, ...]] = ()

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)  # type: ignore[call-overload]
        return {k: v for k, v in data.items() if not (v is None and k in self.omit_none)}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, payload: bytes | str) -> Self:
        adapter = _adapter(cls)
        try:
            message: Self = adapter.validate_json(payload)
            return message
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            msg = err["msg"]
            if err["type"] == "missing":
                msg = "required field missing"
            raise MessageError(f"malformed {cls.kind}: {where + ': ' if where else ''}{msg}"
                               ) from None


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _adapter(cls: type) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


# --------------------------------------------------------------------------- presence


@dataclass(frozen=True, config=_CONFIG)
class VoiceInfo(_Message):
    """One voice a worker has: satellites resolve names and languages, and know the rate
    its audio comes at, from these."""

    kind: ClassVar[str] = "voice"

    name: VoiceName
    language: Annotated[str, Field(max_length=64)]
    rate: Annotated[int, Field(ge=1000, le=384_000)]
    speakers: Annotated[int, Field(ge=1, le=100_000)] = 1


@dataclass(frozen=True, config=_CONFIG)
class Presence(_Message):
    """``F/nodes/<device_id>``, retained; the last will says ``offline``."""

    kind: ClassVar[str] = "presence"

    state: Literal["online", "offline"]
    role: Role
    version: Annotated[str, Field(max_length=100)] = ""
    voices: Annotated[list[VoiceInfo], Field(max_length=10_000)] = dataclasses.field(
        default_factory=list)
    slots: Annotated[int, Field(ge=0, le=10_000)] = 0
    groups: Annotated[list[GroupName], Field(max_length=1000)] = dataclasses.field(
        default_factory=list)


# --------------------------------------------------------------------------- jobs


@dataclass(frozen=True, config=_CONFIG)
class JobOptions(_Message):
    """How to synthesize: None is the worker's configured default. ``seed`` is always set,
    so any worker makes the same samples (a resumed job joins seamlessly)."""

    kind: ClassVar[str] = "job options"

    seed: Annotated[int, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1])]
    length_scale: Annotated[float, Field(ge=RATE_RANGE[0], le=RATE_RANGE[1])] | None = None
    noise_scale: Annotated[float, Field(ge=NOISE_RANGE[0], le=NOISE_RANGE[1])] | None = None
    noise_w: Annotated[float, Field(ge=NOISE_RANGE[0], le=NOISE_RANGE[1])] | None = None
    gain: Annotated[float, Field(gt=0, le=10)] = 1.0
    sentence_silence: Annotated[float, Field(ge=0, le=10)] = 0.0


@dataclass(frozen=True, config=_CONFIG)
class Job(_Message):
    """``F/jobs``: one request for a worker, and where its audio goes. (``job``,
    ``attempt``) is idempotent: a worker ignores a copy it already took."""

    kind: ClassVar[str] = "job"

    job: JobId
    attempt: Attempt
    owner: DeviceId
    text: WireText
    voice: VoiceName
    options: JobOptions
    audio: Annotated[str, Field(min_length=1, max_length=1000)]  # checked by FleetTopics
    expires: Epoch
    sent: Epoch = 0.0
    format: Literal["text", "ssml"] = "text"
    speaker: Annotated[str, Field(max_length=200)] | Annotated[int, Field(ge=0)] | None = None
    chunk_ms: Annotated[int, Field(ge=10, le=2000)] = 100
    skip_chunks: Count = 0
    stream: bool = False  # the text goes on on F/job/<job>/text
    sync: bool = False  # play_at in start: group members start together


@dataclass(frozen=True, config=_CONFIG)
class JobState(_Message):
    """``F/job/<job>/state``: what the worker is doing with the job."""

    kind: ClassVar[str] = "job state"
    omit_none: ClassVar[tuple[str, ...]] = ("error", "code")

    job: JobId
    attempt: Attempt
    worker: DeviceId
    state: JobStateName
    chunks: Count = 0  # published so far (seq of the next one)
    text_offset: Count = 0  # streamed text: characters the worker has
    error: ErrorText | None = None
    code: Code | None = None


@dataclass(frozen=True, config=_CONFIG)
class TextPiece(_Message):
    """``F/job/<job>/text``: streamed text; ``offset`` is the characters before it."""

    kind: ClassVar[str] = "text piece"

    offset: Count
    text: WireText
    end: bool = False


@dataclass(frozen=True, config=_CONFIG)
class Cancel(_Message):
    """``F/job/<job>/cancel``: stop that attempt (None: whichever attempt is running)."""

    kind: ClassVar[str] = "cancel"

    attempt: Attempt | None = None


# --------------------------------------------------------------------------- audio


@dataclass(frozen=True, config=_CONFIG)
class AudioStart(_Message):
    """``<audio>/<job>/start``. A later attempt sends it again; members play one."""

    kind: ClassVar[str] = "audio start"

    rate: Annotated[int, Field(ge=1000, le=384_000)]
    job: JobId
    attempt: Attempt
    worker: DeviceId
    voice: VoiceName
    chunk_samples: Annotated[int, Field(ge=1, le=10_000_000)]
    play_at: Epoch | None = None  # wall clock to start playing (group announcements)
    format: Literal["pcm"] = "pcm"
    width: Literal[2] = 2
    channels: Literal[1] = 1


@dataclass(frozen=True, config=_CONFIG)
class AudioStop(_Message):
    """``<audio>/<job>/stop``: the audio is whole (``chunks`` in all, from seq 0)."""

    kind: ClassVar[str] = "audio stop"
    omit_none: ClassVar[tuple[str, ...]] = ("error", "code")

    chunks: Count
    samples: Count
    outcome: Outcome
    attempt: Attempt
    error: ErrorText | None = None
    code: Code | None = None


@dataclass(frozen=True, config=_CONFIG)
class Resumed(_Message):
    """A job owner's event: the job went on on another worker from ``from_chunk``."""

    kind: ClassVar[str] = "resumed event"

    id: JobId
    lost: DeviceId
    from_chunk: Count
    worker: DeviceId | None = None
    event: Literal["resumed"] = "resumed"


# --------------------------------------------------------------------------- receiving

M = TypeVar("M", bound=_Message)

_SEEN_FAULTS: OrderedDict[tuple[str, str], None] = OrderedDict()
_SEEN_MAX = 256


def decode(cls: type[M], payload: bytes | str, topic: str) -> M | None:
    """The message on ``topic``, or None when it is malformed: logged as a warning the
    first time a fault is seen (by kind and reason), at debug level after that, so junk
    published in a loop cannot fill the log."""
    try:
        return cls.from_json(payload)
    except MessageError as e:
        key = (cls.kind, str(e))
        if key in _SEEN_FAULTS:
            _SEEN_FAULTS.move_to_end(key)
            log.debug("fleet: dropped on %s: %s", topic, e)
        else:
            _SEEN_FAULTS[key] = None
            if len(_SEEN_FAULTS) > _SEEN_MAX:
                _SEEN_FAULTS.popitem(last=False)
            log.warning("fleet: dropped a message on %s: %s (logged once)", topic, e)
        return None

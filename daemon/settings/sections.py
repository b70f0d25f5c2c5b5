"""The sections of the configuration that belong to no single front: voices, synthesis
defaults, the scheduler, MQTT (with TLS, audio, discovery, Hermes) and the state directory."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from tts.memory import KeepWarm
from tts.resources import DEFAULT_BASE_URL

from ..errors import HeraldError
from ..jobs.fields import NOISE_RANGE, RATE_RANGE
from ..voices.download import DEFAULT_CATALOG

DEVICE_ID_RE = re.compile(r"^[A-Za-z0-9_-]+$")


class ConfigError(HeraldError):
    """A configuration problem, already phrased as the one line to show the user."""


def hostname_device_id(hostname: str | None = None) -> str:
    """The host name made safe for an MQTT topic level (lower case, [a-z0-9_-])."""
    name = (hostname or socket.gethostname()).split(".")[0].lower()
    name = re.sub(r"[^a-z0-9_-]+", "_", name).strip("_")
    return name or "herald"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VoicesSettings(_Section):
    directories: list[Path] = []  # extra directories holding NAME.onnx + NAME.onnx.json
    default: str | None = None  # None: the bundled en_US-joe-medium
    # Unset: the cores up to four, and as many workers (daemon.synthesis.engine.cpu_plan).
    threads: int | None = Field(None, ge=1, le=64)  # cores one synthesis uses (helpers + 1)
    workers: int | None = Field(None, ge=1, le=32)  # syntheses computed at the same time
    # Keep the loaded voices' memory warm while idle, for VM hosts that let it go cold
    # (daemon.synthesis.engine.Engine.keep_warm): "auto" measures at start-up, "on", "off".
    keep_warm: KeepWarm = "auto"
    # Piper's voices.json, for `herald voices --available` and `download`; the voice files
    # are fetched from beside it (daemon.voices.download).
    catalog_url: str = DEFAULT_CATALOG
    # Where `herald voices download` fetches what a voice needs besides its own files (g2pW
    # for Chinese pinyin voices): Hugging Face, a mirror of it, or a file:// directory
    # holding the files under Hugging Face's paths or side by side (tts.resources).
    resources_url: str = DEFAULT_BASE_URL

    @field_validator("default", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return None if v == "" else v


class SynthesisSettings(_Section):
    """Defaults for every request; None means the voice's own value."""

    # A request's ``rate`` and noises replace them, so they take the same ranges.
    length_scale: float | None = Field(None, ge=RATE_RANGE[0], le=RATE_RANGE[1])
    noise_scale: float | None = Field(None, ge=NOISE_RANGE[0], le=NOISE_RANGE[1])
    noise_w: float | None = Field(None, ge=NOISE_RANGE[0], le=NOISE_RANGE[1])
    gain: float = Field(1.0, gt=0, le=10)
    sentence_silence: float = Field(0.0, ge=0, le=10)
    paragraph_silence: float = Field(0.4, ge=0, le=10)

    @field_validator("length_scale", "noise_scale", "noise_w", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return None if v == "" else v


class SchedulerSettings(_Section):
    max_queue: int = Field(100, ge=1)  # utterances waiting, over all lanes; more are refused
    parallel: int = Field(2, ge=1, le=32)  # network-only utterances synthesized at once
    buffer_seconds: float = Field(120.0, gt=0)  # audio synthesized ahead of playback, at most
    prefetch: bool = True  # synthesize the next speaker utterance while the current one plays


class TlsSettings(_Section):
    enabled: bool = False
    ca: Path | None = None  # CA bundle; None: the system's
    cert: Path | None = None  # client certificate (mutual TLS)
    key: Path | None = None
    insecure: bool = False  # skip the host name check (self-signed test brokers only)

    @field_validator("ca", "cert", "key", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return None if v == "" else v

    @field_validator("ca", "cert", "key")
    @classmethod
    def _readable(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        """Checked at start-up: found only when MQTT starts, a missing file would leave
        herald running without MQTT, with nothing to retry."""
        if v is not None and info.data.get("enabled"):
            if not v.is_file():
                raise ValueError(f"{v} is not a file (TLS is enabled)")
            if not os.access(v, os.R_OK):
                raise ValueError(f"{v} is not readable by this user (TLS is enabled)")
        return v


class MqttAudioSettings(_Section):
    chunk_ms: int = Field(100, ge=10, le=2000)
    qos: int = Field(0, ge=0, le=2)
    retain: bool = False
    format: Literal["pcm", "opus"] = "pcm"  # opus: Ogg Opus at 48 kHz, about 1/5 of the bytes


class DiscoverySettings(_Section):
    enabled: bool = True
    prefix: str = "homeassistant"

    @field_validator("prefix")
    @classmethod
    def _topic(cls, v: str) -> str:
        return check_topic(v, "discovery prefix")


class HermesSettings(_Section):
    enabled: bool = False
    site_id: str = "default"


class MqttSettings(_Section):
    enabled: bool = True
    host: str = ""  # empty: start the embedded broker on 127.0.0.1:port
    port: int = Field(1883, ge=1, le=65535)
    protocol: Literal["5", "3.1.1"] = "5"
    username: str | None = None
    password: str | None = None
    tls: TlsSettings = Field(default_factory=TlsSettings)
    client_id: str = ""  # empty: herald-<device_id> (fixed, so the broker keeps the session)
    keepalive: int = Field(30, ge=5, le=3600)
    session_expiry: int = Field(3600, gt=0)  # seconds the broker keeps our session offline
    base_topic: str = ""  # empty: herald/<device_id>
    max_age: float = Field(60.0, gt=0)  # a `say` with `ts` older than this is refused
    max_text: int = Field(10_000, ge=1)  # characters per request (and per stream)
    stream_timeout: float = Field(30.0, gt=0)  # say/stream: seconds without a piece -> error
    audio: MqttAudioSettings = Field(default_factory=MqttAudioSettings)
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    hermes: HermesSettings = Field(default_factory=HermesSettings)

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol(cls, v: Any) -> Any:
        text = str(v).strip().lower().removeprefix("mqtt").removeprefix("v")
        if text in ("5", "5.0"):
            return "5"
        if text in ("3.1.1", "311", "4"):
            return "3.1.1"
        return v

    @field_validator("username", "password", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return None if v == "" else v

    @field_validator("base_topic")
    @classmethod
    def _base(cls, v: str) -> str:
        return check_topic(v, "base topic") if v else v


class StateSettings(_Section):
    # Where the device state (default voice, volume set at run time) is kept across
    # restarts. None: $STATE_DIRECTORY (systemd's StateDirectory=), else
    # $XDG_STATE_HOME/herald or ~/.local/state/herald (daemon.jobs.state).
    directory: Path | None = None

    @field_validator("directory", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return None if v == "" else v


def check_topic(v: str, what: str) -> str:
    if not v or v.startswith("/") or v.endswith("/") or "//" in v or any(c in v for c in "+#"):
        raise ValueError(f"{what} must be a topic like 'a/b': no wildcards, no empty levels")
    return v

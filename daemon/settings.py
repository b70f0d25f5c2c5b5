"""herald's configuration: one pydantic-settings model, read from four places.

Precedence, lowest first: the defaults below < the TOML file (``--config``, else
``./herald.toml``, else ``/etc/herald/herald.toml``) < environment variables ``HERALD_…``
(nested with ``__``: ``HERALD_MQTT__HOST``) < ``--set key.sub=value`` on the command line.

A bad value stops start-up with one line naming the key, the problem and where the value
came from (``ConfigError``); herald never starts half-configured. Unknown keys in the file,
in ``--set`` or in ``HERALD_…`` variable names are errors too, because a typo there would
otherwise be silently ignored.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from tts.warm import KeepWarm

from .fronts.http import HttpSettings
from .fronts.wyoming import WyomingSettings
from .request import RATE_RANGE
from .sinks.speaker import SpeakerSettings
from .topics import Topics

ENV_PREFIX = "HERALD_"
CONFIG_LOCATIONS = (Path("herald.toml"), Path("/etc/herald/herald.toml"))

_DEVICE_ID_RE = re.compile(r"^[A-Za-z0-9_-]+$")


class ConfigError(Exception):
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
    # Unset: 2 threads where there are two cores or more, and as many workers as the cores
    # hold at that (daemon.engine.cpu_plan).
    threads: int | None = Field(None, ge=1, le=64)  # torch intra-op threads per synthesis
    workers: int | None = Field(None, ge=1, le=32)  # syntheses computed at the same time
    # Keep the loaded voices' memory warm while idle, for VM hosts that let it go cold
    # (daemon.engine.Engine.keep_warm): "auto" measures at start-up, "on", "off".
    keep_warm: KeepWarm = "auto"

    @field_validator("default", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return None if v == "" else v


class SynthesisSettings(_Section):
    """Defaults for every request; None means the voice's own value."""

    # A request's ``rate`` replaces it, so it takes the same range.
    length_scale: float | None = Field(None, ge=RATE_RANGE[0], le=RATE_RANGE[1])
    noise_scale: float | None = Field(None, ge=0, le=2)
    noise_w: float | None = Field(None, ge=0, le=2)
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
        return _check_topic(v, "discovery prefix")


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
        return _check_topic(v, "base topic") if v else v


class StateSettings(_Section):
    # Where the device state (default voice, volume set at run time) is kept across
    # restarts. None: $STATE_DIRECTORY (systemd's StateDirectory=), else
    # $XDG_STATE_HOME/herald or ~/.local/state/herald (daemon.state).
    directory: Path | None = None

    @field_validator("directory", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return None if v == "" else v


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__",
                                      case_sensitive=False, extra="forbid")

    device_id: str = Field(default_factory=hostname_device_id)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    voices: VoicesSettings = Field(default_factory=VoicesSettings)
    synthesis: SynthesisSettings = Field(default_factory=SynthesisSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    speaker: SpeakerSettings = Field(default_factory=SpeakerSettings)
    wyoming: WyomingSettings = Field(default_factory=WyomingSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    state: StateSettings = Field(default_factory=StateSettings)

    @field_validator("device_id")
    @classmethod
    def _device_id(cls, v: str) -> str:
        if not _DEVICE_ID_RE.match(v):
            raise ValueError("use letters, digits, '-' and '_' only (it is an MQTT topic level)")
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v

    @property
    def base_topic(self) -> str:
        return self.mqtt.base_topic or f"herald/{self.device_id}"

    def topics(self, device_id: str | None = None) -> Topics:
        """The MQTT topics of the daemon these settings describe (``device_id``: another
        daemon's id, as ``herald say --device-id`` names it): the daemon and every client
        of it derive them here, so they agree on ``mqtt.base_topic`` too."""
        s = self if device_id is None else self.model_copy(update={"device_id": device_id})
        return Topics(s.base_topic, s.device_id, s.mqtt.discovery.prefix)

    @property
    def client_id(self) -> str:
        return self.mqtt.client_id or f"herald-{self.device_id}"

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First wins: --set (passed as init arguments), then the environment, then the file.
        loading = _loading.get()
        if loading is None:
            return init_settings, env_settings
        file_data, environ = loading
        return init_settings, _EnvSource(settings_cls, environ), _FileSource(settings_cls,
                                                                             file_data)


def _check_topic(v: str, what: str) -> str:
    if not v or v.startswith("/") or v.endswith("/") or "//" in v or any(c in v for c in "+#"):
        raise ValueError(f"{what} must be a topic like 'a/b': no wildcards, no empty levels")
    return v


# The TOML data and the environment for the Settings being built by load_settings (a context
# variable, so loading is re-entrant and tests can pass their own environment).
_loading: ContextVar[tuple[dict[str, Any], Mapping[str, str]] | None] = ContextVar(
    "herald_settings_loading", default=None)


class _EnvSource(EnvSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ  # read by _load_env_vars during super().__init__
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        if self.case_sensitive:
            return dict(self._environ)
        return {k.lower(): v for k, v in self._environ.items()}


class _FileSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self.data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.data)


# --------------------------------------------------------------------------- loading


def find_config(path: Path | None) -> Path | None:
    if path is not None:
        if path.is_dir():
            raise ConfigError(f"config file {path} is a directory; give the TOML file in it")
        if not path.is_file():
            raise ConfigError(f"config file {path} not found")
        return path
    for candidate in CONFIG_LOCATIONS:
        if candidate.is_file():
            return candidate
    return None


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from None
    except UnicodeDecodeError as e:  # TOML is UTF-8; tomllib lets the decoding error through
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); a TOML file is UTF-8"
                          ) from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["mqtt.port=1884", "voices.directories=[\"/v\"]"]`` -> nested dict.

    Values starting with ``[`` or ``{`` are JSON; everything else stays a string for the
    model to parse (so ``007`` stays a string for a string field).
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set mqtt.port=1884")
        value: Any = raw
        if raw.strip()[:1] in ("[", "{"):
            try:
                value = json.loads(raw)
            except ValueError as e:
                raise ConfigError(f"--set {key}: value is not valid JSON ({e})") from None
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part} is given both as a value and a section")
            node = child
        node[parts[-1]] = value
    return out


def _unknown_keys(data: Mapping[str, Any], model: type[BaseModel], prefix: str = ""
                  ) -> list[str]:
    """Dotted keys in ``data`` that no field of ``model`` (or its sections) accepts."""
    unknown = []
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            unknown.append(prefix + key)
            continue
        ann = field.annotation
        if isinstance(value, Mapping) and isinstance(ann, type) and issubclass(ann, BaseModel):
            unknown += _unknown_keys(value, ann, f"{prefix}{key}.")
    return unknown


def _env_keys(environ: Mapping[str, str]) -> dict[str, str]:
    """Dotted key -> the ``HERALD_…`` variable that sets it. pydantic-settings reads only
    the names it knows, so a misspelt variable would be silently ignored: its key is checked
    like the file's."""
    return {name[len(ENV_PREFIX):].lower().replace("__", "."): name for name in environ
            if name.upper().startswith(ENV_PREFIX)}


def _nested(keys: list[str]) -> dict[str, Any]:
    """``["mqtt.port", "log_level"]`` -> ``{"mqtt": {"port": None}, "log_level": None}``."""
    out: dict[str, Any] = {}
    for key in keys:
        node = out
        *sections, last = key.split(".")
        for part in sections:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break  # a section also set whole (HERALD_MQTT='{...}'): its keys are JSON's
            node = child
        else:
            node.setdefault(last, None)
    return out


def _field_at(key: str) -> FieldInfo | None:
    model: Any = Settings
    field = None
    for part in key.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = field.annotation
    return field


def _env_json_error(environ: Mapping[str, str]) -> str:
    """Why pydantic-settings could not decode the environment: a list or a whole section
    in a variable is JSON, and one of them is not."""
    for key, name in _env_keys(environ).items():
        field = _field_at(key)
        ann = field.annotation if field else None
        if get_origin(ann) in (list, dict) or (isinstance(ann, type)
                                                and issubclass(ann, BaseModel)):
            try:
                json.loads(environ[name])
            except ValueError:
                example = '["…", "…"]' if get_origin(ann) is list else '{"key": …}'
                return (f"{key}: {name} must be JSON, e.g. {name}='{example}' "
                        f"(got {environ[name]!r})")
    return f"cannot read the {ENV_PREFIX}… environment variables"


def _first_infinite(data: Mapping[str, Any], prefix: str = "") -> tuple[str, float] | None:
    """The first setting that is infinite or NaN: a bound like ``gt=0`` lets infinity
    through, and ``int(inf * rate)`` would fail only when the first request uses it."""
    for key, value in data.items():
        if isinstance(value, Mapping):
            found = _first_infinite(value, f"{prefix}{key}.")
            if found:
                return found
        elif isinstance(value, float) and not math.isfinite(value):
            return prefix + key, value
    return None


def _lookup(data: Mapping[str, Any], loc: tuple[Any, ...]) -> tuple[bool, Any]:
    node: Any = data
    for part in loc:
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _origin(loc: tuple[Any, ...], overrides: dict[str, Any], environ: Mapping[str, str],
            file_data: dict[str, Any], path: Path | None) -> str:
    """Where the value at ``loc`` came from, for the error line."""
    if _lookup(overrides, loc)[0]:
        return "from --set"
    env_name = ENV_PREFIX + "__".join(str(p) for p in loc).upper()
    for name in environ:
        if name.upper() == env_name:
            return f"from {name}"
    if _lookup(file_data, loc)[0]:
        return f"in {path}"
    return ""


def load_settings(config_path: Path | None = None, overrides: list[str] | None = None,
                  environ: Mapping[str, str] | None = None) -> Settings:
    """Build the settings, or raise ConfigError with the one line to print."""
    environ = os.environ if environ is None else environ
    path = find_config(config_path)
    file_data = read_toml(path) if path else {}
    override_data = parse_overrides(overrides or [])
    env_keys = _env_keys(environ)
    for data, where in ((file_data, str(path)), (override_data, "--set"),
                        (_nested(list(env_keys)), "")):
        unknown = _unknown_keys(data, Settings)
        if unknown:
            key = unknown[0]
            where = where or "from " + next(name for k, name in env_keys.items()
                                            if k == key or k.startswith(key + "."))
            raise ConfigError(f"{key}: unknown setting ({where}); see config/herald.toml for "
                              "every key")
    token = _loading.set((file_data, environ))
    try:
        settings = Settings(**override_data)
    except SettingsError:
        raise ConfigError(_env_json_error(environ)) from None
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(p for p in err["loc"] if not isinstance(p, int)) or ("(root)",)
        key = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        if err["type"] == "list_type" and isinstance(got, str):
            msg += '; write one as ["…", "…"]'
        origin = _origin(loc, override_data, environ, file_data, path)
        detail = ", ".join(s for s in (f"got {got!r}" if not isinstance(got, dict) else "",
                                       origin) if s)
        more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise ConfigError(f"{key}: {msg}" + (f" ({detail})" if detail else "") + more) from None
    finally:
        _loading.reset(token)
    infinite = _first_infinite(settings.model_dump())
    if infinite:
        key, value = infinite
        origin = _origin(tuple(key.split(".")), override_data, environ, file_data, path)
        raise ConfigError(f"{key}: must be a finite number (got {value!r}"
                          + (f", {origin})" if origin else ")"))
    return settings

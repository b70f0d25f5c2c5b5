"""The whole configuration (``Settings``) and where pydantic-settings reads it from while
``load_settings`` builds it."""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from ..mqtt.topics import Topics
from .fleet import FleetSettings, NodeSettings, fleet_problem
from .http import HttpSettings
from .sections import (
    DEVICE_ID_RE,
    MqttSettings,
    SchedulerSettings,
    StateSettings,
    SynthesisSettings,
    VoicesSettings,
    hostname_device_id,
)
from .speaker import SpeakerSettings
from .wyoming import WyomingSettings

ENV_PREFIX = "HERALD_"


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
    node: NodeSettings = Field(default_factory=NodeSettings)
    fleet: FleetSettings = Field(default_factory=FleetSettings)

    @field_validator("device_id")
    @classmethod
    def _device_id(cls, v: str) -> str:
        if not DEVICE_ID_RE.match(v):
            raise ValueError("use letters, digits, '-' and '_' only (it is an MQTT topic level)")
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _fleet(self) -> Settings:
        """A worker or a satellite is a fleet node; a fleet node needs what the fleet needs."""
        if self.node.role != "all" and not self.fleet.enabled:
            self.fleet = self.fleet.model_copy(update={"enabled": True})
        problem = fleet_problem(self.node.role, self.fleet, self.mqtt.enabled, self.mqtt.host,
                                self.mqtt.protocol, self.base_topic)
        if problem:
            raise ValueError(problem)
        return self

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
        loading = loading_context.get()
        if loading is None:
            return init_settings, env_settings
        file_data, environ = loading
        return init_settings, _EnvSource(settings_cls, environ), _FileSource(settings_cls,
                                                                             file_data)


# The TOML data and the environment for the Settings being built by load_settings (a context
# variable, so loading is re-entrant and tests can pass their own environment).
loading_context: ContextVar[tuple[dict[str, Any], Mapping[str, str]] | None] = ContextVar(
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

"""herald's configuration: one pydantic-settings model, read from four places.

Precedence, lowest first: the defaults below < the TOML file (``--config``, else
``./herald.toml``, else ``/etc/herald/herald.toml``) < environment variables ``HERALD_…``
(nested with ``__``: ``HERALD_MQTT__HOST``) < ``--set key.sub=value`` on the command line.

A bad value stops start-up with one line naming the key, the problem and where the value
came from (``ConfigError``); herald never starts half-configured. Unknown keys in the file,
in ``--set`` or in ``HERALD_…`` variable names are errors too, because a typo there would
otherwise be silently ignored.
"""

from .fleet import FleetSettings, NodeSettings, Role
from .http import HttpSettings
from .loading import CONFIG_LOCATIONS, find_config, load_settings, parse_overrides, read_toml
from .model import ENV_PREFIX, Settings
from .sections import (
    ConfigError,
    DiscoverySettings,
    HermesSettings,
    MqttAudioSettings,
    MqttSettings,
    SchedulerSettings,
    StateSettings,
    SynthesisSettings,
    TlsSettings,
    VoicesSettings,
    hostname_device_id,
)
from .speaker import SpeakerSettings
from .wyoming import WyomingSettings

__all__ = ["CONFIG_LOCATIONS", "ENV_PREFIX", "ConfigError", "DiscoverySettings", "FleetSettings",
           "HermesSettings", "HttpSettings", "MqttAudioSettings", "MqttSettings", "NodeSettings",
           "Role", "SchedulerSettings", "Settings", "SpeakerSettings",
           "StateSettings", "SynthesisSettings", "TlsSettings", "VoicesSettings",
           "WyomingSettings", "find_config", "hostname_device_id", "load_settings",
           "parse_overrides", "read_toml"]

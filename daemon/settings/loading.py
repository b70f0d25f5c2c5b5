"""Building the configuration from its four places, and one clear line when a value is bad."""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_origin

from pydantic import (
    BaseModel,
    ValidationError,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    SettingsError,
)

from .model import ENV_PREFIX, Settings, loading_context
from .sections import ConfigError

CONFIG_LOCATIONS = (Path("herald.toml"), Path("/etc/herald/herald.toml"))


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
    token = loading_context.set((file_data, environ))
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
        if not err["loc"]:  # a check across sections: its message names the keys
            raise ConfigError(msg + more) from None
        raise ConfigError(f"{key}: {msg}" + (f" ({detail})" if detail else "") + more) from None
    finally:
        loading_context.reset(token)
    infinite = _first_infinite(settings.model_dump())
    if infinite:
        key, value = infinite
        origin = _origin(tuple(key.split(".")), override_data, environ, file_data, path)
        raise ConfigError(f"{key}: must be a finite number (got {value!r}"
                          + (f", {origin})" if origin else ")"))
    return settings

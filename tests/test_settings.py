"""Configuration: precedence (defaults < TOML < environment < --set), errors as one line,
and config/herald.toml as a complete, truthful example."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from pydantic import BaseModel

from daemon.settings import ConfigError, Settings, hostname_device_id, load_settings

EXAMPLE = ROOT / "config" / "herald.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "herald.toml"
    path.write_text(text)
    return path


def test_precedence_defaults_toml_env_cli(tmp_path: Path) -> None:
    toml = write(tmp_path, 'device_id = "from-file"\n[mqtt]\nport = 1001\nhost = "file.lan"\n'
                           "keepalive = 11\n[voices]\nthreads = 3\n")
    env = {"HERALD_MQTT__PORT": "1002", "HERALD_MQTT__HOST": "env.lan",
           "HERALD_SPEAKER__VOLUME": "0.5"}
    s = load_settings(toml, ["mqtt.port=1003"], env)
    assert s.mqtt.port == 1003  # --set beats env and file
    assert s.mqtt.host == "env.lan"  # env beats file
    assert s.speaker.volume == 0.5  # env alone (another engineer's section works too)
    assert s.mqtt.keepalive == 11 and s.voices.threads == 3  # file beats defaults
    assert s.device_id == "from-file"
    assert s.mqtt.session_expiry == 3600 and s.mqtt.protocol == "5"  # defaults
    assert s.base_topic == "herald/from-file" and s.client_id == "herald-from-file"
    assert load_settings(toml, [], {}).mqtt.port == 1001
    assert load_settings(None, [], {}).mqtt.port == 1883


def test_set_parses_nested_keys_and_json(tmp_path: Path) -> None:
    s = load_settings(None, ['voices.directories=["/a", "/b"]', "mqtt.tls.enabled=true",
                             "mqtt.protocol=3.1.1", "mqtt.audio.qos=1", "log_level=debug",
                             "mqtt.base_topic=home/speakers/hall"], {})
    assert s.voices.directories == [Path("/a"), Path("/b")]
    assert s.mqtt.tls.enabled is True and s.mqtt.protocol == "3.1.1"
    assert s.mqtt.audio.qos == 1 and s.log_level == "DEBUG"
    assert s.base_topic == "home/speakers/hall"


def test_tls_files_are_checked_only_when_tls_is_enabled(tmp_path: Path) -> None:
    ca = write(tmp_path, "not checked for content here")
    assert load_settings(None, ["mqtt.tls.ca=/nonexistent/ca.pem"], {}).mqtt.tls.enabled is False
    s = load_settings(None, ["mqtt.tls.enabled=true", f"mqtt.tls.ca={ca}"], {})
    assert s.mqtt.tls.ca == ca


def test_device_id_defaults_to_the_sanitized_hostname() -> None:
    assert hostname_device_id("Kitchen Pi.local") == "kitchen_pi"
    assert hostname_device_id("a+b#c") == "a_b_c"
    assert re.fullmatch(r"[a-z0-9_-]+", Settings().device_id)


@pytest.mark.parametrize("args, env, expect", [
    (["mqtt.port=abc"], {}, "mqtt.port: Input should be a valid integer"),
    ([], {"HERALD_MQTT__PORT": "99999"}, "mqtt.port: Input should be less than or equal"),
    (["mqtt.protocol=6"], {}, "mqtt.protocol: Input should be '5' or '3.1.1'"),
    (["mqtt.session_expiry=0"], {}, "mqtt.session_expiry: Input should be greater than 0"),
    (["device_id=kitchen/#"], {}, "device_id: use letters, digits"),
    (["mqtt.base_topic=herald/+/x"], {}, "mqtt.base_topic: base topic must be"),
    (["mqtt.hots=x"], {}, "mqtt.hots: unknown setting"),
    (["nonsense"], {}, "expected KEY=VALUE"),
    (["mqtt.tls.enabled=true", "mqtt.tls.ca=/nonexistent/ca.pem"], {},
     "mqtt.tls.ca: /nonexistent/ca.pem is not a file (TLS is enabled)"),
    (["mqtt.tls.enabled=true", "mqtt.tls.cert=/"], {},
     "mqtt.tls.cert: / is not a file"),
    # Misspelt variables, in every section (pydantic-settings reads only the names it knows).
    ([], {"HERALD_SPEAKER__VOLUMEE": "0.5"},
     "speaker.volumee: unknown setting (from HERALD_SPEAKER__VOLUMEE)"),
    ([], {"HERALD_HTTP__PROT": "8001"}, "http.prot: unknown setting (from HERALD_HTTP__PROT)"),
    ([], {"HERALD_SPEAKR__VOLUME": "0.5"}, "speakr: unknown setting (from HERALD_SPEAKR__VOLUME)"),
    # A list in the environment is JSON; plain text was a SettingsError traceback.
    ([], {"HERALD_VOICES__DIRECTORIES": "/srv/voices"},
     "voices.directories: HERALD_VOICES__DIRECTORIES must be JSON, e.g. "
     "HERALD_VOICES__DIRECTORIES='[\"…\", \"…\"]' (got '/srv/voices')"),
    ([], {"HERALD_WYOMING__ALLOW": "10.0.0.0/8"}, "wyoming.allow: HERALD_WYOMING__ALLOW must be"),
    (["voices.directories=/srv/voices"], {},
     'voices.directories: Input should be a valid list; write one as ["…", "…"]'),
    # Infinity passes a lower bound, then int(inf * rate) fails at the first request.
    (["scheduler.buffer_seconds=inf"], {},
     "scheduler.buffer_seconds: must be a finite number (got inf, from --set)"),
    ([], {"HERALD_SPEAKER__MAX_BUFFER_SECONDS": "inf"},
     "speaker.max_buffer_seconds: must be a finite number (got inf, from "
     "HERALD_SPEAKER__MAX_BUFFER_SECONDS)"),
    # The default rate takes the range a request's rate takes.
    (["synthesis.length_scale=5"], {},
     "synthesis.length_scale: Input should be less than or equal to 4"),
])
def test_bad_values_name_the_key(args: list[str], env: dict[str, str], expect: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(None, args, env)
    assert expect in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_values_say_where_they_came_from(tmp_path: Path) -> None:
    toml = write(tmp_path, "[mqtt]\nport = 'x'\n")
    with pytest.raises(ConfigError, match=rf"got 'x', in {re.escape(str(toml))}"):
        load_settings(toml, [], {})
    with pytest.raises(ConfigError, match="from HERALD_MQTT__KEEPALIVE"):
        load_settings(None, [], {"HERALD_MQTT__KEEPALIVE": "often"})
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings(write(tmp_path, "[mqtt]\nhots = 'x'\n"), [], {})
    with pytest.raises(ConfigError, match="line 1"):
        load_settings(write(tmp_path, "[mqtt\n"), [], {})
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.toml", [], {})
    with pytest.raises(ConfigError, match="is a directory; give the TOML file in it"):
        load_settings(tmp_path, [], {})
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('device_id = "küche"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.toml: not UTF-8 text \(byte 14\)"):
        load_settings(latin1, [], {})


def test_herald_run_with_a_bad_value_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "daemon.cli", "run", "--set", "mqtt.port=abc"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr == ("herald: config error: mqtt.port: Input should be a valid integer, "
                          "unable to parse string as an integer (got 'abc', from --set)\n")


# --------------------------------------------------------------------------- the example file


def _fields(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> default, for every leaf setting."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(_fields(ann, f"{prefix}{name}."))
        else:
            out[prefix + name] = field.get_default(call_default_factory=True)
    return out


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def test_example_config_parses_and_shows_the_defaults() -> None:
    data = tomllib.loads(EXAMPLE.read_text())
    loaded = load_settings(EXAMPLE, [], {})
    defaults = Settings(device_id=loaded.device_id)
    assert loaded.model_dump() == defaults.model_dump(), "the example must show the defaults"
    for key, value in _flatten(data).items():
        section = loaded
        for part in key.split("."):
            section = getattr(section, part)
        assert section == value or str(section) == str(value), key


def test_example_config_lists_every_key() -> None:
    """Every setting appears, set (`key = value`) or commented (`# key = value`), in its
    section, with a comment explaining it."""
    text = EXAMPLE.read_text()
    section = ""
    present: set[str] = set()
    explained: set[str] = set()
    previous = ""
    run_explained = False
    for line in text.splitlines():
        stripped = line.strip()
        if m := re.fullmatch(r"\[([\w.]+)\]", stripped):
            section = m[1] + "."
        elif m := re.fullmatch(r"#?\s*(\w+)\s*=.*", stripped):
            key = section + m[1]
            present.add(key)
            # Commented keys too: each needs a line of explanation above it, or sits in a
            # run of commented keys under one (credentials, a certificate and its key).
            commented_key_above = re.fullmatch(r"#\s*\w+\s*=.*", previous)
            if previous.startswith("#") and not commented_key_above:
                explained.add(key)
            elif commented_key_above and stripped.startswith("#") and run_explained:
                explained.add(key)
            run_explained = key in explained and stripped.startswith("#")
        if stripped:
            previous = stripped
    keys = set(_fields(Settings))
    assert keys - present == set(), "missing from config/herald.toml"
    assert present - keys == set(), "config/herald.toml has keys the settings don't know"
    assert keys - explained == set(), "keys without an explaining comment"


def test_fleet_roles_and_their_broker() -> None:
    """A worker or satellite is a fleet node; a fleet node needs an external MQTT 5 broker,
    and the error says which key to set and why."""
    s = load_settings(None, ["node.role=worker", "mqtt.host=broker.lan"], {})
    assert s.fleet.enabled and not s.node.plays and s.node.synthesizes
    s = load_settings(None, ["node.role=Satellite", "mqtt.host=broker.lan"], {})
    assert s.fleet.enabled and s.node.plays and not s.node.synthesizes
    s = load_settings(None, [], {})
    assert s.node.role == "all" and not s.fleet.enabled
    with pytest.raises(ConfigError, match=r"^mqtt\.host: .*embedded broker speaks MQTT 3\.1\.1"):
        load_settings(None, ["node.role=worker"], {})
    with pytest.raises(ConfigError, match=r'^mqtt\.protocol: .*set mqtt\.protocol = "5"'):
        load_settings(None, ["fleet.enabled=true", "mqtt.host=b", "mqtt.protocol=3.1.1"], {})
    with pytest.raises(ConfigError, match=r"^fleet\.topic: .*base topic"):
        load_settings(None, ["fleet.enabled=true", "mqtt.host=b", "device_id=hall",
                             "fleet.topic=herald/hall/fleet"], {})
    for bad in ('fleet.groups=["down stairs"]', 'fleet.groups=["a/b"]', "fleet.topic=a/+",
                "fleet.share_group=a/b", "node.role=speaker"):
        key = bad.split("=")[0]
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}"):
            load_settings(None, [bad], {})

"""The device's own state: what a ``set/...`` command changes, kept across restarts.

One ``DeviceState`` per daemon, owned by the service and read by every front: the default
voice (for a request that names none, whatever front it comes in on) and the speaker volume.
MQTT ``set/voice`` and ``set/volume`` change it; listeners (the speaker, the MQTT status)
follow each change, and it is written to a small JSON file so that a restart, a reboot or
systemd's watchdog does not silently undo what the user set.

The file lives in the state directory: ``state.directory`` if set, else systemd's
``$STATE_DIRECTORY`` (the unit's ``StateDirectory=herald``), else
``$XDG_STATE_HOME/herald`` or ``~/.local/state/herald``. A file that can't be read or
written is logged and herald keeps going with what it has: losing a volume setting is not a
reason to stop speaking.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..listeners import Listeners

log = logging.getLogger(__name__)

STATE_FILE = "state.json"

Listener = Callable[["DeviceState"], None]


def state_directory(configured: Path | None = None,
                    environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    """Where the state file goes (see the module docstring for the order)."""
    env = os.environ if environ is None else environ
    if configured is not None:
        return configured
    systemd = env.get("STATE_DIRECTORY", "")
    if systemd:  # several directories are separated by ':'; the unit names only ours
        return Path(systemd.split(":")[0])
    xdg = env.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg else Path(env.get("HOME") or Path.home()) / ".local" / "state"
    return base / "herald"


class DeviceState:
    """The default voice and the speaker volume, as set at run time.

    ``voice`` is an installed voice name (the front resolving a ``set/voice`` checks it);
    ``volume`` is 0..1. Setting either notifies the listeners and saves the file.
    """

    def __init__(self, voice: str, volume: float, path: Path | None = None) -> None:
        self._voice = voice
        self._volume = volume
        self.path = path
        self._listeners: Listeners[[DeviceState]] = Listeners(
            log, "device state listener failed")

    @property
    def voice(self) -> str:
        return self._voice

    @property
    def volume(self) -> float:
        return self._volume

    def add_listener(self, fn: Listener) -> None:
        self._listeners.add(fn)

    def set_voice(self, voice: str) -> None:
        self._voice = voice
        self._changed()

    def set_volume(self, volume: float) -> None:
        if not 0.0 <= volume <= 1.0:
            raise ValueError(f"volume must be from 0 to 1, got {volume!r}")
        self._volume = volume
        self._changed()

    def as_dict(self) -> dict[str, Any]:
        return {"voice": self._voice, "volume": self._volume}

    def _changed(self) -> None:
        self.save()
        self._listeners(self)

    # ------------------------------------------------------------------ the file

    @classmethod
    def load(cls, path: Path | None, voice: str, volume: float,
             known_voice: Callable[[str], str | None]) -> DeviceState:
        """The state saved at ``path``, over the configured ``voice`` / ``volume``.

        ``known_voice`` maps a saved voice name to the installed one, or None when it is no
        longer installed (then the configured voice is used, with a warning)."""
        state = cls(voice, volume, path)
        if path is None or not path.exists():
            return state
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            log.warning("ignoring the saved device state in %s (%s); using the configured "
                        "voice and volume", path, e)
            return state
        saved_voice = data.get("voice")
        if isinstance(saved_voice, str):
            installed = known_voice(saved_voice)
            if installed is None:
                log.warning("the saved default voice %r is not installed any more; using %s",
                            saved_voice, voice)
            else:
                state._voice = installed
        saved_volume = data.get("volume")
        if (isinstance(saved_volume, (int, float)) and not isinstance(saved_volume, bool)
                and 0.0 <= saved_volume <= 1.0):
            state._volume = float(saved_volume)
        elif saved_volume is not None:
            log.warning("ignoring the saved volume %r in %s: not a number from 0 to 1",
                        saved_volume, path)
        log.info("device state from %s: voice %s, volume %.2f", path, state._voice,
                 state._volume)
        return state

    def save(self) -> None:
        """Write the file whole or not at all (a temporary file renamed over it)."""
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.as_dict()) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("could not save the device state to %s (%s): it holds until herald "
                        "restarts (see state.directory)", self.path, e)

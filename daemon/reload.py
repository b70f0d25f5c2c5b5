"""SIGHUP: read the configuration again and apply what can change while herald runs.

Applied at once: ``log_level``, ``voices.directories`` (rescanned: new voices appear in
``/voices``, Wyoming ``describe`` and Home Assistant's Voice select), ``voices.default`` and
the ``[synthesis]`` defaults (for requests from then on). Every other key is bound to
something built at start-up — a listening socket, the broker connection, the synthesis
workers, the sound device — so a change there is logged as needing a restart, never
silently ignored. A file that does not load (bad TOML, a bad value, an unknown key) keeps
the running configuration whole, and the log line says which key and what to do.

The configuration is read as at start-up: the same file, the same ``--set`` overrides, the
process's environment.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pydantic import BaseModel

from .settings import ConfigError, Settings

log = logging.getLogger(__name__)

# Keys applied without a restart (a trailing dot: the whole section).
LIVE = ("log_level", "voices.directories", "voices.default", "synthesis.")


def changed_keys(old: BaseModel, new: BaseModel, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two settings (sections compared key by
    key, so the lines name the key itself, never a value: passwords stay out of logs)."""
    out = []
    for name in type(old).model_fields:
        a, b = getattr(old, name), getattr(new, name)
        if isinstance(a, BaseModel) and isinstance(b, BaseModel):
            out += changed_keys(a, b, f"{prefix}{name}.")
        elif a != b:
            out.append(prefix + name)
    return out


def is_live(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in LIVE)


async def read_settings(load: Callable[[], Settings], current: Settings
                        ) -> tuple[Settings, list[str]] | None:
    """The new settings and the changed keys to apply now; None (logged) if the file does
    not load. Logs the keys that need a restart."""
    try:
        new = await asyncio.to_thread(load)
    except ConfigError as e:
        log.error("reload: config error: %s. herald keeps running with the configuration it "
                  "had; fix this and reload again (systemctl reload herald, or kill -HUP)", e)
        return None
    changed = changed_keys(current, new)
    later = [k for k in changed if not is_live(k)]
    if later:
        log.warning("reload: %s changed but needs a restart to take effect (systemctl "
                    "restart herald); until then the running value holds", ", ".join(later))
    return new, [k for k in changed if is_live(k)]

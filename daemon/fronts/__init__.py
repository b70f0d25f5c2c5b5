"""The ways in: MQTT, Wyoming and HTTP. Each front parses and checks what arrives, then hands
requests to the scheduler or the engine."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """Whether listening on ``host`` keeps a front on this machine (every front that can be
    bound beyond it warns when it is, without its guard set)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

"""The zeroconf announcement (``_wyoming._tcp``), so Home Assistant finds the server itself."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from ...settings import WyomingSettings
from .. import is_loopback_host

if TYPE_CHECKING:
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

log = logging.getLogger("herald.wyoming")


class Announcement:
    """``_wyoming._tcp`` over mDNS, so Home Assistant discovers the server by itself."""

    def __init__(self, zc: AsyncZeroconf, info: AsyncServiceInfo) -> None:
        self._zc = zc
        self._info = info

    @classmethod
    async def start(cls, settings: WyomingSettings) -> Announcement | None:
        try:
            from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf
        except ImportError:
            log.warning("wyoming.zeroconf is on but the `zeroconf` package is not installed "
                        "(pip install zeroconf); Home Assistant must be pointed at herald by "
                        "hand")
            return None
        uri = urlparse(settings.uri)
        if uri.scheme != "tcp" or uri.port is None or is_loopback_host(uri.hostname or ""):
            log.warning("zeroconf announcement skipped: %s is not reachable from other "
                        "machines; bind wyoming.uri to 0.0.0.0 or a LAN address", settings.uri)
            return None
        address = uri.hostname or ""
        if address in ("0.0.0.0", "::"):
            address = _primary_address()
        hostname = socket.gethostname().split(".")[0] or "herald"
        name = settings.zeroconf_name or f"herald-{hostname}"
        info = AsyncServiceInfo(
            "_wyoming._tcp.local.", f"{name}._wyoming._tcp.local.",
            addresses=[ipaddress.ip_address(address).packed], port=uri.port,
            server=f"{hostname}.local.")
        zc = AsyncZeroconf()
        try:
            await zc.async_register_service(info, allow_name_change=True)
        except Exception as e:
            log.warning("zeroconf announcement failed (%s); Home Assistant must be pointed at "
                        "herald by hand", e)
            await zc.async_close()
            return None
        log.info("announced %s on %s:%d over zeroconf", info.name, address, uri.port)
        return cls(zc, info)

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self._zc.async_unregister_service(self._info)
        await self._zc.async_close()


def _primary_address() -> str:
    """The address other machines reach us at (the one a multicast route leaves from);
    connecting a UDP socket sends nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("224.0.0.251", 5353))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"

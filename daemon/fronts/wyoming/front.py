"""The Wyoming server as one of herald's fronts: listening, the allow-list, stopping."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import Any
from urllib.parse import urlparse

from wyoming.info import (
    Info,
)
from wyoming.server import AsyncServer

from tts import (
    SynthesisOptions,
)

from ...context import Context
from ...settings import WyomingSettings
from .. import is_loopback_host
from ..limits import Connections
from .announce import Announcement
from .connection import Connection
from .describe import describe, voice_versions
from .protocol import FRONT, WyomingError

log = logging.getLogger("herald.wyoming")


_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


class WyomingFront:
    """The Wyoming server as one of herald's fronts: ``start()`` listens, ``stop()`` closes
    every connection (cancelling their syntheses) and withdraws the zeroconf announcement."""

    name = FRONT

    def __init__(self, settings: WyomingSettings, ctx: Context,
                 options: SynthesisOptions | None = None) -> None:
        self.settings = settings
        self.ctx = ctx
        # Synthesis defaults: given, else the configured [synthesis] section.
        self.options = options if options is not None else ctx.synthesis
        self.connections: dict[asyncio.Task[Any], Connection] = {}
        self.limits = Connections(self.name, settings.max_connections,
                                  "wyoming.max_connections", ctx.metrics)
        self._server: AsyncServer | None = None
        self._networks = [ipaddress.ip_network(a.strip(), strict=False)
                          for a in settings.allow] or list(_LOOPBACK)
        self.allow_text = ", ".join(settings.allow) or "loopback only"
        self._info: Info | None = None
        self._zeroconf: Announcement | None = None

    def allows(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        if address is None:  # a Unix socket: the file's permissions decide
            return True
        return any(address.version == n.version and address in n for n in self._networks)

    def info(self) -> Info:
        if self._info is None:
            self._info = describe(self.ctx, {})
        return self._info

    async def refresh_info(self) -> None:
        """Describe the installed voices again (one was added or removed)."""
        versions = await asyncio.to_thread(voice_versions, self.ctx.engine.catalog.infos())
        self._info = describe(self.ctx, versions)

    async def start(self) -> None:
        await self.refresh_info()
        server = AsyncServer.from_uri(self.settings.uri)
        try:
            await server.start(lambda r, w: Connection(r, w, self))
        except OSError as e:
            raise WyomingError(f"cannot listen on {self.settings.uri}: {e.strerror or e}; is "
                               "another Wyoming server using it? Set wyoming.uri to a free "
                               "address") from None
        self._server = server
        host = urlparse(self.settings.uri).hostname or ""
        log.info("Wyoming server listening on %s (%d voices), clients: %s", self.settings.uri,
                 len(self.info().tts[0].voices), self.allow_text)
        if host and not self.settings.allow and not is_loopback_host(host):
            log.warning("Wyoming is bound to %s but wyoming.allow is empty, so only loopback "
                        "clients are accepted: set wyoming.allow to Home Assistant's network, "
                        "e.g. [\"192.168.1.0/24\"]", host)
        if self.settings.also_play and self.ctx.scheduler.speaker is None:
            log.warning("wyoming.also_play is set but herald has no speaker queue (is the "
                        "speaker enabled?); audio goes to the Wyoming client only")
        if self.settings.zeroconf:
            self._zeroconf = await Announcement.start(self.settings)

    async def stop(self) -> None:
        if self._zeroconf is not None:
            await self._zeroconf.stop()
            self._zeroconf = None
        if self._server is not None:
            await self._server.stop()  # closes every connection; their tasks end on EOF
            self._server = None
        tasks = list(self.connections)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=2.0)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2.0)
        log.info("Wyoming server stopped")

"""HTTP API, web page and /metrics. STUB: to be built (issue 5)."""

from __future__ import annotations

from pydantic import BaseModel

from ..context import Context


class HttpSettings(BaseModel):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8000


class HttpFront:
    name = "http"

    def __init__(self, settings: HttpSettings, ctx: Context) -> None:
        self.settings = settings
        self.ctx = ctx

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

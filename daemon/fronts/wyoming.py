"""Wyoming server (Home Assistant). STUB: to be built (issue 4)."""

from __future__ import annotations

from pydantic import BaseModel

from ..context import Context


class WyomingSettings(BaseModel):
    enabled: bool = True
    uri: str = "tcp://127.0.0.1:10200"


class WyomingFront:
    name = "wyoming"

    def __init__(self, settings: WyomingSettings, ctx: Context) -> None:
        self.settings = settings
        self.ctx = ctx

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

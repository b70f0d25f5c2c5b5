"""The ``[wyoming]`` section of the configuration."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlparse

from pydantic import BaseModel, Field, field_validator


class WyomingSettings(BaseModel):
    enabled: bool = True
    uri: str = "tcp://127.0.0.1:10200"  # tcp://HOST:PORT, or unix:///PATH
    # Client networks allowed to connect (CIDR or single address). Empty: loopback only, so
    # binding to 0.0.0.0 never exposes the server before someone says who may use it.
    allow: list[str] = Field(default_factory=list)
    zeroconf: bool = False  # announce _wyoming._tcp for Home Assistant (needs `zeroconf`)
    zeroconf_name: str | None = None  # default: herald-<hostname>
    # A client that cannot take one event for this long is dropped (its synthesis cancelled).
    write_timeout: float = Field(30.0, gt=0)
    # Kernel send buffer per client (bytes); bounds the audio queued for a slow client.
    send_buffer: int = Field(128 * 1024, ge=4096)
    max_text: int = Field(20_000, gt=0)  # characters per request or per text stream
    max_event_bytes: int = Field(1_000_000, gt=0)  # declared data + payload of one event
    also_play: bool = False  # also speak every request on the local speaker (its queue)
    # Connections open at once; one more gets an `error` (code busy) and is closed.
    max_connections: int = Field(32, ge=1)
    # Seconds a connection may send nothing while no request is being answered. Home
    # Assistant connects for each request and hangs up after it.
    idle_timeout: float = Field(30.0, gt=0)
    # Seconds a text stream (synthesize-start ... -stop) may wait for its next piece: the
    # text comes from a language model, which may pause to call a tool.
    stream_timeout: float = Field(120.0, gt=0)
    # Seconds an event's announced data and payload may take to arrive once its header has.
    read_timeout: float = Field(10.0, gt=0)

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, uri: str) -> str:
        parsed = urlparse(uri)
        if parsed.scheme == "tcp":
            try:
                port = parsed.port
            except ValueError:
                port = None
            if not parsed.hostname or port is None:
                raise ValueError("expected tcp://HOST:PORT, e.g. tcp://0.0.0.0:10200")
        elif parsed.scheme == "unix":
            if not parsed.path:
                raise ValueError("expected unix:///PATH/TO/SOCKET")
        else:
            raise ValueError("expected tcp://HOST:PORT or unix:///PATH")
        return uri

    @field_validator("allow")
    @classmethod
    def _check_allow(cls, allow: list[str]) -> list[str]:
        for entry in allow:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not a network; expected CIDR like "
                                 "192.168.1.0/24 or a single address") from None
        return allow

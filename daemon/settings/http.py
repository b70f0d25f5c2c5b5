"""The ``[http]`` section of the configuration."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class HttpSettings(BaseModel):
    enabled: bool = True
    host: str = Field("127.0.0.1", min_length=1,
                      description="address to listen on; 0.0.0.0 for every interface")
    port: int = Field(8000, ge=0, le=65535, description="0 picks a free port")
    token: SecretStr | None = Field(
        None, description="bearer token required on every endpoint but /healthz and the page")
    max_text_chars: int = Field(5000, ge=1, description="longer texts get 413")
    max_batch: int = Field(50, ge=1, le=50, description="items per /tts/batch")
    max_concurrent: int = Field(4, ge=1, description="syntheses at once; more get 429")
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="request body size limit")
    retry_after_seconds: int = Field(2, ge=1, description="Retry-After sent with 429 and 503")
    max_connections: int = Field(
        64, ge=1, description="connections open at once; one more is answered 503")
    idle_timeout: float = Field(
        30.0, gt=0, description="seconds a connection may wait for its next request "
        "(keep-alive) before it is closed")
    header_timeout: float = Field(
        10.0, gt=0, description="seconds from a request's first byte to the end of its headers;"
        " slower gets 408")
    body_timeout: float = Field(
        30.0, gt=0, description="seconds from a request's headers to the end of its body; "
        "slower gets 408")

"""The ``[speaker]`` section: the sound device and how the speaker sink buffers and plays on
it. The configuration owns it and the sink reads it, so reading a configuration depends on
no sink."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SpeakerSettings(BaseModel):
    enabled: bool = True
    # PortAudio device: a number, or (part of) a name, case-insensitive; None = system default.
    device: str | int | None = None
    volume: float = Field(1.0, ge=0.0, le=1.0)
    # Device sample rate. None: the voice's rate if the device takes it, else the device's
    # default rate (with resampling). Set it for devices that misreport what they accept.
    rate: int | None = Field(None, ge=8000, le=384000)
    preroll_ms: float = Field(60.0, ge=0.0, le=5000.0)  # buffered before the stream starts
    lead_in_ms: float = Field(0.0, ge=0.0, le=2000.0)  # silence first: devices that wake late
    fade_ms: float = Field(15.0, ge=1.0, le=500.0)  # fade-out on cut()
    latency_ms: float = Field(100.0, ge=5.0, le=2000.0)  # device buffer PortAudio asks for
    block_ms: float = Field(20.0, ge=2.0, le=200.0)  # audio per callback
    park_ms: float = Field(500.0, ge=50.0, le=60000.0)  # starvation before the stream stops
    max_buffer_seconds: float = Field(30.0, ge=1.0)  # jitter buffer bound (feeding waits)
    retry_seconds: float = Field(10.0, ge=0.0)  # after a failed open, fail fast this long
    device_timeout: float = Field(5.0, gt=0.0)  # a PortAudio call taking longer = failure

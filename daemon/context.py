"""What every front and sink gets from the service: the engine, the metrics, the speaker queue,
the device state and the status every front's work shows in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tts import SynthesisOptions

from .engine import Engine
from .metrics import Metrics
from .state import DeviceState
from .status import Status
from .voice_watch import VoiceWatch


@dataclass
class Context:
    engine: Engine
    metrics: Metrics
    version: str
    # The speaker scheduler (daemon.scheduler), set by the service once it exists; fronts
    # that can "also play on the speaker" hand requests to it. None when there is no speaker.
    scheduler: Any | None = None
    # The configured [synthesis] defaults; every front builds a request's options on them.
    synthesis: SynthesisOptions = SynthesisOptions()
    # The default voice and volume as set at run time (set/voice, set/volume): every front
    # reads the default voice here. None: a fresh, unsaved one on the catalog's default.
    state: DeviceState = field(default=None)  # type: ignore[assignment]
    # Keeps the catalog in step with the voice directories (daemon.voice_watch); fronts
    # refresh it before listing voices. None outside the daemon (tests of one front).
    voices: VoiceWatch | None = None
    # What herald is doing (made here, on this state): fronts that serve a request without
    # the scheduler report it through ``status.serving``; every latency record lands in it.
    status: Status = field(init=False)

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = DeviceState(self.engine.catalog.default, 1.0)
        self.status = Status(self.state, self.version)
        self.metrics.add_listener(self.status.latency)

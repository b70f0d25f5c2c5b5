"""What every front and sink gets from the service: the engine, the metrics, the scheduler
every front submits its jobs to, the device state and the status every front's work shows in."""

from __future__ import annotations

from dataclasses import dataclass, field

from tts import SynthesisOptions

from .engine import Engine
from .metrics import Metrics
from .scheduler import Scheduler
from .settings import SchedulerSettings
from .state import DeviceState
from .status import Status
from .voice_watch import VoiceWatch


@dataclass
class Context:
    engine: Engine
    metrics: Metrics
    version: str
    # Where every front submits its jobs (daemon.scheduler). The service gives one with its
    # settings and the speaker; None: one with default settings and no speaker.
    scheduler: Scheduler = field(default=None)  # type: ignore[assignment]
    # The configured [synthesis] defaults; every front builds a request's options on them.
    synthesis: SynthesisOptions = SynthesisOptions()
    # The default voice and volume as set at run time (set/voice, set/volume): every front
    # reads the default voice here. None: a fresh, unsaved one on the catalog's default.
    state: DeviceState = field(default=None)  # type: ignore[assignment]
    # Keeps the catalog in step with the voice directories (daemon.voice_watch); fronts
    # refresh it before listing voices. None outside the daemon (tests of one front).
    voices: VoiceWatch | None = None
    # What herald is doing (made here, on this state and the scheduler's work); every
    # latency record lands in it.
    status: Status = field(init=False)

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = DeviceState(self.engine.catalog.default, 1.0)
        if self.scheduler is None:
            self.scheduler = Scheduler(self.engine, self.metrics, SchedulerSettings(),
                                       self.synthesis)
        self.status = Status(self.state, self.version)
        self.status.scheduler = self.scheduler
        self.metrics.add_listener(self.status.latency)

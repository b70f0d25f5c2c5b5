"""What every front and sink gets from the service: the engine, the voices requests may name,
the metrics, the scheduler every front submits its jobs to, the device state and the status
every front's work shows in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tts.options import SynthesisOptions

from .errors import HeraldError
from .jobs.metrics import Metrics
from .jobs.scheduler import Scheduler
from .jobs.state import DeviceState
from .jobs.status import Status
from .settings import SchedulerSettings
from .synthesis.contracts import VoiceList

if TYPE_CHECKING:
    from .synthesis.engine import Engine
    from .voices.watch import VoiceWatch


@dataclass
class Context:
    # The model in this process. None on a satellite (node.role), which has none: there the
    # fronts that need one (Wyoming, HTTP) are off, and the rest go by ``voice_list``.
    model: Engine | None
    metrics: Metrics
    version: str
    # Where every front submits its jobs (daemon.jobs.scheduler). The service gives one with its
    # settings and the speaker; None: one with default settings and no speaker.
    scheduler: Scheduler = field(default=None)  # type: ignore[assignment]
    # The configured [synthesis] defaults; every front builds a request's options on them.
    synthesis: SynthesisOptions = SynthesisOptions()
    # The default voice and volume as set at run time (set/voice, set/volume): every front
    # reads the default voice here. None: a fresh, unsaved one on the voice list's default.
    state: DeviceState = field(default=None)  # type: ignore[assignment]
    # Keeps the catalog in step with the voice directories (daemon.voices.watch); fronts
    # refresh it before listing voices. None outside the daemon (tests of one front), and
    # on a satellite.
    voices: VoiceWatch | None = None
    # The voices a request may name, resolved before anything queues: the engine's, or on a
    # satellite the fleet workers' (daemon.fleet). None: the engine's.
    voice_list: VoiceList = field(default=None)  # type: ignore[assignment]
    # What herald is doing (made here, on this state and the scheduler's work); every
    # latency record lands in it.
    status: Status = field(init=False)

    def __post_init__(self) -> None:
        if self.voice_list is None:
            self.voice_list = self.engine
        if self.state is None:
            self.state = DeviceState(self.voice_list.default_voice, 1.0)
        if self.scheduler is None:
            self.scheduler = Scheduler(self.model, self.metrics, SchedulerSettings(),
                                       self.synthesis)
        self.status = Status(self.state, self.version)
        self.status.scheduler = self.scheduler
        self.metrics.add_listener(self.status.latency)

    @property
    def engine(self) -> Engine:
        """The model, for the fronts that synthesize through it themselves (Wyoming, HTTP)."""
        if self.model is None:
            raise HeraldError("this herald has no model (node.role = \"satellite\")")
        return self.model

"""What every front and sink gets from the service: the engine, the metrics, the speaker queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tts import SynthesisOptions

from .engine import Engine
from .metrics import Metrics


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

"""The latency record (one per utterance) and the Prometheus collectors every front feeds.

This is the one place a latency record is defined. ``Metrics.record`` logs it, counts it in
Prometheus and hands it to listeners (the MQTT front publishes it on ``latency``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from ..listeners import Listeners

log = logging.getLogger("herald.latency")

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)


@dataclass
class Timeline:
    """Monotonic stamps taken as a request moves through herald."""

    received: float = field(default_factory=time.monotonic)
    started: float | None = None  # left the queue, synthesis began
    first_audio: float | None = None  # first audio handed to the sink
    synth_done: float | None = None
    finished: float | None = None


@dataclass(frozen=True)
class LatencyRecord:
    id: str
    front: str  # mqtt | wyoming | http | cli
    sink: str  # speaker | mqtt | wyoming | http | file
    voice: str
    queue_ms: float
    first_audio_ms: float  # request received -> first audio handed to the sink
    synth_ms: float  # synthesis start -> last chunk synthesized
    audio_ms: float  # length of the audio produced
    rtf: float  # synth_ms / audio_ms
    underruns: int = 0
    outcome: str = "ok"  # ok | stopped | error
    # Asked to start at a wall-clock instant (``Request.play_at``): when its first sample
    # reached the speaker's output, by the device's estimate, minus that instant; positive:
    # late. None without a start time, or when nothing of it was played.
    start_skew_ms: float | None = None

    @classmethod
    def from_timeline(cls, id: str, front: str, sink: str, voice: str, t: Timeline,
                      audio_seconds: float, underruns: int = 0, outcome: str = "ok",
                      start_skew: float | None = None) -> LatencyRecord:
        started = t.started if t.started is not None else t.received
        first = t.first_audio if t.first_audio is not None else started
        done = t.synth_done if t.synth_done is not None else time.monotonic()
        synth_ms = (done - started) * 1000
        audio_ms = audio_seconds * 1000
        return cls(id=id, front=front, sink=sink, voice=voice,
                   queue_ms=round((started - t.received) * 1000, 1),
                   first_audio_ms=round((first - t.received) * 1000, 1),
                   synth_ms=round(synth_ms, 1), audio_ms=round(audio_ms, 1),
                   rtf=round(synth_ms / audio_ms, 4) if audio_ms > 0 else 0.0,
                   underruns=underruns, outcome=outcome,
                   start_skew_ms=round(start_skew * 1000, 1) if start_skew is not None else None)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # What a daemon meant to run for months is watched by: its resident memory, open
        # file descriptors, CPU time and start time (process_*), Python's garbage collector
        # and version; prometheus_client's default registry has them, ours gets them too.
        for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(standard)
        self.first_audio = Histogram("herald_first_audio_seconds",
                                     "Request received to first audio at the sink",
                                     ["front", "sink"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("herald_queue_seconds", "Time waiting in the queue",
                                    ["front"], buckets=LATENCY_BUCKETS, registry=r)
        self.synth = Histogram("herald_synthesis_seconds", "Synthesis time per utterance",
                               ["front", "voice"], registry=r)
        self.rtf = Histogram("herald_real_time_factor", "Synthesis time / audio length",
                             ["front"], buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0),
                             registry=r)
        self.audio = Counter("herald_audio_seconds", "Audio produced", ["front"], registry=r)
        self.requests = Counter("herald_requests", "Requests by front and outcome",
                                ["front", "outcome"], registry=r)
        self.underruns = Counter("herald_underruns", "Playback underruns", ["sink"], registry=r)
        self.queue_depth = Gauge("herald_queue_depth", "Utterances waiting for the speaker",
                                 registry=r)
        self.active = Gauge("herald_active_syntheses", "Syntheses running now", registry=r)
        self.streams_waiting = Gauge(
            "herald_streams_waiting", "New streams held back: the playing ones need the "
            "synthesis workers' time to stay real-time", registry=r)
        self.connections = Gauge("herald_connections", "Client connections open now",
                                 ["front"], registry=r)
        self.connections_closed = Counter(
            "herald_connections_closed", "Connections herald closed or refused: over the "
            "front's cap (busy), too slow sending a request (header, body, read) or idle",
            ["front", "reason"], registry=r)
        self._listeners: Listeners[[LatencyRecord]] = Listeners(log, "latency listener failed")

    def add_listener(self, fn: Callable[[LatencyRecord], None]) -> None:
        self._listeners.add(fn)

    def request(self, front: str, outcome: str) -> None:
        """Count a request that produced no latency record (rejected, failed early)."""
        self.requests.labels(front, outcome).inc()

    def record(self, rec: LatencyRecord) -> None:
        self.requests.labels(rec.front, rec.outcome).inc()
        self.first_audio.labels(rec.front, rec.sink).observe(rec.first_audio_ms / 1000)
        self.queue_wait.labels(rec.front).observe(rec.queue_ms / 1000)
        self.synth.labels(rec.front, rec.voice).observe(rec.synth_ms / 1000)
        if rec.audio_ms > 0:
            self.rtf.labels(rec.front).observe(rec.rtf)
        self.audio.labels(rec.front).inc(rec.audio_ms / 1000)
        if rec.underruns:
            self.underruns.labels(rec.sink).inc(rec.underruns)
        skew = "" if rec.start_skew_ms is None else f", start skew {rec.start_skew_ms:+.1f} ms"
        log.info("%s %s via %s->%s: queue %.0f ms, first audio %.0f ms, synth %.0f ms for "
                 "%.0f ms audio (rtf %.3f), underruns %d%s, %s", rec.id, rec.voice, rec.front,
                 rec.sink, rec.queue_ms, rec.first_audio_ms, rec.synth_ms, rec.audio_ms,
                 rec.rtf, rec.underruns, skew, rec.outcome)
        self._listeners(rec)

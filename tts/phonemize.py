"""Text -> phonemes -> phoneme ids, exactly as Piper does it for the same voice.

Piper voices were trained on phonemes from a particular espeak-ng build (Piper's fork, which
also reports the punctuation that ended each clause). The engine and data that ship with the
``piper-tts`` package are that build, so herald phonemizes with them: only its espeak-ng
bridge is loaded (by file, so Piper's ONNX runtime is never imported), never its model code.

Piper's id layout: BOS, PAD, then each phoneme followed by PAD, then EOS.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import threading
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from types import ModuleType

PAD, BOS, EOS = "_", "^", "$"
_LANG_SWITCH = re.compile(r"\([^)]+\)")
_lock = threading.Lock()  # espeak-ng keeps global state: one caller at a time


class PhonemizeError(Exception):
    """espeak-ng is missing or refused the voice."""


@cache
def _bridge() -> ModuleType:
    spec = importlib.util.find_spec("piper")
    if spec is None or not spec.submodule_search_locations:
        raise PhonemizeError("the piper-tts package (for its espeak-ng build) is not installed")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        so = pkg / f"espeakbridge{suffix}"
        if so.exists():
            break
    else:
        raise PhonemizeError(f"no espeakbridge extension in {pkg}")
    loader = importlib.machinery.ExtensionFileLoader("espeakbridge", str(so))
    mod_spec = importlib.util.spec_from_loader("espeakbridge", loader)
    assert mod_spec is not None
    module = importlib.util.module_from_spec(mod_spec)
    loader.exec_module(module)
    module.initialize(str(pkg / "espeak-ng-data"))
    return module


def phonemize(text: str, espeak_voice: str,
              vowel_clusters: Iterable[tuple[str, ...]] = ()) -> list[list[str]]:
    """Phonemes grouped by sentence, as espeak-ng splits them."""
    bridge = _bridge()
    with _lock:
        try:
            bridge.set_voice(espeak_voice)
        except Exception as e:  # the bridge raises RuntimeError with espeak's message
            raise PhonemizeError(f"espeak-ng has no voice {espeak_voice!r}: {e}") from e
        clauses = bridge.get_phonemes(text)
    clusters = set(vowel_clusters)
    sentences: list[list[str]] = []
    current: list[str] = []
    for phonemes, terminator, end_of_sentence in clauses:
        phonemes = _LANG_SWITCH.sub("", phonemes) + terminator
        if terminator in (",", ":", ";"):
            phonemes += " "
        current.extend(unicodedata.normalize("NFD", phonemes))
        if end_of_sentence:
            sentences.append(_merge_clusters(current, clusters))
            current = []
    if current:
        sentences.append(_merge_clusters(current, clusters))
    return [s for s in sentences if s]


def _merge_clusters(phones: Sequence[str], clusters: set[tuple[str, ...]]) -> list[str]:
    if not clusters:
        return list(phones)
    longest = max(len(c) for c in clusters)
    out: list[str] = []
    i = 0
    while i < len(phones):
        for n in range(min(longest, len(phones) - i), 1, -1):
            if tuple(phones[i : i + n]) in clusters:
                out.append("".join(phones[i : i + n]))
                i += n
                break
        else:
            out.append(phones[i])
            i += 1
    return out


def phoneme_ids(phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]) -> list[int]:
    """Piper's layout; phonemes the voice does not know are skipped (as Piper does)."""
    ids = [*id_map[BOS], *id_map[PAD]]
    for p in phonemes:
        if p in id_map:
            ids += [*id_map[p], *id_map[PAD]]
    ids += id_map[EOS]
    return ids

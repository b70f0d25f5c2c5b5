"""Text -> phonemes -> phoneme ids, exactly as Piper does it for the same voice.

Piper voices were trained on phonemes from a particular espeak-ng build (Piper's fork, which
also reports the punctuation that ended each clause). The engine and data that ship with the
``piper-tts`` package are that build, so herald phonemizes with them: only its espeak-ng
bridge is loaded (by file, so Piper's ONNX runtime is never imported), never its model code.

The bridge's own ``get_phonemes`` leaks every clause it returns (piper-tts 1.8: it appends a
new tuple to its result list without releasing its own reference; ~500 bytes a sentence,
for the life of a daemon). The bridge links espeak-ng in and exports its C API, so herald
calls ``espeak_TextToPhonemesWithTerminator`` there itself, through ctypes: the same
function of the same build, hence the same phonemes, and nothing kept.

Piper's id layout: BOS, PAD, then each phoneme followed by PAD, then EOS.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import re
import threading
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from types import ModuleType

from .errors import TtsError

PAD, BOS, EOS = "_", "^", "$"
_LANG_SWITCH = re.compile(r"\([^)]+\)")
_lock = threading.Lock()  # espeak-ng keeps global state: one caller at a time


# espeak-ng's speak_lib.h: text encoding and phoneme output modes, and the clause flags the
# terminator reports (intonation | type | pause); Piper keys its punctuation "phonemes" on them.
_CHARS_AUTO = 0
_PHONEMES_IPA = 0x02
_TYPE_SENTENCE = 0x00080000
_TERMINATORS = {
    40 | 0x00000000 | _TYPE_SENTENCE: ".",
    40 | 0x00002000 | _TYPE_SENTENCE: "?",
    45 | 0x00003000 | _TYPE_SENTENCE: "!",
    20 | 0x00001000 | 0x00040000: ",",
    30 | 0x00000000 | 0x00040000: ":",
    30 | 0x00001000 | 0x00040000: ";",
}


class PhonemizeError(TtsError):
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


@cache
def _espeak() -> ctypes.CDLL:
    """espeak-ng's C API, as the bridge (loaded and initialized) exports it."""
    bridge = _bridge()
    lib = ctypes.CDLL(str(bridge.__file__))  # the same loaded library: same state
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetVoiceByName.restype = ctypes.c_int
    convert = lib.espeak_TextToPhonemesWithTerminator
    convert.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int,
                        ctypes.POINTER(ctypes.c_int)]
    convert.restype = ctypes.c_char_p
    return lib


def _clauses(lib: ctypes.CDLL, text: str) -> list[tuple[str, str, bool]]:
    """(phonemes, punctuation that ended it, ends a sentence) for each clause of ``text``."""
    # a NUL would end the C string early: the rest of the text would go unspoken
    buffer = ctypes.create_string_buffer(text.replace("\0", " ").encode("utf-8"))
    rest = ctypes.c_void_p(ctypes.addressof(buffer))  # espeak-ng moves it on, NULL at the end
    terminator = ctypes.c_int(0)
    clauses = []
    while rest.value is not None:
        phonemes = lib.espeak_TextToPhonemesWithTerminator(
            ctypes.byref(rest), _CHARS_AUTO, _PHONEMES_IPA, ctypes.byref(terminator))
        flags = terminator.value & 0x000FFFFF
        clauses.append(((phonemes or b"").decode("utf-8", "replace"),
                        _TERMINATORS.get(flags, ""), bool(flags & _TYPE_SENTENCE)))
    return clauses


def phonemize(text: str, espeak_voice: str,
              vowel_clusters: Iterable[tuple[str, ...]] = ()) -> list[list[str]]:
    """Phonemes grouped by sentence, as espeak-ng splits them."""
    lib = _espeak()
    with _lock:
        if lib.espeak_SetVoiceByName(espeak_voice.encode("utf-8")) != 0:
            raise PhonemizeError(f"espeak-ng has no voice {espeak_voice!r}")
        clauses = _clauses(lib, text)
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

"""A voice's ``phoneme_type`` -> what turns its text into phoneme ids, as piper-tts does it.

A Piper voice is trained on the output of one phonemizer, named by ``phoneme_type`` in its
``.onnx.json``; given any other phonemes it speaks nonsense, without an error. piper-tts 1.8
knows six types:

============  =============================================================  ===========
type          text -> phonemes                                               needs
============  =============================================================  ===========
``espeak``    espeak-ng (``tts.phonemize``); Arabic is diacritized first     -
              with libtashkeel, as Piper does for ``espeak.voice == "ar"``
``text``      the text's own code points (NFD)                               -
``pinyin``    g2pW + pinyin syllables (``tts.pinyin``)                       ``zh``, g2pW
``japanese``  OpenJTalk with pitch accent                                    ``ja``
``hebrew``    the Nakdimon diacritizer (shipped in piper-tts) + rules        -
``thai``      TLTK segmentation, tones                                       ``th``
============  =============================================================  ===========

Except for ``espeak`` and ``text``, herald runs piper-tts's own phonemizer for the type (its
public ``piper.phonemize_*`` modules): they are what the voices were trained on, and a copy
would drift from them. Their packages are large, so they come in the extras named above
(``scripts/setup --extras zh,ja,th``); a voice whose extra or resources are missing is left
out of the catalog with a warning that says what to run, and loading it raises one. A type
herald does not know is refused when the voice's config is read, naming the type.

One phonemizer of each kind is shared by every voice that needs it (g2pW's model alone is
150 MB), and calls to it are serialized: none of them is documented as thread-safe.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import threading
import unicodedata
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .errors import VoiceError
from .phonemize import phoneme_ids, phonemize

if TYPE_CHECKING:
    from .resources import Resource
    from .voice import VoiceConfig

PHONEME_TYPES = ("espeak", "text", "pinyin", "japanese", "hebrew", "thai")

# Types whose phonemizer reads Latin letters too: espeak-ng switches to English for an
# English word, OpenJTalk reads it in katakana. Piper's Chinese, Hebrew and Thai phonemizers
# drop it or make junk of it, so the composer gives Latin text in a request to such a voice
# to an English voice instead.
READS_LATIN = frozenset({"espeak", "text", "japanese"})

# piper-tts's libtashkeel cut-off for Arabic, as ``PiperVoice`` uses it.
TASHKEEL_THRESHOLD = 0.8


@dataclass(frozen=True)
class _Needs:
    language: str
    extra: str | None  # piper-tts's extra (and herald's) that brings the packages
    modules: tuple[str, ...]  # what that extra installs, as imported


_NEEDS = {
    "pinyin": _Needs("Chinese (pinyin)", "zh",
                     ("transformers", "g2pw", "sentence_stream", "unicode_rbnf")),
    "japanese": _Needs("Japanese", "ja", ("pyopenjtalk",)),
    "thai": _Needs("Thai", "th", ("tltk", "unicode_rbnf", "pandas")),
    "hebrew": _Needs("Hebrew", None, ("onnxruntime",)),
}


class Phonemizer(Protocol):
    def sentences(self, text: str) -> list[list[int]]:
        """Phoneme ids of each sentence of ``text``, as piper-tts splits it."""
        ...


def check_phoneme_type(phoneme_type: str) -> None:
    if phoneme_type not in PHONEME_TYPES:
        raise VoiceError(f"phoneme type {phoneme_type!r} is not one herald knows "
                         f"({', '.join(PHONEME_TYPES)}): this voice was made for another "
                         "phonemizer, and would speak nonsense with these")


def install_hint(extra: str | None) -> str:
    """The commands that install piper-tts's ``extra`` (None: piper-tts itself)."""
    if extra is None:
        return "run scripts/setup again in herald's directory to repair piper-tts"
    try:
        pin = "==" + importlib.metadata.version("piper-tts")
    except importlib.metadata.PackageNotFoundError:
        pin = ""
    return (f"run scripts/setup --extras {extra} in herald's directory, or "
            f"{sys.executable} -m pip install 'piper-tts[{extra}]{pin}'")


def unusable(config: VoiceConfig, places: Sequence[Path]) -> str | None:
    """Why a voice of this config cannot speak here (a missing extra or resource), without
    importing anything; None if it can. ``places``: where resources are looked for."""
    needs = _NEEDS.get(config.phoneme_type)
    if needs is None:
        return None
    absent = [m for m in needs.modules if importlib.util.find_spec(m) is None]
    if absent:
        what = f"piper-tts's {needs.extra} extra" if needs.extra else "piper-tts"
        return (f"{needs.language} voices need {what}, and {', '.join(absent)} is not "
                f"installed: {install_hint(needs.extra)}")
    if config.phoneme_type == "pinyin":
        from .pinyin import missing_resources

        missing = missing_resources(places)
        if missing:
            return (f"{needs.language} voices need {' and '.join(r.title for r in missing)}, "
                    "which `herald voices download VOICE` installs beside the voice; looked "
                    f"in {', '.join(str(p) for p in places)}")
    return None


def phonemizer_for(config: VoiceConfig, places: Sequence[Path] = ()) -> Phonemizer:
    """The phonemizer of a voice of this config; raises ``VoiceError`` saying what to
    install when it cannot be made here."""
    check_phoneme_type(config.phoneme_type)
    if config.phoneme_type == "espeak":
        return EspeakPhonemizer(config)
    if config.phoneme_type == "text":
        return CodepointPhonemizer(config.phoneme_id_map)
    problem = unusable(config, places)
    if problem:
        raise VoiceError(problem)
    try:
        if config.phoneme_type == "pinyin":
            from .pinyin import RESOURCES, chinese_phonemizer, pinyin_ids

            key: Hashable = ("pinyin", *(r.find(places) for r in RESOURCES))
            return PiperPhonemizer(_shared(key, lambda: chinese_phonemizer(places)),
                                   config.phoneme_id_map, pinyin_ids)
        return PiperPhonemizer(_shared(config.phoneme_type,
                                       lambda: _piper_phonemizer(config.phoneme_type)),
                               config.phoneme_id_map)
    except ImportError as e:
        needs = _NEEDS[config.phoneme_type]
        raise VoiceError(f"{needs.language} voices need piper-tts's {needs.extra} extra, "
                         f"and it is incomplete ({e}): {install_hint(needs.extra)}"
                         ) from e
    except LookupError as e:
        raise VoiceError(f"missing {e}: `herald voices download VOICE` installs it") from e


def _piper_phonemizer(phoneme_type: str) -> Any:
    if phoneme_type == "japanese":
        from piper.phonemize_japanese import JapanesePhonemizer

        return JapanesePhonemizer()
    if phoneme_type == "hebrew":
        from piper.phonemize_hebrew import HebrewPhonemizer

        return HebrewPhonemizer()
    from piper.phonemize_thai import ThaiPhonemizer

    return ThaiPhonemizer()


class _Shared:
    """One phonemizer object and the lock its callers take turns with."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.lock = threading.Lock()


_instances: dict[Hashable, _Shared] = {}
_instances_lock = threading.Lock()


def _shared(key: Hashable, make: Callable[[], Any]) -> _Shared:
    with _instances_lock:  # made once, even when two voices load at the same time
        found = _instances.get(key)
        if found is None:
            found = _instances[key] = _Shared(make())
        return found


IdLayout = Callable[[list[str], Mapping[str, Sequence[int]]], list[int]]


class PiperPhonemizer:
    """piper-tts's phonemizer of a type, with the voice's id map and Piper's id layout."""

    def __init__(self, shared: _Shared, id_map: Mapping[str, Sequence[int]],
                 layout: IdLayout = phoneme_ids) -> None:
        self._shared = shared
        self._id_map = id_map
        self._layout = layout

    def sentences(self, text: str) -> list[list[int]]:
        with self._shared.lock:
            phonemes: list[list[str]] = self._shared.obj.phonemize(text)
        return [self._layout(p, self._id_map) for p in phonemes if p]


class CodepointPhonemizer:
    """``text`` voices: the phonemes are the text's code points, decomposed (NFD), all in
    one sentence."""

    def __init__(self, id_map: Mapping[str, Sequence[int]]) -> None:
        self._id_map = id_map

    def sentences(self, text: str) -> list[list[int]]:
        phonemes = list(unicodedata.normalize("NFD", text))
        return [phoneme_ids(phonemes, self._id_map)] if phonemes else []


class EspeakPhonemizer:
    """``espeak`` voices: espeak-ng's phonemes (``tts.phonemize``). Arabic text gets its
    vowel marks from libtashkeel first, as Piper does: Arabic is written without them, and
    espeak-ng guesses badly."""

    def __init__(self, config: VoiceConfig) -> None:
        self._voice = config.espeak_voice
        self._id_map = config.phoneme_id_map
        self._clusters = config.vowel_clusters
        self._tashkeel = _shared("tashkeel", _tashkeel) if self._voice == "ar" else None

    def sentences(self, text: str) -> list[list[int]]:
        if self._tashkeel is not None:
            with self._tashkeel.lock:
                text = self._tashkeel.obj(text, taskeen_threshold=TASHKEEL_THRESHOLD)
        return [phoneme_ids(p, self._id_map)
                for p in phonemize(text, self._voice, self._clusters)]


def _tashkeel() -> Any:
    from piper.tashkeel import TashkeelDiacritizer

    return TashkeelDiacritizer()


def resources_for(phoneme_type: str) -> tuple[Resource, ...]:
    """What ``herald voices download`` installs beside a voice of this type."""
    if phoneme_type == "pinyin":
        from .pinyin import RESOURCES

        return RESOURCES
    return ()

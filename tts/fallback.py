"""espeak-ng's own formant synthesis: a voice for every language no installed voice speaks.

A Chinese sentence given to an English Piper voice comes out as nothing useful; espeak-ng
speaks Mandarin, Cantonese, Japanese kana, Korean and about a hundred other languages, with
a robotic but intelligible voice. It is the fallback the composer routes such text to.

We call the system library (``libespeak-ng.so.1``, Debian package ``libespeak-ng1``)
through ctypes rather than running ``espeak-ng --stdout``: in synchronous mode it hands the
samples to a callback in the calling thread, with no process to start per sentence and no
WAV to parse, and it takes milliseconds per sentence. It creates no threads. espeak-ng keeps
global state (the current voice, the rate), so every call holds one process-wide lock.
(Piper's phonemizer is a separate, statically linked copy of espeak-ng with its own state.)

Mandarin: Debian's espeak-ng 1.51 reads the tone numbers of its dictionary's pinyin as
English words ("ni three hao three") with the ``cmn`` voice; its ``cmn-latn-pinyin`` voice
reads the same characters correctly, so Han text goes to that one.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .errors import VoiceError
from .text.languages import base_language, script_of

LABEL_PREFIX = "espeak:"
NATIVE_RATE = 22050  # what espeak-ng synthesizes at; the library reports it at start-up
DEFAULT_WPM = 175  # espeak-ng's normal speed, words per minute
MIN_WPM, MAX_WPM = 80, 450
# espeak-ng peaks near full scale; this brings it to about the loudness of a Piper voice.
LEVEL = 0.5

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000  # report errors instead of calling exit()
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PARAM_RATE = 1
_EE_OK = 0


class FallbackError(VoiceError):
    """espeak-ng is not installed or refused the text or the voice."""


@dataclass(frozen=True)
class EspeakVoice:
    identifier: str  # what espeak_SetVoiceByName takes: "sit/cmn"
    name: str  # "Chinese (Mandarin, latin as English)"
    languages: tuple[str, ...]  # its own first: ("cmn", "zh-cmn", "zh")
    priorities: tuple[int, ...]  # per language: how well it fits it, 1 is best

    @property
    def label(self) -> str:
        """How chunks and markup name it: ``espeak:cmn``."""
        return LABEL_PREFIX + self.languages[0]


class _VoiceStruct(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_void_p),
                ("identifier", ctypes.c_char_p), ("gender", ctypes.c_ubyte),
                ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte), ("xx1", ctypes.c_ubyte),
                ("score", ctypes.c_int), ("spare", ctypes.c_void_p)]


_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                                  ctypes.c_void_p)


class _Library:
    """The loaded library: one per process, initialised once, used under ``lock``."""

    lock = threading.Lock()

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libespeak-ng.so.1")
        except OSError as e:
            raise FallbackError("libespeak-ng.so.1 is not installed: install the espeak-ng "
                                "package (apt install espeak-ng)") from e
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                          ctypes.c_int]
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint,
                                     ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
                                     ctypes.c_void_p, ctypes.c_void_p]
        lib.espeak_ListVoices.argtypes = [ctypes.c_void_p]
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_VoiceStruct))
        self.lib = lib
        self._parts: list[np.ndarray] = []
        self._callback = _SynthCallback(self._collect)  # kept alive as long as the library
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None, _INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise FallbackError("espeak-ng could not start: its data (espeak-ng-data) is "
                                "missing; reinstall the espeak-ng-data package")
        self.sample_rate = int(rate)
        lib.espeak_SetSynthCallback(self._callback)

    def _collect(self, wav: ctypes._Pointer[ctypes.c_short], count: int, _events: int) -> int:
        if count > 0 and wav:
            self._parts.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        return 0  # 0: carry on

    def voices(self) -> list[EspeakVoice]:
        with self.lock:
            table = self.lib.espeak_ListVoices(None)
            found = []
            i = 0
            while table[i]:
                v = table[i].contents
                langs = _languages(v.languages)
                found.append(EspeakVoice((v.identifier or b"").decode(), (v.name or b"").decode(),
                                         tuple(n for n, _ in langs), tuple(p for _, p in langs)))
                i += 1
        return [v for v in found if v.identifier and v.languages]

    def synthesize(self, text: str, identifier: str, wpm: int) -> np.ndarray:
        data = text.encode("utf-8") + b"\0"
        with self.lock:
            if self.lib.espeak_SetVoiceByName(identifier.encode()) != _EE_OK:
                raise FallbackError(f"espeak-ng refused the voice {identifier!r}")
            self.lib.espeak_SetParameter(_PARAM_RATE, wpm, 0)
            self._parts = []
            status = self.lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8,
                                           None, None)
            parts, self._parts = self._parts, []
        if status != _EE_OK:
            raise FallbackError(f"espeak-ng failed to synthesize (error {status})")
        if not parts:
            return np.zeros(0, np.int16)
        return np.concatenate(parts)


def _languages(pointer: int | None) -> list[tuple[str, int]]:
    """espeak's language list: (priority byte, NUL-terminated name)*, then a 0 byte."""
    entries: list[tuple[str, int]] = []
    p = pointer
    while p and (priority := ctypes.c_ubyte.from_address(p).value) != 0:
        name = ctypes.string_at(p + 1)
        entries.append((name.decode("ascii", "replace").lower(), priority))
        p += len(name) + 2
    return entries


_library: _Library | None = None
_library_lock = threading.Lock()


def _load() -> _Library:
    global _library
    with _library_lock:
        if _library is None:
            _library = _Library()
        return _library


class EspeakFallback:
    """Speaks any language espeak-ng knows. Construct once (it lists the voices); the calls
    are thread-safe and serialised."""

    def __init__(self) -> None:
        self._lib = _load()
        self.sample_rate = self._lib.sample_rate
        self._voices = self._lib.voices()
        self._by_language: dict[str, tuple[int, EspeakVoice]] = {}
        for voice in self._voices:  # per language the best fit; the first listed on a tie
            for lang, priority in zip(voice.languages, voice.priorities):
                have = self._by_language.get(lang)
                if have is None or priority < have[0]:
                    self._by_language[lang] = (priority, voice)
        self._pinyin = self._by_language.get("cmn-latn-pinyin", (0, None))[1]

    def voices(self) -> list[EspeakVoice]:
        return list(self._voices)

    def find(self, language: str) -> EspeakVoice | None:
        """The voice for a language code (``zh``, ``cmn``, ``yue``, ``en_US``, ``de``) or a
        label (``espeak:cmn``); None if espeak-ng doesn't speak it."""
        code = language.strip().lower().replace("_", "-").removeprefix(LABEL_PREFIX)
        for candidate in (code, base_language(code), code.split("-")[0]):
            if candidate == "zh":
                candidate = "cmn"
            if candidate in self._by_language:
                return self._by_language[candidate][1]
        return None

    def resolve(self, language: str) -> EspeakVoice:
        voice = self.find(language)
        if voice is None:
            raise FallbackError(f"espeak-ng has no voice for {language!r}; see espeak-ng "
                                "--voices")
        return voice

    def synthesize(self, text: str, voice: EspeakVoice, rate: float = 1.0,
                   gain: float = 1.0) -> np.ndarray:
        """Float32 samples at ``sample_rate``. ``rate`` is a speed factor (0.8 = slower)."""
        if not text.strip():
            return np.zeros(0, np.float32)
        identifier = voice.identifier
        if self._pinyin is not None and "cmn" in voice.languages[:1] and any(
                script_of(ch) == "han" for ch in text):
            identifier = self._pinyin.identifier  # see the module docstring
        wpm = int(min(MAX_WPM, max(MIN_WPM, round(DEFAULT_WPM * rate))))
        pcm = self._lib.synthesize(text, identifier, wpm)
        samples = pcm.astype(np.float32) * (LEVEL * gain / 32768.0)
        clipped: np.ndarray = np.clip(samples, -1.0, 1.0)
        return clipped

    def stream(self, text: str, voice: EspeakVoice, rate: float = 1.0, gain: float = 1.0,
               chunk_seconds: float = 0.5) -> Iterator[np.ndarray]:
        """The same audio in chunks of at most ``chunk_seconds``: espeak-ng is fast enough
        (milliseconds per sentence) that synthesizing a run at once costs no latency."""
        samples = self.synthesize(text, voice, rate, gain)
        step = max(1, int(chunk_seconds * self.sample_rate))
        for start in range(0, len(samples), step):
            yield samples[start:start + step]

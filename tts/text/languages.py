"""Which language each stretch of a text is in, from its script.

A Piper voice speaks one language, and an English voice given Chinese characters says
nothing useful. Scripts tell the CJK languages apart from Latin text well enough: hangul is
Korean, kana is Japanese (and so are the ideographs around it), ideographs alone are
Chinese. Hebrew and Thai letters are Hebrew and Thai, the only languages of Piper's voices
written in them. Latin, Cyrillic and other alphabetic text (Arabic letters too: Arabic,
Persian and Urdu share them) is taken to be in the voice's own language. Digits, spaces and
punctuation have no script: they belong to the run they are in, or, between two runs, to
the one before; so does the letter of a unit written after a degree sign (``-7°C``), which
is part of the number, not a word.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Script = Literal["han", "kana", "hangul", "hebrew", "thai", "other"]
CJK_LANGUAGES = frozenset({"zh", "yue", "ja", "ko"})
# Alphabets one language alone is written in, among Piper's voices.
SCRIPT_LANGUAGES: dict[Script, str] = {"hebrew": "he", "thai": "th"}
# Languages whose text is told from Latin text by its script.
SCRIPTED_LANGUAGES = CJK_LANGUAGES | frozenset(SCRIPT_LANGUAGES.values())

# Full-width punctuation a non-CJK voice would not treat as punctuation.
_TO_ASCII = str.maketrans({
    "\uff0c": ", ", "\u3001": ", ", "\u3002": ". ", "\uff0e": ". ", "\uff01": "! ",
    "\uff1f": "? ", "\uff1b": "; ", "\uff1a": ": ", "\uff08": " (", "\uff09": ") ",
    "\u300c": '"', "\u300d": '"', "\u300e": '"', "\u300f": '"', "\u201c": '"', "\u201d": '"',
    "\u2018": "'", "\u2019": "'", "\u300a": '"', "\u300b": '"', "\u3010": "(", "\u3011": ")",
    "\u3000": " ",
})


@dataclass(frozen=True)
class Run:
    """A stretch of text in one language. ``language`` is a base code (``zh``, ``ja``,
    ``ko``, ``yue``; ``he``, ``th``) for CJK, Hebrew and Thai runs and the caller's
    default for the rest."""

    text: str
    language: str
    cjk: bool


def script_of(ch: str) -> Script | None:
    """The script of a letter (or of a mark on one); None for digits, spaces, punctuation
    and symbols."""
    o = ord(ch)
    if (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x3134F
            or 0xF900 <= o <= 0xFAFF or o in (0x3005, 0x3007)):
        return "han"
    if 0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF or 0xFF66 <= o <= 0xFF9D:
        return "kana"
    if (0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F
            or 0xA960 <= o <= 0xA97F or 0xD7B0 <= o <= 0xD7FF):
        return "hangul"
    category = unicodedata.category(ch)[0]
    if category in "LM" and (0x0590 <= o <= 0x05FF or 0xFB1D <= o <= 0xFB4F):
        return "hebrew"  # letters and points
    if category in "LM" and 0x0E00 <= o <= 0x0E7F:
        return "thai"  # consonants, vowels and tone marks
    return "other" if category == "L" else None


def base_language(code: str) -> str:
    """``en_US`` -> ``en``; the Chinese family to ``zh`` (Mandarin) or ``yue`` (Cantonese)."""
    c = code.strip().replace("_", "-").lower()
    if c in ("yue", "zh-yue", "zh-hk", "zh-mo") or c.startswith(("yue-", "zh-yue-")):
        return "yue"
    if c in ("cmn", "zh-cmn") or c.startswith(("cmn-", "zh-")):
        return "zh"
    return c.split("-")[0]


def speaks(language: str, voices: Iterable[tuple[str, str]]) -> str | None:
    """The first of ``voices`` (name, language) that speaks ``language`` (``en_US``,
    ``en-us`` or ``en``): one of exactly that language, else one of the same base
    language; None if none does. Put the preferred voice first."""
    want = language.replace("-", "_").lower()
    candidates = [(name, have.replace("-", "_").lower()) for name, have in voices]
    for exact in (True, False):
        for name, have in candidates:
            if have == want or (not exact and have.split("_")[0] == want.split("_")[0]):
                return name
    return None


def language_runs(text: str, default: str, cjk: str | None = None) -> list[Run]:
    """Split ``text`` into runs of one language.

    ``default`` is the language of non-CJK letters (the voice's). ``cjk``, when given
    (``yue`` from an SSML ``xml:lang``, or a Cantonese voice's own), is the language of
    ideographs in a text without kana.
    """
    family_of = {"han": "cjk", "kana": "cjk", "hangul": "hangul", "hebrew": "hebrew",
                 "thai": "thai", "other": "other"}
    runs: list[tuple[str, list[str]]] = []  # (family, characters)
    leading: list[str] = []  # scriptless characters before the first letter
    prev = ""
    for ch in text:
        script = script_of(ch) if prev != "\u00b0" else None  # 7°C: the C is the number's
        prev = ch
        if script is None:
            (runs[-1][1] if runs else leading).append(ch)
            continue
        family = family_of[script]
        if not runs or runs[-1][0] != family:
            runs.append((family, []))
        runs[-1][1].append(ch)
    if not runs:
        return [Run(text, default, False)] if text.strip() else []
    runs[0][1][:0] = leading
    has_kana = any(script_of(ch) == "kana" for ch in text)
    out = []
    for family, chars in runs:
        chunk = "".join(chars)
        if family == "hangul":
            out.append(Run(chunk, "ko", True))
        elif family == "cjk":  # kana settles it; else the caller's CJK language, else zh
            out.append(Run(chunk, "ja" if has_kana else base_language(cjk) if cjk else "zh",
                           True))
        elif family in SCRIPT_LANGUAGES:
            out.append(Run(chunk, SCRIPT_LANGUAGES[family], False))
        else:
            out.append(Run(chunk, default, False))
    return out


def for_voice(text: str, cjk_run: bool) -> str:
    """Text as a voice of the run's kind reads it best: full-width punctuation becomes
    ASCII punctuation outside CJK runs, and whitespace is collapsed."""
    if not cjk_run:
        text = text.translate(_TO_ASCII)
    return " ".join(text.split())

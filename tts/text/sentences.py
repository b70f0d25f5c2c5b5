"""Sentence splitting, for whole texts and for text that arrives piece by piece.

Synthesis runs one sentence at a time, so where a sentence ends decides both the prosody and
how early speech can start when the text is streamed (LLM output, Wyoming
``synthesize-chunk``). Both uses share one scanner, ``_next_sentence``, which decides a
boundary only from text it has already seen: when the decision would depend on what comes
next (is ``3.`` followed by ``5``? is ``Dr.`` followed by a name?) it answers "not yet", and
the incremental splitter waits for the next piece. Splitting the text at once is feeding it
in one piece and then flushing, so both ways give the same sentences for any split of the
input.

Rules, in order of precedence:

* a blank line ends a paragraph (and the sentence before it);
* full-width CJK terminators (``。！？；``) end a sentence; no space is needed after them;
* ``.``, ``!``, ``?`` and ellipses end a sentence when, after any closing quotes and
  brackets, whitespace and then a character that is not a lower-case letter follow;
  abbreviations (``Dr.``, ``e.g.``, ``Jan.``), initials (``J. R. R.``), list numbers
  (``1.``) and dotted acronyms before a lower-case word (``a.m. in``, ``D.C. yesterday``)
  don't end a sentence; numbers and versions (``3.5``, ``v1.2.0``) have no space after
  the dot and never did;
* a line break followed by a list item (``- ``, ``* ``, ``2. ``) ends a sentence;
* a sentence longer than ``max_chars`` is cut at its last clause mark (``, ; :``) in its
  second half, else at its last word boundary, else hard.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

DEFAULT_MAX_CHARS = 300

_ASCII_TERMINATORS = ".!?\u2026\u203c\u2047\u2048\u2049"  # . ! ? … ‼ ⁇ ⁈ ⁉
_CJK_TERMINATORS = "\u3002\uff01\uff1f\uff1b\uff0e\uff61"  # 。！？；．｡
_TERMINATORS = _ASCII_TERMINATORS + _CJK_TERMINATORS
_CLOSERS = "\"')]}\u201d\u2019\u00bb\u203a\uff09\u3011\u300d\u300f\u3009\u300b\u3015\u3017"
_CLAUSE_MARKS = ",;:"  # a cut after one of these needs whitespace after it
_CJK_CLAUSE_MARKS = "\uff0c\u3001\uff1b\uff1a"  # ，、；：
_BULLETS = "-*\u2022\u2023\u2013\u2014"  # - * • ‣ – —

# Abbreviations after which a period never ends a sentence: titles before names, "e.g.",
# months before a day.
_NEVER_FINAL = frozenset("""
    mr mrs ms mx dr prof st mt rev hon gen col capt cpt lt sgt maj gov sen rep pres fr
    e.g i.e cf vs viz approx ca dept est
    jan feb mar apr jun jul aug sep sept oct nov dec
""".split())
# Abbreviations that end a sentence only when a capital letter follows ("... etc. Then").
_MAYBE_FINAL = frozenset("etc inc ltd co corp jr sr bros ph.d a.m p.m".split())
# Abbreviations that are not final before a number ("No. 5", "Fig. 3").
_BEFORE_NUMBER = frozenset("no nr nos vol fig ch art sec p pp op".split())
_DOTTED_ACRONYM = re.compile(r"(?:[a-z]\.)+[a-z]")  # u.s, d.c, e.u


@dataclass(frozen=True)
class Sentence:
    """One sentence, whitespace collapsed.

    ``paragraph_end``: a blank line follows (callers pause longer). ``terminated``: it ends
    with sentence punctuation, rather than being cut for length or ended by a line break.
    """

    text: str
    paragraph_end: bool = False
    terminated: bool = True

    def __str__(self) -> str:
        return self.text


def split_sentences(text: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[Sentence]:
    """The sentences of a complete text."""
    buffer = SentenceBuffer(max_chars)
    return buffer.feed(text) + buffer.flush()


class SentenceBuffer:
    """Text arriving in pieces -> sentences, each released once what follows proves it ended.

    ``feed`` returns the sentences that the text so far completes; ``flush`` (at the end of
    the text) returns the rest. Any split of the same text gives the same sentences.
    """

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        if max_chars < 20:
            raise ValueError(f"max_chars must be at least 20, got {max_chars}")
        self.max_chars = max_chars
        self._text = ""

    @property
    def pending(self) -> str:
        """Text received but not yet part of a released sentence."""
        return self._text

    def feed(self, piece: str) -> list[Sentence]:
        self._text += piece
        return self._drain(final=False)

    def flush(self) -> list[Sentence]:
        out = self._drain(final=True)
        self._text = ""
        return out

    def _drain(self, final: bool) -> list[Sentence]:
        out = []
        start = 0
        while (found := _next_sentence(self._text, start, final, self.max_chars)) is not None:
            sentence, start = found
            if sentence is None:
                break
            out.append(sentence)
        self._text = self._text[start:]
        return out


# --- the scanner ---------------------------------------------------------------------------
#
# ``_next_sentence(text, start, final, max_chars)`` looks for the end of the sentence that
# starts at ``start``. It returns ``(sentence, next_start)``; ``(None, next_start)`` when only
# whitespace is left; or ``None`` when the answer depends on text not yet received (never
# when ``final``). Every decision it makes with ``final=False`` would be the same after more
# text arrives: that is the whole guarantee, so each check below either decides from what
# it can see or returns _UNDECIDED.

_UNDECIDED = None


def _next_sentence(text: str, start: int, final: bool,
                   max_chars: int) -> tuple[Sentence | None, int] | None:
    n = len(text)
    s = _skip_space(text, start)
    if s == n:
        return (None, s)  # only whitespace: consumed, nothing to say yet
    limit = s + max_chars  # the sentence's text must end at or before this index
    i = s
    while i < n and i <= limit:
        c = text[i]
        if c in _TERMINATORS:
            found = _after_terminator(text, s, i, final)
            if found is _UNDECIDED:
                return None
            end, nxt, paragraph = found
            if end is None:
                i = nxt  # not a boundary: scan on from after the run
                continue
            if end > limit:
                return _cut(text, s, limit)  # it ends too late
            return _make(text, s, end, paragraph, nxt)
        if c == "\n":
            found = _after_line_break(text, i, final)
            if found is _UNDECIDED:
                return None
            boundary, nxt, paragraph = found
            if boundary:
                return _make(text, s, i, paragraph, nxt)
            i = nxt
            continue
        i += 1
    if i > limit:
        return _cut(text, s, limit)
    if not final:
        return None
    return _make(text, s, n, False, n)


def _make(text: str, s: int, end: int, paragraph: bool, nxt: int) -> tuple[Sentence, int]:
    body = " ".join(text[s:end].split())
    return Sentence(body, paragraph_end=paragraph, terminated=_ends_with_terminator(body)), nxt


def _ends_with_terminator(body: str) -> bool:
    stripped = body.rstrip(_CLOSERS)
    return bool(stripped) and stripped[-1] in _TERMINATORS


def _skip_space(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i].isspace():
        i += 1
    return i


def _after_terminator(text: str, s: int, i: int, final: bool
                      ) -> tuple[int | None, int, bool] | None:
    """At a terminator: ``(end, next_start, paragraph)`` if the sentence ends after it,
    ``(None, resume_at, False)`` if not, _UNDECIDED if that depends on text not yet seen."""
    n = len(text)
    j = i
    while j < n and text[j] in _TERMINATORS:
        j += 1
    run_end = j
    while j < n and text[j] in _CLOSERS:
        j += 1
    end = j
    if end == n:
        # More terminators or closers may follow; at the very end the text's end ends it.
        return (end, n, False) if final else _UNDECIDED
    run = text[i:run_end]
    w = _skip_space(text, end)
    if w == n and not final:
        return _UNDECIDED  # need the next character (and whether a blank line comes first)
    if any(ch in _CJK_TERMINATORS for ch in run):
        return end, w, w < n and _has_blank_line(text, end, w)
    if w == end:
        return None, end, False  # no whitespace after it: 3.5, v1.2, "wait...what"
    if w == n:
        return end, n, False  # only whitespace left: the last sentence
    if _has_blank_line(text, end, w):
        return end, w, True
    nxt = text[w]
    if nxt.islower():
        return None, end, False  # "Yahoo! is", "wait... and", "approx. five"
    if run == ".":
        if not _period_ends(text, s, i, nxt):
            return None, end, False
    return end, w, False


def _period_ends(text: str, s: int, i: int, nxt: str) -> bool:
    """Whether the single period at ``i``, followed by whitespace and ``nxt`` (not
    lower-case), ends the sentence: it doesn't after an abbreviation, an initial or a list
    number."""
    k = i
    while k > s and (text[k - 1].isalnum() or text[k - 1] in ".'\u2019"):
        k -= 1
    word = text[k:i].lower()
    if not word:
        return True  # after a quote or a bracket: 'said "stop". Then'
    if word in _NEVER_FINAL:
        return False
    if word in _BEFORE_NUMBER and nxt.isdigit():
        return False
    if word in _MAYBE_FINAL or _DOTTED_ACRONYM.fullmatch(word):
        return nxt.isupper()
    if len(word) == 1 and word.isalpha():
        return False  # an initial: "J. R. R. Tolkien", "John F. Kennedy"
    if word.isdigit() and not text[s:k].strip():
        return False  # a numbered list item: "1. Milk"
    return True


def _after_line_break(text: str, i: int, final: bool) -> tuple[bool, int, bool] | None:
    """At a line break: ``(boundary, next_start, paragraph)`` or _UNDECIDED."""
    n = len(text)
    w = _skip_space(text, i)
    if w == n:
        if not final:
            return _UNDECIDED
        return False, n, False  # trailing whitespace: the end of the text ends the sentence
    if _has_blank_line(text, i, w):
        return True, w, True
    item = _starts_list_item(text, w, final)
    if item is _UNDECIDED:
        return _UNDECIDED
    return (True, w, False) if item else (False, w, False)


def _has_blank_line(text: str, a: int, b: int) -> bool:
    return text.count("\n", a, b) >= 2


def _starts_list_item(text: str, w: int, final: bool) -> bool | None:
    """``- item``, ``* item``, ``• item``, ``12. item``, ``3) item`` at ``w``."""
    n = len(text)
    if text[w] in _BULLETS:
        if w + 1 == n:
            return False if final else _UNDECIDED
        return text[w + 1].isspace()
    j = w
    while j < n and j - w < 3 and text[j].isdigit():
        j += 1
    if j == w:
        return False
    if j == n:
        return False if final else _UNDECIDED
    if text[j] not in ".)":
        return False
    if j + 1 == n:
        return False if final else _UNDECIDED
    return text[j + 1].isspace()


def _cut(text: str, s: int, limit: int) -> tuple[Sentence, int]:
    """A sentence too long to wait for its end: cut where a speaker would take a breath.
    Looks only at ``text[s:limit + 1]``, which the caller has made sure exists."""
    half = s + (limit - s) // 2
    for k in range(limit, half - 1, -1):
        prev = text[k - 1]
        if prev in _CJK_CLAUSE_MARKS or (prev in _CLAUSE_MARKS and text[k].isspace()):
            return _make(text, s, k, False, k)
    for k in range(limit, s, -1):
        if (text[k].isspace() and not text[k - 1].isspace()) or (
                _is_cjk(text[k - 1]) and _is_cjk(text[k])):
            return _make(text, s, k, False, k)
    return _make(text, s, limit, False, limit)


def _is_cjk(ch: str) -> bool:
    """Ideographs, kana and hangul: scripts written without spaces between words."""
    return unicodedata.category(ch) == "Lo" and unicodedata.name(ch, "").startswith(
        ("CJK", "HIRAGANA", "KATAKANA", "HANGUL"))

"""Inline control of speech: an SSML subset, and the same as bracket tags in plain text.

Both parse into one flat list of typed segments, so nothing downstream knows which syntax a
request used:

* SSML (``fmt="ssml"``): ``<speak> <p> <s> <break> <prosody rate> <emphasis> <voice>
  <lang> <say-as> <sub>``, parsed with ``xml.etree`` (a fragment without ``<speak>`` is wrapped
  in one). Malformed XML raises ``MarkupError`` with the line and column; callers choose to
  report it or to speak the text plainly. Elements we don't support keep their text and
  add a warning.
* Bracket tags in plain text (``fmt="text"``): ``[pause 300ms]`` ``[pause 1s]``
  ``[rate 0.8]`` ``[voice NAME]`` ``[emphasis]…[/emphasis]`` (``[emphasis strong]``) and the
  Chinese forms ``【停顿0.3秒】`` ``【慢速】`` ``【快速】`` ``【强调】…【/强调】``. A rate or voice
  applies until the next one or the end; an emphasis until its closing tag or the end of the
  sentence. Brackets that are not one of these (``[sic]``, ``【注意】``) are ordinary text
  and are spoken.

Emphasis is rendered the way speakers stress a word: slower, louder, and (strong) set off by
a short pause before it; ``reduced`` the other way, ``none`` as plain text (``EMPHASIS``).

Markup never turns text into silence: unknown or broken tags keep their text.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from typing import Literal

from ..errors import TtsError
from .say_as import say_as

TextFormat = Literal["text", "ssml"]

MAX_PAUSE = 10.0  # seconds; a longer pause is most likely a unit mistake
MIN_RATE, MAX_RATE = 0.25, 4.0  # speed factors
RATE_WORDS = {"x-slow": 0.5, "slow": 0.8, "medium": 1.0, "default": 1.0, "normal": 1.0,
              "fast": 1.25, "x-fast": 1.5}
BREAK_STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.2, "medium": 0.4, "strong": 0.7,
                   "x-strong": 1.0}


@dataclass(frozen=True)
class Emphasis:
    """How an emphasis level sounds: a speed factor, a gain, a pause before (seconds)."""

    rate: float
    gain: float
    pause: float = 0.0


EMPHASIS = {
    "strong": Emphasis(0.8, 1.4, 0.12),  # +2.9 dB
    "moderate": Emphasis(0.88, 1.25),  # +1.9 dB; SSML's default level
    "reduced": Emphasis(1.1, 0.75),  # -2.5 dB
    "none": Emphasis(1.0, 1.0),
}


class MarkupError(TtsError, ValueError):
    """The SSML is not well-formed XML (or not acceptable as SSML)."""


@dataclass(frozen=True)
class Speech:
    """Text to speak. ``voice``/``language`` None: the request's; ``rate`` is a speed
    factor (0.8 = 80 % speed); ``gain`` scales the audio (emphasis); ``say_as`` names the
    SSML interpretation already applied."""

    text: str
    voice: str | None = None
    language: str | None = None
    rate: float = 1.0
    say_as: str | None = None
    gain: float = 1.0


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class SentenceBreak:
    """An explicit sentence end (SSML ``<s>``): the sentence pause follows."""


@dataclass(frozen=True)
class ParagraphBreak:
    """An explicit paragraph end (SSML ``<p>``): the paragraph pause follows."""


Segment = Speech | Pause | SentenceBreak | ParagraphBreak


@dataclass(frozen=True)
class Markup:
    segments: tuple[Segment, ...]
    warnings: tuple[str, ...] = ()


def parse(text: str, fmt: TextFormat = "text", language: str | None = None) -> Markup:
    """``language``: what ``say-as`` dates and times are written out in when the markup
    doesn't say (the voice's language)."""
    if fmt == "ssml":
        return parse_ssml(text, language)
    if fmt == "text":
        return parse_tags(text)
    raise ValueError(f"unknown text format {fmt!r}: use 'text' or 'ssml'")


# --- bracket tags -------------------------------------------------------------------------

_TAG = re.compile(
    r"\[\s*(pause|break|rate|speed|voice|emphasis|/\s*emphasis)(?:\s+([^\[\]]*?))?\s*\]"
    r"|\u3010([^\u3010\u3011]*)\u3011",  # 【...】
    re.IGNORECASE)
_DURATION = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|sec|secs|seconds?|毫秒|秒)?",
                       re.IGNORECASE)
_CHINESE_PAUSE = re.compile(r"(?:停顿|暂停|停)\s*(.+)")
_CHINESE_RATES = {"慢速": 0.8, "快速": 1.25, "常速": 1.0, "正常语速": 1.0, "正常速度": 1.0}
_CHINESE_EMPHASIS = {"强调": "moderate", "重读": "strong"}
_CHINESE_EMPHASIS_END = {"/强调", "强调结束", "/重读", "重读结束"}


@dataclass
class TagParser:
    """Bracket tags in plain text. ``voice`` and ``rate`` carry over from one ``parse`` call
    to the next, so text streamed sentence by sentence keeps a ``[rate 0.8]`` from an
    earlier sentence."""

    voice: str | None = None
    rate: float = 1.0
    warnings: list[str] = field(default_factory=list)
    emphasis: Emphasis | None = None  # until its closing tag or the end of the sentence

    def parse(self, text: str) -> Markup:
        out: list[Segment] = []
        warnings: list[str] = []
        pos = 0
        for m in _TAG.finditer(text):
            before = text[pos:m.start()]
            handled = self._tag(m, out, warnings, before)
            if handled:
                pos = m.end()
        self._speech(text[pos:], out)
        self.emphasis = None
        self.warnings += warnings
        return Markup(tuple(out), tuple(warnings))

    def _speech(self, text: str, out: list[Segment]) -> None:
        body = " ".join(text.split())
        if body:
            e = self.emphasis or EMPHASIS["none"]
            out.append(Speech(body, self.voice, None, round(self.rate * e.rate, 4),
                              gain=e.gain))

    def _emphasize(self, level: str | None, out: list[Segment]) -> None:
        """Start an emphasis (``level`` a key of EMPHASIS), or end it (None)."""
        self.emphasis = None if level is None else EMPHASIS[level]
        if self.emphasis is not None and self.emphasis.pause:
            out.append(Pause(self.emphasis.pause))

    def _tag(self, m: re.Match[str], out: list[Segment], warnings: list[str],
             before: str) -> bool:
        """Apply one tag; False if it isn't one of ours (its text is then spoken)."""
        keyword, arg, chinese = m.group(1), (m.group(2) or "").strip(), m.group(3)
        if chinese is not None:
            word = chinese.strip()
            if word in _CHINESE_EMPHASIS or word in _CHINESE_EMPHASIS_END:
                self._speech(before, out)
                self._emphasize(_CHINESE_EMPHASIS.get(word), out)
                return True
            if word in _CHINESE_RATES:
                self._speech(before, out)
                self.rate = _CHINESE_RATES[word]
                return True
            pause = _CHINESE_PAUSE.fullmatch(word)
            if pause is None:
                return False  # 【注意】 and the like: ordinary text
            self._speech(before, out)
            seconds = _seconds(pause.group(1), m.group(0), warnings)
            if seconds:
                out.append(Pause(seconds))
            return True
        self._speech(before, out)
        kw = keyword.lower()
        if kw in ("pause", "break"):
            seconds = _seconds(arg, m.group(0), warnings)
            if seconds:
                out.append(Pause(seconds))
        elif kw in ("rate", "speed"):
            rate = _rate(arg, 1.0, m.group(0), warnings)
            if rate is not None:
                self.rate = rate
        elif kw == "emphasis":
            self._emphasize(_emphasis_level(arg or "moderate", m.group(0), warnings), out)
        elif kw.startswith("/"):  # [/emphasis]
            self._emphasize(None, out)
        else:  # voice
            self.voice = None if arg.lower() in ("", "default") else arg
        return True


def parse_tags(text: str) -> Markup:
    return TagParser().parse(text)


def _seconds(value: str, where: str, warnings: list[str]) -> float | None:
    m = _DURATION.fullmatch(value.strip())
    if m is None:
        warnings.append(f"{where}: can't read {value!r} as a duration (write 300ms or 1.5s); "
                        "no pause made")
        return None
    seconds = float(m.group(1)) / (1000.0 if (m.group(2) or "").lower() in ("ms", "毫秒")
                                   else 1.0)
    if seconds > MAX_PAUSE:
        warnings.append(f"{where}: pause shortened to the maximum, {MAX_PAUSE:g} s")
        seconds = MAX_PAUSE
    return seconds


def _emphasis_level(value: str, where: str, warnings: list[str]) -> str:
    level = value.strip().lower()
    if level in EMPHASIS:
        return level
    warnings.append(f"{where}: emphasis level {value!r} is not one of "
                    f"{', '.join(EMPHASIS)}; using moderate")
    return "moderate"


def _rate(value: str, enclosing: float, where: str, warnings: list[str]) -> float | None:
    """A speed factor from ``0.8``, ``80%``, ``+10%`` (relative) or a word (``slow``)."""
    v = value.strip().lower()
    try:
        if v in RATE_WORDS:
            rate = RATE_WORDS[v]
        elif v.endswith("%") and v[:1] in "+-":
            rate = enclosing * (1.0 + float(v[:-1]) / 100.0)
        elif v.endswith("%"):
            rate = float(v[:-1]) / 100.0
        else:
            rate = float(v)
    except ValueError:
        warnings.append(f"{where}: can't read {value!r} as a rate (write 0.8, 80% or slow); "
                        "rate unchanged")
        return None
    rate = round(rate, 4)
    if not MIN_RATE <= rate <= MAX_RATE:
        clamped = min(MAX_RATE, max(MIN_RATE, rate))
        warnings.append(f"{where}: rate {rate:g} is outside {MIN_RATE:g}..{MAX_RATE:g}; "
                        f"using {clamped:g}")
        rate = clamped
    return rate


# --- SSML ---------------------------------------------------------------------------------

_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
_SPEAK_START = re.compile(r"<(?:\?xml|speak[\s>/])")
_FORBIDDEN = re.compile(r"<!(?:DOCTYPE|ENTITY)", re.IGNORECASE)
_WRAP = "<speak>"


@dataclass(frozen=True)
class _Ctx:
    voice: str | None = None
    language: str | None = None
    rate: float = 1.0
    gain: float = 1.0


def parse_ssml(text: str, language: str | None = None) -> Markup:
    """SSML document or fragment -> segments. Raises MarkupError if it isn't well-formed."""
    src = text.lstrip("\ufeff").strip()
    if _FORBIDDEN.search(src):
        raise MarkupError("SSML with a DOCTYPE or ENTITY declaration is not accepted; "
                          "remove it (use &amp; &lt; &gt; &quot; &apos; or &#NNN; for "
                          "special characters)")
    wrapped = _SPEAK_START.match(src) is None
    doc = f"{_WRAP}{src}</speak>" if wrapped else src
    try:
        root = ET.fromstring(doc)
    except ET.ParseError as e:
        line, col = e.position
        if wrapped and line == 1:
            col -= len(_WRAP)
        reason = str(e).rsplit(": line", 1)[0]
        lines = src.split("\n")
        if line < len(lines) or (line == len(lines) and col < len(lines[-1])):
            where = f"at line {line}, column {max(col, 0) + 1}: {reason}"
        else:
            where = f"at the end of the text: {reason}, an element is not closed"
        raise MarkupError(f"malformed SSML {where} (check that every tag is closed and "
                          "write & as &amp;)") from e
    walker = _Walker(language)
    if _local(root.tag) != "speak":
        walker.warn(f"the root element is <{_local(root.tag)}>, not <speak>; read as <speak>")
    walker.children(root, walker.context(root, _Ctx()))
    return Markup(tuple(walker.finish()), tuple(walker.warnings))


def _local(tag: object) -> str:
    return str(tag).rsplit("}", 1)[-1].lower()


class _Walker:
    def __init__(self, language: str | None) -> None:
        self.default_language = language
        self.out: list[Segment] = []
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def context(self, el: ET.Element, ctx: _Ctx) -> _Ctx:
        lang = el.get(_XML_LANG)
        return replace(ctx, language=lang.strip()) if lang and lang.strip() else ctx

    def text(self, text: str | None, ctx: _Ctx, say_as: str | None = None) -> None:
        body = " ".join((text or "").split())
        if body:
            self.out.append(Speech(body, ctx.voice, ctx.language, ctx.rate, say_as, ctx.gain))

    def boundary(self, mark: SentenceBreak | ParagraphBreak) -> None:
        if not self.out:
            return
        last = self.out[-1]
        if isinstance(last, ParagraphBreak):
            return
        if isinstance(last, SentenceBreak):
            if isinstance(mark, ParagraphBreak):
                self.out[-1] = mark
            return
        self.out.append(mark)

    def finish(self) -> list[Segment]:
        while self.out and isinstance(self.out[-1], SentenceBreak | ParagraphBreak):
            self.out.pop()
        return self.out

    def children(self, el: ET.Element, ctx: _Ctx) -> None:
        self.text(el.text, ctx)
        for child in el:
            self.element(child, ctx)
            self.text(child.tail, ctx)

    def element(self, el: ET.Element, outer: _Ctx) -> None:
        tag = _local(el.tag)
        ctx = self.context(el, outer)
        if tag in ("p", "paragraph", "s", "sentence"):
            mark = ParagraphBreak() if tag.startswith("p") else SentenceBreak()
            self.boundary(mark)
            self.children(el, ctx)
            self.boundary(mark)
        elif tag == "break":
            self.pause(el)
        elif tag == "prosody":
            self.children(el, self.prosody(el, ctx))
        elif tag == "emphasis":
            self.children(el, self.emphasis(el, ctx))
        elif tag == "voice":
            self.children(el, self.voice(el, ctx))
        elif tag in ("speak", "lang"):
            self.children(el, ctx)
        elif tag == "say-as":
            self.say_as(el, ctx)
        elif tag == "sub":
            alias = (el.get("alias") or "").strip()
            if not alias:
                self.warn("<sub> without an alias: its text is spoken")
            self.text(alias or "".join(el.itertext()), ctx)
        elif tag in ("mark", "desc", "meta", "metadata", "lexicon"):
            pass  # no sound of their own
        elif tag in ("phoneme", "audio"):
            self.warn(f"<{tag}> is not supported: its text is spoken plainly")
            self.children(el, ctx)
        else:
            self.warn(f"unknown element <{tag}> ignored: its text is spoken")
            self.children(el, ctx)

    def pause(self, el: ET.Element) -> None:
        time, strength = el.get("time"), el.get("strength")
        seconds: float | None = None
        if time is not None:
            m = re.fullmatch(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s)\s*", time, re.IGNORECASE)
            if m is None:
                self.warn(f'<break time="{time}">: write the time as 300ms or 1.5s; '
                          "using a medium break")
            else:
                seconds = float(m.group(1)) / (1000.0 if m.group(2).lower() == "ms" else 1.0)
        if seconds is None and strength is not None:
            seconds = BREAK_STRENGTHS.get(strength.strip().lower())
            if seconds is None:
                self.warn(f'<break strength="{strength}">: use one of '
                          f"{', '.join(BREAK_STRENGTHS)}; using medium")
        if seconds is None:
            seconds = BREAK_STRENGTHS["medium"]
        if seconds > MAX_PAUSE:
            self.warn(f"<break> shortened to the maximum, {MAX_PAUSE:g} s")
            seconds = MAX_PAUSE
        if seconds > 0:
            self.out.append(Pause(seconds))

    def prosody(self, el: ET.Element, ctx: _Ctx) -> _Ctx:
        for attr in sorted(set(el.keys()) - {"rate", _XML_LANG}):
            self.warn(f"<prosody {attr}> is not supported: ignored")
        value = el.get("rate")
        if value is None:
            return ctx
        rate = _rate(value, ctx.rate, f'<prosody rate="{value}">', self.warnings)
        return ctx if rate is None else replace(ctx, rate=rate)

    def emphasis(self, el: ET.Element, ctx: _Ctx) -> _Ctx:
        value = el.get("level")
        where = f'<emphasis level="{value}">'
        e = EMPHASIS[_emphasis_level(value or "moderate", where, self.warnings)]
        if e.pause:
            self.out.append(Pause(e.pause))
        rate = min(MAX_RATE, max(MIN_RATE, round(ctx.rate * e.rate, 4)))
        return replace(ctx, rate=rate, gain=ctx.gain * e.gain)

    def voice(self, el: ET.Element, ctx: _Ctx) -> _Ctx:
        for attr in sorted(set(el.keys()) - {"name", "language", "languages", _XML_LANG}):
            self.warn(f"<voice {attr}> is not supported: use name or language")
        name = (el.get("name") or "").strip()
        langs = (el.get("language") or el.get("languages") or "").split()
        if name:
            ctx = replace(ctx, voice=name)
        if langs and el.get(_XML_LANG) is None:
            ctx = replace(ctx, language=langs[0])
        return ctx

    def say_as(self, el: ET.Element, ctx: _Ctx) -> None:
        kind = (el.get("interpret-as") or "").strip().lower()
        content = " ".join("".join(el.itertext()).split())
        language = ctx.language or self.default_language or "en"
        text, problem = say_as(content, kind, el.get("format"), language)
        if problem:
            self.warn(problem)
        self.text(text, ctx, say_as=kind or None)

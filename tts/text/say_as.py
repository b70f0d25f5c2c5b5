"""SSML ``<say-as>``: dates, times, ordinals, spelled-out letters and digits written out so that
espeak-ng reads them as meant, since it reads most of them literally otherwise."""

from __future__ import annotations

import datetime
import re

_MONTHS = ("January February March April May June July August September October November "
           "December").split()


def say_as(content: str, kind: str, fmt: str | None = None, language: str = "en"
           ) -> tuple[str, str | None]:
    """Text written out so that espeak-ng reads it as meant, and a warning if it couldn't be.

    ``characters``: letters separated by commas, because espeak reads a lone "A" as the
    article; ``digits``: digits separated by spaces; ``date``/``time``: ISO forms (or the
    ``format`` given) written out in English, Chinese, Japanese or Korean.
    """
    lang = language.replace("_", "-").lower().split("-")[0]
    if kind in ("characters", "spell-out", "letters", "verbatim"):
        return ", ".join(ch for ch in content if not ch.isspace()), None
    if kind == "digits":
        return " ".join(ch for ch in content if not ch.isspace()), None
    if kind in ("cardinal", "number", "telephone", ""):
        return content, None if kind else "<say-as> without interpret-as: text kept"
    if kind == "ordinal":
        if lang == "en" and content.isdigit():
            return content + _ordinal_suffix(int(content)), None
        return content, None
    if kind == "date":
        return _date(content, fmt, lang)
    if kind == "time":
        return _time(content, lang)
    return content, f'<say-as interpret-as="{kind}"> is not supported: text spoken as written'


def _ordinal_suffix(n: int) -> str:
    if 10 <= n % 100 <= 20:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def _date(content: str, fmt: str | None, lang: str) -> tuple[str, str | None]:
    parts = [p for p in re.split(r"[-/.\s]+", content.strip()) if p]
    order = (fmt or "").strip().lower()
    if not order and len(parts) == 3:  # ISO: 2024-01-05
        order = "ymd"
    elif not order and len(parts) == 2:  # 2024-01, --01-05
        order = "ym" if len(parts[0]) == 4 else "md"
    if len(order) != len(parts) or not all(p.isdigit() for p in parts) or set(order) - set("ymd"):
        return content, f'<say-as interpret-as="date">: can\'t read {content!r}' + (
            f' as format "{fmt}"' if fmt else " as an ISO date (2024-01-05)") + "; text kept"
    values = dict(zip(order, (int(p) for p in parts)))
    y, m, d = values.get("y"), values.get("m"), values.get("d")
    try:
        datetime.date(y or 2000, m or 1, d or 1)
    except ValueError:
        return content, f'<say-as interpret-as="date">: {content!r} is not a date; text kept'
    if lang in ("zh", "cmn", "yue", "ja"):
        return "".join(f"{v}{unit}" for v, unit in ((y, "年"), (m, "月"), (d, "日"))
                       if v is not None), None
    if lang == "ko":
        return " ".join(f"{v}{unit}" for v, unit in ((y, "년"), (m, "월"), (d, "일"))
                        if v is not None), None
    if lang != "en":
        return content, f'<say-as interpret-as="date"> is written out only for en, zh, ja ' \
                        f"and ko; {content!r} spoken as written"
    words = []
    if m is not None:
        words.append(_MONTHS[m - 1])
    if d is not None:
        words.append(f"{d}{_ordinal_suffix(d)}")
    text = " ".join(words)
    if y is not None:
        text = f"{text}, {y}" if d is not None else f"{text} {y}".strip()
    return text, None


def _time(content: str, lang: str) -> tuple[str, str | None]:
    m = re.fullmatch(r"T?(\d{1,2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?",
                     content.strip())
    if m is None or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        return content, f'<say-as interpret-as="time">: can\'t read {content!r} as hh:mm ' \
                        "or hh:mm:ss; text kept"
    h, mi = int(m.group(1)), int(m.group(2))
    s = int(m.group(3)) if m.group(3) else 0
    if lang in ("zh", "cmn", "yue"):
        return f"{h}点" + (f"{mi}分" if mi or s else "") + (f"{s}秒" if s else ""), None
    if lang == "ja":
        return f"{h}時" + (f"{mi}分" if mi or s else "") + (f"{s}秒" if s else ""), None
    if lang == "ko":
        return f"{h}시" + (f" {mi}분" if mi or s else "") + (f" {s}초" if s else ""), None
    if lang != "en":
        return content, f'<say-as interpret-as="time"> is written out only for en, zh, ja ' \
                        f"and ko; {content!r} spoken as written"
    half = "AM" if h < 12 else "PM"
    h12 = h % 12 or 12
    clock = f"{h12} {half}" if mi == 0 else (
        f"{h12} oh {mi} {half}" if mi < 10 else f"{h12}:{mi:02d} {half}")
    return clock + (f" and {s} seconds" if s else ""), None

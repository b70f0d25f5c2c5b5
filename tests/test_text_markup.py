"""Inline control: every bracket tag and SSML element -> the segments it should give;
malformed SSML -> a MarkupError that says where; unknown things keep their text."""

from __future__ import annotations

import pytest

from tts.text.markup import (
    EMPHASIS,
    Emphasis,
    Markup,
    MarkupError,
    ParagraphBreak,
    Pause,
    SentenceBreak,
    Speech,
    TagParser,
    parse,
)
from tts.text.say_as import say_as

S = Speech

TAG_CASES = [
    ("plain", "Hello there.", [S("Hello there.")]),
    ("pause-ms", "Hello [pause 300ms] world", [S("Hello"), Pause(0.3), S("world")]),
    ("pause-s", "Hello [pause 1s] world", [S("Hello"), Pause(1.0), S("world")]),
    ("pause-decimal", "A[PAUSE 1.5 s]B", [S("A"), Pause(1.5), S("B")]),
    ("pause-bare-number", "A [pause 2] B", [S("A"), Pause(2.0), S("B")]),
    ("break-alias", "A [break 250ms] B", [S("A"), Pause(0.25), S("B")]),
    ("rate", "Normal [rate 0.8] slower. Still slow", [
        S("Normal"), S("slower. Still slow", rate=0.8)]),
    ("rate-percent-word", "[rate 80%] a [rate fast] b [rate 1] c", [
        S("a", rate=0.8), S("b", rate=1.25), S("c")]),
    ("voice", "Hi [voice en_US-lessac-medium] there [voice espeak:cmn] 你好", [
        S("Hi"), S("there", voice="en_US-lessac-medium"), S("你好", voice="espeak:cmn")]),
    ("voice-reset", "[voice x] a [voice default] b", [S("a", voice="x"), S("b")]),
    ("voice-and-rate", "[voice x][rate 0.5] a", [S("a", voice="x", rate=0.5)]),
    ("chinese-pause", "你好【停顿0.3秒】世界", [S("你好"), Pause(0.3), S("世界")]),
    ("chinese-pause-ms", "你好【停顿500毫秒】世界", [S("你好"), Pause(0.5), S("世界")]),
    ("chinese-rates", "【慢速】慢慢说【快速】快点说【常速】正常", [
        S("慢慢说", rate=0.8), S("快点说", rate=1.25), S("正常")]),
    ("chinese-other-bracket", "【注意】请关门", [S("【注意】请关门")]),
    ("only-a-pause", "[pause 1s]", [Pause(1.0)]),
]


@pytest.mark.parametrize("case_id,text,expected",
                         [pytest.param(*c, id=c[0]) for c in TAG_CASES])
def test_bracket_tags(case_id: str, text: str, expected: list[object]) -> None:
    result = parse(text, "text")
    assert list(result.segments) == expected
    assert result.warnings == ()


def test_unknown_brackets_are_spoken() -> None:
    result = parse("He wrote [sic] and [1] words", "text")
    assert result.segments == (S("He wrote [sic] and [1] words"),)


def test_bad_tag_values_warn_and_keep_speech() -> None:
    result = parse("a [pause soon] b [rate quick] c [rate 10] d [pause 99s] e", "text")
    assert result.segments == (S("a"), S("b"), S("c"), S("d", rate=4.0), Pause(10.0),
                               S("e", rate=4.0))
    joined = " | ".join(result.warnings)
    assert "[pause soon]" in joined and "300ms" in joined
    assert "[rate quick]" in joined and "0.8, 80% or slow" in joined
    assert "outside 0.25..4" in joined and "maximum, 10 s" in joined


def test_tag_state_carries_across_calls() -> None:
    """Streamed text is parsed sentence by sentence; a [rate] or [voice] persists."""
    parser = TagParser()
    assert parser.parse("[rate 0.8][voice x] First.").segments == (
        S("First.", voice="x", rate=0.8),)
    assert parser.parse("Second.").segments == (S("Second.", voice="x", rate=0.8),)


SSML_CASES = [
    ("speak", "<speak>Hello there.</speak>", [S("Hello there.")]),
    ("fragment", "Hello <break time='300ms'/> world", [S("Hello"), Pause(0.3), S("world")]),
    ("namespaced",
     '<?xml version="1.0"?><speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis" '
     'xml:lang="en-US">Hi<break time="1s"/>there</speak>',
     [S("Hi", language="en-US"), Pause(1.0), S("there", language="en-US")]),
    ("break-times", '<break time="1.5s"/>a<break time="20ms"/>b<break time=".5s"/>',
     [Pause(1.5), S("a"), Pause(0.02), S("b"), Pause(0.5)]),
    ("break-strengths",
     'a<break strength="none"/>b<break strength="x-weak"/>c<break strength="weak"/>d'
     '<break strength="medium"/>e<break strength="strong"/>f<break strength="x-strong"/>g'
     "<break/>h",
     [S("a"), S("b"), Pause(0.1), S("c"), Pause(0.2), S("d"), Pause(0.4), S("e"),
      Pause(0.7), S("f"), Pause(1.0), S("g"), Pause(0.4), S("h")]),
    ("paragraphs-sentences", "<p><s>One.</s><s>Two.</s></p><p>Three</p>",
     [S("One."), SentenceBreak(), S("Two."), ParagraphBreak(), S("Three")]),
    ("prosody-words",
     '<prosody rate="x-slow">a</prosody><prosody rate="slow">b</prosody>'
     '<prosody rate="medium">c</prosody><prosody rate="fast">d</prosody>'
     '<prosody rate="x-fast">e</prosody>',
     [S("a", rate=0.5), S("b", rate=0.8), S("c"), S("d", rate=1.25), S("e", rate=1.5)]),
    ("prosody-percent-nested",
     '<prosody rate="80%">slow <prosody rate="+50%">faster</prosody> slow</prosody> normal',
     [S("slow", rate=0.8), S("faster", rate=1.2), S("slow", rate=0.8), S("normal")]),
    ("voice", '<voice name="en_US-lessac-medium">Hi</voice> <voice language="zh-CN">你好</voice>',
     [S("Hi", voice="en_US-lessac-medium"), S("你好", language="zh-CN")]),
    ("lang", '<s xml:lang="yue">你好</s><lang xml:lang="de-DE">Guten Tag</lang>',
     [S("你好", language="yue"), SentenceBreak(), S("Guten Tag", language="de-DE")]),
    ("say-as-characters", 'Code <say-as interpret-as="characters">AB1</say-as>.',
     [S("Code"), S("A, B, 1", say_as="characters"), S(".")]),
    ("say-as-spell-out", '<say-as interpret-as="spell-out">herald</say-as>',
     [S("h, e, r, a, l, d", say_as="spell-out")]),
    ("say-as-digits", '<say-as interpret-as="digits">2024</say-as>',
     [S("2 0 2 4", say_as="digits")]),
    ("say-as-date", '<say-as interpret-as="date">2024-01-05</say-as>',
     [S("January 5th, 2024", say_as="date")]),
    ("say-as-date-format", '<say-as interpret-as="date" format="dmy">22/11/2023</say-as>',
     [S("November 22nd, 2023", say_as="date")]),
    ("say-as-date-md", '<say-as interpret-as="date">--12-03</say-as>',
     [S("December 3rd", say_as="date")]),
    ("say-as-date-zh", '<speak xml:lang="zh-CN"><say-as interpret-as="date">2024-01-05'
     "</say-as></speak>", [S("2024年1月5日", language="zh-CN", say_as="date")]),
    ("say-as-time", '<say-as interpret-as="time">14:30</say-as> '
     '<say-as interpret-as="time">09:05:07</say-as> <say-as interpret-as="time">00:00</say-as>',
     [S("2:30 PM", say_as="time"), S("9 oh 5 AM and 7 seconds", say_as="time"),
      S("12 AM", say_as="time")]),
    ("say-as-ordinal", '<say-as interpret-as="ordinal">22</say-as>',
     [S("22nd", say_as="ordinal")]),
    ("sub", 'The <sub alias="World Wide Web">WWW</sub> is big',
     [S("The"), S("World Wide Web"), S("is big")]),
    ("mark-ignored", 'a<mark name="x"/>b', [S("a"), S("b")]),
    ("entities", "Tom &amp; Jerry &lt;3 &#x4F60;", [S("Tom & Jerry <3 你")]),
]


@pytest.mark.parametrize("case_id,text,expected",
                         [pytest.param(*c, id=c[0]) for c in SSML_CASES])
def test_ssml(case_id: str, text: str, expected: list[object]) -> None:
    result = parse(text, "ssml")
    assert list(result.segments) == expected
    assert result.warnings == ()


def test_say_as_language_from_the_caller() -> None:
    """The voice's language decides how a date or a time is written out."""
    result = parse('<say-as interpret-as="time">14:30</say-as>', "ssml", language="zh_CN")
    assert result.segments == (S("14点30分", say_as="time"),)
    assert say_as("2024-01-05", "date", None, "ja_JP") == ("2024年1月5日", None)


@pytest.mark.parametrize("text,warning,segments", [
    ("<speak>a <foo>b</foo> c</speak>", "unknown element <foo>", [S("a"), S("b"), S("c")]),
    ('<emphasis level="shouty">loud</emphasis>', "using moderate",
     [S("loud", rate=0.88, gain=1.25)]),
    ('<prosody pitch="+10%">hi</prosody>', "<prosody pitch> is not supported", [S("hi")]),
    ('<voice gender="female">hi</voice>', "<voice gender> is not supported", [S("hi")]),
    ('<break time="soon"/>x', "300ms or 1.5s", [Pause(0.4), S("x")]),
    ('<break time="60s"/>x', "maximum, 10 s", [Pause(10.0), S("x")]),
    ('<prosody rate="warp">x</prosody>', "can't read 'warp' as a rate", [S("x")]),
    ('<say-as interpret-as="date">yesterday</say-as>', "can't read 'yesterday'",
     [S("yesterday", say_as="date")]),
    ('<say-as interpret-as="date">2023-02-30</say-as>', "is not a date",
     [S("2023-02-30", say_as="date")]),
    ('<say-as interpret-as="time">25:00</say-as>', "hh:mm", [S("25:00", say_as="time")]),
    ('<say-as interpret-as="currency">$5</say-as>', "not supported", [S("$5", say_as="currency")]),
    ('<sub>WWW</sub>', "without an alias", [S("WWW")]),
    ("<root>text</root>", None, [S("text")]),  # fragment: <root> is an unknown element
])
def test_ssml_unsupported_keeps_text(text: str, warning: str | None, segments: list[object]
                                     ) -> None:
    result = parse(text, "ssml")
    assert list(result.segments) == segments
    if warning:
        assert any(warning in w for w in result.warnings), result.warnings


def test_root_other_than_speak() -> None:
    result = parse('<?xml version="1.0"?><doc>hello</doc>', "ssml")
    assert result.segments == (S("hello"),)
    assert "not <speak>" in result.warnings[0]


@pytest.mark.parametrize("text,where,reason", [
    ("Hello <break time='1s'> world", "at the end of the text", "not closed"),
    ("Tom & Jerry", "line 1, column 6", "not well-formed"),
    ("<speak>\n  Hello <b>there</c>\n</speak>", "line 2, column 19", "mismatched tag"),
    ("<speak>unclosed", "at the end of the text", "no element found"),
    ('<speak><break time="1s></speak>', "line 1", "not well-formed"),
    ('<!DOCTYPE x [<!ENTITY a "b">]><speak>&a;</speak>', "", "DOCTYPE or ENTITY"),
])
def test_malformed_ssml(text: str, where: str, reason: str) -> None:
    with pytest.raises(MarkupError) as info:
        parse(text, "ssml")
    message = str(info.value)
    assert where in message and reason in message, message
    assert "&amp;" in message  # says how to fix the commonest mistake


def test_plain_text_is_never_parsed_as_ssml() -> None:
    assert parse("Tom & Jerry <3", "text") == Markup((S("Tom & Jerry <3"),))
    with pytest.raises(ValueError, match="'text' or 'ssml'"):
        parse("x", "html")  # type: ignore[arg-type]


# --- emphasis ------------------------------------------------------------------------------

STRONG, MODERATE, REDUCED = EMPHASIS["strong"], EMPHASIS["moderate"], EMPHASIS["reduced"]


def test_emphasis_levels_sound_as_stress_does() -> None:
    """Stronger emphasis is slower and louder; reduced is the other way; none is plain."""
    assert STRONG.rate < MODERATE.rate < 1.0 < REDUCED.rate
    assert STRONG.gain > MODERATE.gain > 1.0 > REDUCED.gain
    assert STRONG.pause > 0 and EMPHASIS["none"] == Emphasis(1.0, 1.0)


@pytest.mark.parametrize("level,segments", [
    ("strong", [S("Close the"), Pause(STRONG.pause), S("window", rate=0.8, gain=1.4), S("now.")]),
    ("moderate", [S("Close the"), S("window", rate=0.88, gain=1.25), S("now.")]),
    ("reduced", [S("Close the"), S("window", rate=1.1, gain=0.75), S("now.")]),
    ("none", [S("Close the"), S("window"), S("now.")]),
])
def test_ssml_emphasis(level: str, segments: list[object]) -> None:
    result = parse(f'Close the <emphasis level="{level}">window</emphasis> now.', "ssml")
    assert list(result.segments) == segments and result.warnings == ()


def test_ssml_emphasis_default_level_and_nesting() -> None:
    result = parse('<prosody rate="50%"><emphasis>slow and loud</emphasis></prosody>', "ssml")
    assert result.segments == (S("slow and loud", rate=0.44, gain=1.25),)


@pytest.mark.parametrize("text,segments", [
    ("Close the [emphasis]window[/emphasis] now.",
     [S("Close the"), S("window", rate=0.88, gain=1.25), S("now.")]),
    ("Close the [emphasis strong]window[/emphasis] now.",
     [S("Close the"), Pause(STRONG.pause), S("window", rate=0.8, gain=1.4), S("now.")]),
    ("请把【强调】窗户【/强调】关上。", [S("请把"), S("窗户", rate=0.88, gain=1.25), S("关上。")]),
    ("请把【重读】窗户【重读结束】关上。",
     [S("请把"), Pause(STRONG.pause), S("窗户", rate=0.8, gain=1.4), S("关上。")]),
    ("[rate 0.5] a [emphasis]b[/emphasis] c", [S("a", rate=0.5), S("b", rate=0.44, gain=1.25),
                                               S("c", rate=0.5)]),
    ("【注意】门开着。", [S("【注意】门开着。")]),  # other brackets are still text
])
def test_emphasis_tags(text: str, segments: list[object]) -> None:
    result = parse(text)
    assert list(result.segments) == segments and result.warnings == ()


def test_unclosed_emphasis_tag_ends_with_the_sentence() -> None:
    tags = TagParser()
    assert tags.parse("【强调】小心台阶。").segments == (S("小心台阶。", rate=0.88, gain=1.25),)
    assert tags.parse("然后开灯。").segments == (S("然后开灯。"),)
    bad = parse("[emphasis loudly]x[/emphasis]")
    assert bad.segments == (S("x", rate=0.88, gain=1.25),)
    assert any("using moderate" in w for w in bad.warnings)

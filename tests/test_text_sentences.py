"""The sentence splitter: a table of hard cases, and for every case the incremental splitter
fed in every 2-way split, in 1-character pieces and in random pieces gives exactly the
sentences of the whole text."""

from __future__ import annotations

import random

import pytest

from tts.text.sentences import Sentence, SentenceBuffer, split_sentences

LONG_WORDS = " ".join(f"word{i}" for i in range(80))  # ~500 characters, no punctuation
LONG_CLAUSES = ("we walked along the river for a while, " * 10).strip() + " and then home"
LONG_CJK = "我们沿着河边走了很久" * 40  # 400 characters without any punctuation

# (id, text, expected sentence texts)
CASES: list[tuple[str, str, list[str]]] = [
    ("simple", "Turn on the lights. Is the door locked? Wow!",
     ["Turn on the lights.", "Is the door locked?", "Wow!"]),
    ("titles", "Dr. Smith met Mr. and Mrs. Jones at St. Mary's. They talked.",
     ["Dr. Smith met Mr. and Mrs. Jones at St. Mary's.", "They talked."]),
    ("eg-ie-etc", "Bring fruit, e.g. apples, i.e. the red ones, etc. and bread. Go now.",
     ["Bring fruit, e.g. apples, i.e. the red ones, etc. and bread.", "Go now."]),
    ("etc-final", "We need eggs, milk, etc. Then we leave.",
     ["We need eggs, milk, etc.", "Then we leave."]),
    ("am-pm", "It starts at 10:30 a.m. in room 221B. It ends at 5 p.m. Then we eat.",
     ["It starts at 10:30 a.m. in room 221B.", "It ends at 5 p.m.", "Then we eat."]),
    ("months", "Paid $42.50 on Jan. 5th, 2024 and Sept. 3rd. Done.",
     ["Paid $42.50 on Jan. 5th, 2024 and Sept. 3rd.", "Done."]),
    ("us", "They met in Washington, D.C. yesterday. I live in the U.S. Then I moved.",
     ["They met in Washington, D.C. yesterday.", "I live in the U.S.", "Then I moved."]),
    ("decimals-versions", "Set it to 21.5 degrees. Version v1.2.0 fixes 3.5 bugs. Ok.",
     ["Set it to 21.5 degrees.", "Version v1.2.0 fixes 3.5 bugs.", "Ok."]),
    ("number-at-end", "I counted to 3. Then I stopped.", ["I counted to 3.", "Then I stopped."]),
    ("times", "The alarm rang at 06:45:30. Wake up.", ["The alarm rang at 06:45:30.", "Wake up."]),
    ("initials", "J. R. R. Tolkien and John F. Kennedy. Both famous.",
     ["J. R. R. Tolkien and John F. Kennedy.", "Both famous."]),
    ("no-number", "See No. 5 and Fig. 3 for details. Thanks.",
     ["See No. 5 and Fig. 3 for details.", "Thanks."]),
    ("quotes", 'He said "stop." Then he left. She asked (why?) Nobody knew.',
     ['He said "stop."', "Then he left.", "She asked (why?)", "Nobody knew."]),
    ("quote-lowercase", '"Stop!" he said. \u201cWhy?\u201d She frowned.',
     ['"Stop!" he said.', "\u201cWhy?\u201d", "She frowned."]),
    ("ellipsis", "Wait... what? I see\u2026 Then go. Well... and so on.",
     ["Wait... what?", "I see\u2026", "Then go.", "Well... and so on."]),
    ("interrobang", "Really?! Yes!!! ok then.", ["Really?!", "Yes!!! ok then."]),
    ("cjk", "你好。今天天气很好！你要去哪里？我去公园；然后回家。",
     ["你好。", "今天天气很好！", "你要去哪里？", "我去公园；", "然后回家。"]),
    ("cjk-quotes-mixed", "他说：「好。」Then we left. 再见！",
     ["他说：「好。」", "Then we left.", "再见！"]),
    ("japanese", "こんにちは。元気ですか？", ["こんにちは。", "元気ですか？"]),
    ("line-breaks", "First line\ncontinues here. Second.\nThird line", [
        "First line continues here.", "Second.", "Third line"]),
    ("paragraphs", "Title\n\nBody one. Body two.\n  \n\nLast", [
        "Title", "Body one.", "Body two.", "Last"]),
    ("list", "Buy:\n- milk\n- eggs\n1. soon\n2) later", [
        "Buy:", "- milk", "- eggs", "1. soon", "2) later"]),
    ("list-number-start", "1. Milk is needed. 2. Eggs too.",
     ["1. Milk is needed.", "2. Eggs too."]),
    ("whitespace", "  \n Hello   there.\t\tBye.  \n ", ["Hello there.", "Bye."]),
    ("no-terminator", "just some words", ["just some words"]),
    ("long-words", LONG_WORDS, None),  # type: ignore[list-item]  # checked below
    ("long-clauses", LONG_CLAUSES, None),  # type: ignore[list-item]
    ("long-cjk", LONG_CJK, None),  # type: ignore[list-item]
]


def _texts(sentences: list[Sentence]) -> list[str]:
    return [s.text for s in sentences]


@pytest.mark.parametrize("case_id,text,expected", [pytest.param(*c, id=c[0]) for c in CASES])
def test_whole_text(case_id: str, text: str, expected: list[str] | None) -> None:
    got = split_sentences(text)
    if expected is not None:
        assert _texts(got) == expected
    else:  # the long ones: cut, nothing lost, every piece within the limit
        assert len(got) >= 2
        assert all(len(s.text) <= 300 for s in got)
        assert "".join(s.text for s in got).replace(" ", "") == text.replace(" ", "")


def test_long_sentence_cut_points() -> None:
    words = split_sentences(LONG_WORDS)
    assert not words[0].text.endswith(" ") and words[0].text.split()[-1].startswith("word")
    assert LONG_WORDS.startswith(words[0].text + " ")  # cut at a word boundary, not inside one
    clauses = split_sentences(LONG_CLAUSES)
    assert clauses[0].text.endswith(","), clauses[0].text  # at a clause mark
    assert not clauses[0].terminated and clauses[-1].text.endswith("and then home")
    cjk = split_sentences(LONG_CJK)
    assert len(cjk[0].text) == 300 and "".join(s.text for s in cjk) == LONG_CJK
    short = split_sentences(LONG_WORDS, max_chars=40)
    assert all(len(s.text) <= 40 for s in short) and len(short) > 10


def test_flags() -> None:
    got = split_sentences("Title\n\nOne. Two\n\nThree.\nfour")
    assert [(s.text, s.paragraph_end, s.terminated) for s in got] == [
        ("Title", True, False), ("One.", False, True), ("Two", True, False),
        ("Three. four", False, False),
    ]
    assert str(got[1]) == "One."


def _feed(pieces: list[str], max_chars: int = 300) -> list[Sentence]:
    buf = SentenceBuffer(max_chars)
    out: list[Sentence] = []
    for p in pieces:
        out += buf.feed(p)
    return out + buf.flush()


@pytest.mark.parametrize("case_id,text", [pytest.param(c[0], c[1], id=c[0]) for c in CASES])
def test_incremental_equals_whole(case_id: str, text: str) -> None:
    whole = split_sentences(text)
    for k in range(len(text) + 1):
        assert _feed([text[:k], text[k:]]) == whole, f"split at {k}: {text[:k]!r} | {text[k:]!r}"
    assert _feed(list(text)) == whole, "1-character pieces"
    rng = random.Random(case_id)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert _feed(pieces) == whole, f"pieces {pieces!r}"


def test_incremental_small_limit_equals_whole() -> None:
    text = "alpha beta, gamma delta epsilon; zeta eta theta iota kappa lambda mu nu xi. " * 3
    whole = split_sentences(text, max_chars=25)
    assert all(len(s.text) <= 25 for s in whole) and len(whole) > 6
    for k in range(len(text) + 1):
        assert _feed([text[:k], text[k:]], 25) == whole
    assert _feed(list(text), 25) == whole


def test_sentences_are_released_early() -> None:
    """Streaming: a sentence comes out as soon as the text after it proves it ended."""
    buf = SentenceBuffer()
    assert buf.feed("Hello there") == []
    assert buf.feed(".") == []  # "there.5"? "there.com"? not yet known
    assert buf.feed(" ") == []  # "there. and" would continue it
    assert _texts(buf.feed("N")) == ["Hello there."]
    assert buf.pending == "N"
    assert _texts(buf.feed("ext one. Dr")) == ["Next one."]
    assert buf.feed(". ") == []
    assert buf.feed("Who") == []  # Dr. is never the end
    assert _texts(buf.feed("。好")) == ["Dr. Who。"]  # no space needed after CJK marks
    assert _texts(buf.flush()) == ["好"]
    assert buf.flush() == [] and buf.pending == ""


def test_bad_limit() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        SentenceBuffer(5)


TOKENS = ["Dr.", "3.5", "a.m.", "U.S.", "...", "\u2026", "!", "?", ".", "\n", "\n\n", "。",
          "！", "你好", "word", "Then", "and", " ", " ", " ", '"', ")", "\u201d", "- ", "1. ",
          "e.g.", "etc.", "J.", ",", "2)"]


def test_random_texts_split_the_same_incrementally() -> None:
    """The guarantee beyond the table: texts built at random from the tricky tokens."""
    rng = random.Random(2024)
    for _ in range(150):
        text = "".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 30)))
        whole = split_sentences(text, max_chars=30)
        assert "".join(s.text for s in whole).replace(" ", "") == "".join(text.split())
        for k in range(len(text) + 1):
            assert _feed([text[:k], text[k:]], 30) == whole, (text, k)
        assert _feed(list(text), 30) == whole, text

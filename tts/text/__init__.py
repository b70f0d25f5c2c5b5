"""The text front-end: what to say, in which pieces, how, and in which language.

* ``sentences`` — sentence splitting of whole texts and of text arriving piece by piece
  (``SentenceBuffer``), giving the same sentences either way;
* ``markup`` — SSML and bracket tags (``[pause 1s]``, ``[rate 0.8]``, ``[voice x]``,
  ``[emphasis]``, ``【停顿0.3秒】``, ``【强调】``) parsed into typed segments;
* ``languages`` — runs of one language in mixed text (Chinese, Japanese, Korean, the rest).

Text only: no audio, no voices. ``tts.compose`` puts it together with the voices.
"""

from .languages import Run, base_language, language_runs
from .markup import (
    Markup,
    MarkupError,
    ParagraphBreak,
    Pause,
    Segment,
    SentenceBreak,
    Speech,
    TagParser,
    TextFormat,
    parse,
    parse_ssml,
    parse_tags,
)
from .sentences import DEFAULT_MAX_CHARS, Sentence, SentenceBuffer, split_sentences

__all__ = [
    "DEFAULT_MAX_CHARS", "Markup", "MarkupError", "ParagraphBreak", "Pause", "Run", "Segment",
    "Sentence", "SentenceBreak", "SentenceBuffer", "Speech", "TagParser", "TextFormat",
    "base_language", "language_runs", "parse", "parse_ssml", "parse_tags", "split_sentences",
]

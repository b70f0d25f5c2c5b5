"""Chinese ``pinyin`` voices: piper-tts's own Chinese phonemizer, on resources herald installed.

Piper's Chinese voices are trained on pinyin initials, finals and tone digits that its
``ChinesePhonemizer`` makes: quotes dropped, sentences split by ``sentence_stream``,
temperatures, percentages and numbers read out in Chinese (unicode-rbnf), every character
read by g2pW (a BERT model that picks a polyphone's reading from its context: 重庆 chong2
qing4, 银行 yin2 hang2), and ids padded after each syllable rather than after each phoneme.
Running that same code is the only way to be sure the ids are Piper's, so herald does, with
one difference: Piper's constructor downloads g2pW's model (and transformers downloads the
tokenizer) on first use, while herald's never touches the network. It builds the converter
from the resources ``herald voices download`` installed (``tts.resources``) and refuses the
voice, saying what to run, when they are missing.

The packages (transformers for the tokenizer, g2pW's lookup tables, sentence-stream,
unicode-rbnf) are piper-tts's ``zh`` extra: ``scripts/setup --extras zh``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .resources import BERT_BASE_CHINESE, G2PW, Resource

RESOURCES: tuple[Resource, ...] = (G2PW, BERT_BASE_CHINESE)


def missing_resources(places: Sequence[Path]) -> list[Resource]:
    return [r for r in RESOURCES if r.find(places) is None]


def chinese_phonemizer(places: Sequence[Path]) -> Any:
    """Piper's ``ChinesePhonemizer`` reading with the g2pW model and tokenizer installed in
    one of ``places``. Raises ``ImportError`` (the extra is missing) or ``LookupError``."""
    found_model, found_tokenizer = G2PW.find(places), BERT_BASE_CHINESE.find(places)
    if found_model is None or found_tokenizer is None:
        raise LookupError(", ".join(r.title for r in missing_resources(places)))
    model_dir, tokenizer_dir = found_model, found_tokenizer
    from piper.g2pw_onnx import G2PWOnnxConverter
    from piper.phonemize_chinese import ChinesePhonemizer
    from unicode_rbnf import RbnfEngine

    class Installed(ChinesePhonemizer):
        """Piper's phonemizer as its constructor sets it up, minus the download."""

        def __init__(self) -> None:  # deliberately not super().__init__: it downloads
            # The converter imports the model's config.py: without this, Python would leave
            # a __pycache__ in the voices directory, which herald voices download owns.
            writing, sys.dont_write_bytecode = sys.dont_write_bytecode, True
            try:
                self.g2p = G2PWOnnxConverter(model_dir=model_dir, style="pinyin",
                                             model_source=str(tokenizer_dir),
                                             enable_non_tradional_chinese=True)
            finally:
                sys.dont_write_bytecode = writing
            self.number_engine = RbnfEngine.for_language("zh")

    return Installed()


def pinyin_ids(phonemes: list[str], id_map: Mapping[str, Sequence[int]]) -> list[int]:
    """Piper's layout for pinyin voices: padding after each syllable's tone and after each
    pause, not after every phoneme."""
    from piper.phonemize_chinese import phonemes_to_ids

    ids: list[int] = phonemes_to_ids(phonemes, id_map)
    return ids

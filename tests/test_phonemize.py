"""herald's phoneme ids equal piper-tts's for the same voice and text."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from piper import PiperVoice
from sentences import LONG_SENTENCE, SENTENCES

from tts.phonemize import PhonemizeError, phoneme_ids, phonemize


@pytest.fixture(scope="module")
def piper_voice(catalog):  # type: ignore[no-untyped-def]
    info = catalog.resolve()
    return PiperVoice.load(info.model_path, info.config_path)


@pytest.mark.parametrize("text", [*SENTENCES, LONG_SENTENCE, " ".join(SENTENCES[:5])])
def test_phoneme_ids_equal_piper(text: str, piper_voice, catalog) -> None:  # type: ignore[no-untyped-def]
    config = catalog.resolve().config
    ours = phonemize(text, config.espeak_voice, config.vowel_clusters)
    theirs = piper_voice.phonemize(text)
    assert ours == theirs
    assert [phoneme_ids(p, config.phoneme_id_map) for p in ours] == [
        piper_voice.phonemes_to_ids(p) for p in theirs
    ]


def test_id_layout() -> None:
    id_map = {"_": (0,), "^": (1,), "$": (2,), "a": (14,), "b": (15,)}
    assert phoneme_ids(["a", "b", "?"], id_map) == [1, 0, 14, 0, 15, 0, 2]


def test_sentences_are_split() -> None:
    assert len(phonemize("One. Two? Three!", "en-us")) == 3


def test_unknown_espeak_voice() -> None:
    with pytest.raises(PhonemizeError, match="no voice"):
        phonemize("hello", "xx-nonexistent")


def test_phonemizing_keeps_nothing() -> None:
    """A daemon phonemizes every sentence it ever speaks: nothing of it may stay behind.
    (Piper's own bridge kept every clause, ~500 bytes a call for this text.)"""
    text = "Turn on the kitchen lights. The door is open, again!"
    for _ in range(20):
        phonemize(text, "en-us")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(500):
            phonemize(text, "en-us")
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 16_000, f"{kept} bytes kept after 500 calls"


def test_a_nul_does_not_end_the_text() -> None:
    assert len(phonemize("One.\0Two? Three!", "en-us")) == 3

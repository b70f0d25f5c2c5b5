"""The composer: who speaks which run (English, Chinese, mixed, voice switches), that every
run is really spoken, exact pause lengths measured in the audio, one output rate across
voices of different rates, and that audio streams rather than waiting for the whole text."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
from audio_checks import assert_pcm_close, assert_speech, rms
from inline_helpers import Inline
from synthetic_voice import VARIANTS, export_like_piper, random_model

from tts import SynthesisOptions, UnknownVoice, VoiceCatalog
from tts.compose import ComposedChunk, Composer, Say, Silence, Step, StepFeed
from tts.fallback import EspeakFallback
from tts.resample import Resampler
from tts.text.languages import Run, language_runs
from tts.text.markup import EMPHASIS, MarkupError

JOE = "en_US-joe-medium"
ZH = "zh_CN-test-x_low"  # a random-weight 16 kHz "Chinese" voice made below
MIXED = "你好，欢迎试用 herald！This is a real-time TTS demo."
OPTS = SynthesisOptions(seed=7)


@pytest.fixture(scope="module")
def composer(catalog: VoiceCatalog) -> Composer:
    return Composer(catalog)


@pytest.fixture(scope="module")
def zh_catalog(catalog: VoiceCatalog, tmp_path_factory: pytest.TempPathFactory
               ) -> VoiceCatalog:
    """The bundled voice plus a 16 kHz voice that claims to speak Chinese."""
    d = tmp_path_factory.mktemp("voices")
    export_like_piper(random_model(VARIANTS["x_low"]), d / f"{ZH}.onnx")
    config = json.loads(catalog.resolve(JOE).config_path.read_text())
    config["audio"] = {"sample_rate": 16000, "quality": "x_low"}
    config["language"] = {"code": "zh_CN"}
    config["espeak"] = {"voice": "cmn"}
    (d / f"{ZH}.onnx.json").write_text(json.dumps(config))
    return VoiceCatalog([d])


def _plan(composer: Composer, text: str, fmt: str = "text", voice: str | None = None
          ) -> list[Step]:
    planner = composer.planner(fmt, voice)  # type: ignore[arg-type]
    return planner.feed(text) + planner.finish()


def _said(steps: list[Step]) -> list[tuple[str, str]]:
    return [(s.voice, s.text) for s in steps if isinstance(s, Say)]


def _audio(chunks: list[ComposedChunk]) -> np.ndarray:
    return np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0, np.float32)


# --- language runs ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,runs", [
    ("Hello world.", [Run("Hello world.", "en", False)]),
    (MIXED, [Run("你好，欢迎试用 ", "zh", True),
             Run("herald！This is a real-time TTS demo.", "en", False)]),
    ("I have 3 苹果.", [Run("I have 3 ", "en", False), Run("苹果.", "zh", True)]),
    ("2024年1月5日", [Run("2024年1月5日", "zh", True)]),
    ("气温-7°C，湿度77%", [Run("气温-7°C，湿度77%", "zh", True)]),  # the C is the number's
    ("こんにちは世界、hello", [Run("こんにちは世界、", "ja", True), Run("hello", "en", False)]),
    ("世界 hi こんにちは", [Run("世界 ", "ja", True), Run("hi ", "en", False),
                         Run("こんにちは", "ja", True)]),
    ("안녕하세요 friend", [Run("안녕하세요 ", "ko", True), Run("friend", "en", False)]),
    ("Привет, мир", [Run("Привет, мир", "en", False)]),  # other alphabets: the voice's
    ("שָׁלוֹם world", [Run("שָׁלוֹם ", "he", False), Run("world", "en", False)]),  # points too
    ("ราคา 1,250 บาท OK", [Run("ราคา 1,250 บาท ", "th", False), Run("OK", "en", False)]),
    ("123 !!!", [Run("123 !!!", "en", False)]),
    ("  ", []),
])
def test_language_runs(text: str, runs: list[Run]) -> None:
    assert language_runs(text, "en") == runs


def test_language_runs_cjk_override() -> None:
    assert language_runs("你好 hi", "de", cjk="zh-HK") == [Run("你好 ", "yue", True),
                                                          Run("hi", "de", False)]
    assert language_runs("こんにちは", "en", cjk="yue")[0].language == "ja"  # kana wins


# --- routing: who speaks which run -----------------------------------------------------------

ROUTING = [
    ("english", "Hello there. How are you?", "text",
     [(JOE, "Hello there."), (JOE, "How are you?")]),
    ("chinese", "你好，世界。今天很好。", "text",
     [("espeak:cmn", "你好，世界。"), ("espeak:cmn", "今天很好。")]),
    ("mixed", MIXED, "text", [("espeak:cmn", "你好，欢迎试用"), (JOE, "herald!"),
                              (JOE, "This is a real-time TTS demo.")]),
    ("japanese", "こんにちは。", "text", [("espeak:ja", "こんにちは。")]),
    ("korean", "안녕하세요.", "text", [("espeak:ko", "안녕하세요.")]),
    ("voice-tags", "Hello [voice espeak:en-us] robot. Still [voice en_US-joe-medium] human.",
     "text", [(JOE, "Hello"), ("espeak:en-us", "robot."), ("espeak:en-us", "Still"),
              (JOE, "human.")]),
    ("cantonese-voice", "[voice espeak:yue] 你好 hello", "text",
     [("espeak:yue", "你好 hello")]),
    ("ssml-lang", '<speak>Hi <lang xml:lang="yue">你好</lang> <lang xml:lang="de">Guten Tag'
     "</lang></speak>", "ssml", [(JOE, "Hi"), ("espeak:yue", "你好"), ("espeak:de", "Guten Tag")]),
    ("ssml-voice", '<voice name="espeak:en-us">Robot.</voice> Human.', "ssml",
     [("espeak:en-us", "Robot."), (JOE, "Human.")]),
    ("ssml-say-as-joined", 'Code <say-as interpret-as="characters">AB</say-as> now.', "ssml",
     [(JOE, "Code A, B now.")]),
]


@pytest.mark.parametrize("case_id,text,fmt,said", [pytest.param(*c, id=c[0]) for c in ROUTING])
def test_routing(composer: Composer, case_id: str, text: str, fmt: str,
                 said: list[tuple[str, str]]) -> None:
    assert _said(_plan(composer, text, fmt)) == said


def test_routing_prefers_an_installed_voice(zh_catalog: VoiceCatalog) -> None:
    composer = Composer(zh_catalog)
    assert _said(_plan(composer, MIXED)) == [
        (ZH, "你好，欢迎试用"), (JOE, "herald!"), (JOE, "This is a real-time TTS demo.")]
    assert _said(_plan(composer, "你好 hello", voice=ZH)) == [(ZH, "你好 hello")]


def test_unknown_voice_in_markup_warns_and_speaks(composer: Composer) -> None:
    planner = composer.planner()
    steps = planner.feed("Hi [voice nobody] there.") + planner.finish()
    assert _said(steps) == [(JOE, "Hi"), (JOE, "there.")]
    assert "unknown voice 'nobody'" in planner.warnings[0]


def test_unknown_request_voice_and_bad_format(composer: Composer) -> None:
    with pytest.raises(UnknownVoice, match="nobody"):
        composer.stream("Hi", voice="nobody")
    with pytest.raises(UnknownVoice, match="espeak:klingon"):
        composer.stream("Hi", voice="espeak:klingon")
    with pytest.raises(ValueError, match="'text' or 'ssml'"):
        composer.planner("markdown")  # type: ignore[arg-type]


# --- speech for every run --------------------------------------------------------------------

def test_chinese_sentence_is_spoken(composer: Composer) -> None:
    comp = composer.stream("你好，欢迎使用智能家居。", options=OPTS)
    chunks = list(comp)
    assert {c.voice for c in chunks} == {"espeak:cmn"}
    assert_speech(_audio(chunks), comp.sample_rate, min_seconds=0.5, max_seconds=5.0)


def test_mixed_sentence_speaks_every_run(composer: Composer) -> None:
    comp = composer.stream(MIXED, options=OPTS)
    chunks = list(comp)
    rate = comp.sample_rate
    runs: dict[str, np.ndarray] = {}
    for c in chunks:
        runs[c.text] = np.concatenate([runs.get(c.text, np.zeros(0, np.float32)), c.samples])
    chinese, name, english = runs["你好，欢迎试用"], runs["herald!"], runs[
        "This is a real-time TTS demo."]
    assert 0.5 <= len(chinese) / rate <= 5.0 and rms(chinese) > 0.02
    assert_speech(chinese, rate)
    assert 0.2 <= len(name) / rate <= 2.0 and rms(name) > 0.02
    assert 1.0 <= len(english) / rate <= 5.0
    assert_speech(english, rate)
    whole = _audio(chunks)
    assert_speech(whole, rate, min_seconds=2.0)
    alone = [_audio(list(composer.stream(t, options=OPTS))) for t in
             ("你好，欢迎试用", "This is a real-time TTS demo.")]
    assert len(whole) > max(len(a) for a in alone)


def test_plain_text_equals_the_synthesizer(composer: Composer, synth) -> None:  # type: ignore[no-untyped-def]
    """Composing adds nothing to a single-voice sentence: the same samples as the voice's
    own stream."""
    text = "Turn on the kitchen lights."
    composed = _audio(list(composer.stream(text, options=OPTS)))
    direct = np.concatenate([c.samples for c in synth.stream(text, OPTS)])
    assert_pcm_close(composed, direct)


def test_rate_changes_duration(composer: Composer) -> None:
    opts = SynthesisOptions(seed=3, noise_w=0.0)
    normal = len(_audio(list(composer.stream("Hello there.", options=opts))))
    slow = len(_audio(list(composer.stream("[rate 0.5] Hello there.", options=opts))))
    fast_ssml = len(_audio(list(composer.stream(
        '<prosody rate="200%">Hello there.</prosody>', "ssml", opts))))
    assert 1.7 < slow / normal < 2.3
    assert 0.4 < fast_ssml / normal < 0.65
    zh = len(_audio(list(composer.stream("你好，世界", options=opts))))
    zh_slow = len(_audio(list(composer.stream("【慢速】你好，世界", options=opts))))
    assert zh_slow > 1.15 * zh


QUIET = SynthesisOptions(seed=3, noise_scale=0.0, noise_w=0.0)  # the same durations each time


@pytest.mark.parametrize("text,fmt,words,level", [
    ('Please close the <emphasis level="strong">kitchen window</emphasis> now.', "ssml",
     "kitchen window", "strong"),
    ("Please close the <emphasis>kitchen window</emphasis> now.", "ssml", "kitchen window",
     "moderate"),
    ('Please close the <emphasis level="reduced">kitchen window</emphasis> now.', "ssml",
     "kitchen window", "reduced"),
    ("Please close the [emphasis strong]kitchen window[/emphasis] now.", "text",
     "kitchen window", "strong"),
    ("请把【强调】厨房的窗户【/强调】关上。", "text", "厨房的窗户", "moderate"),
])
def test_emphasis_is_audible(composer: Composer, text: str, fmt: str, words: str,
                             level: str) -> None:
    """The emphasized words' audio against the same words said plainly: longer and louder
    (shorter and quieter for reduced) by about what the level says, and strong emphasis
    set off by its pause."""
    emphasis = EMPHASIS[level]
    composition = composer.stream(text, fmt, QUIET)
    chunks = list(composition)
    said = _audio([c for c in chunks if c.text == words])
    plain = _audio(list(composer.stream(words, options=QUIET)))
    assert_speech(said, composer.sample_rate(), min_seconds=0.3)
    length, loudness = len(said) / len(plain), rms(said) / rms(plain)
    # A phrase stretches by less than the rate says (durations are whole frames per phoneme,
    # and not all of a phrase's frames scale): 44-105 % of the nominal change is what these
    # phrases give. Unemphasized, both ratios are exactly 1 (the noise is off).
    nominal = 1 / emphasis.rate - 1
    assert (length - 1) / nominal > 0.35, f"length x{length:.2f}, nominal x{1 + nominal:.2f}"
    assert (loudness - 1) / (emphasis.gain - 1) > 0.6, f"rms x{loudness:.2f}"
    assert np.abs(said).max() < 1.0, "emphasis clipped"
    pauses = [s for s in composition.steps if isinstance(s, Silence)]
    assert [p.seconds for p in pauses] == ([emphasis.pause] if emphasis.pause else [])


# --- pauses ----------------------------------------------------------------------------------

def _zero_runs(x: np.ndarray, min_len: int) -> list[tuple[int, int]]:
    edges = np.diff(np.concatenate([[0], (x == 0.0).astype(np.int8), [0]]))
    starts, ends = np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]
    return [(int(a), int(b)) for a, b in zip(starts, ends) if b - a >= min_len]


def _quiet_gap(x: np.ndarray, rate: int, a: int, b: int) -> float:
    """Seconds of quiet (10 ms frames below 1 % of full scale) around samples a..b."""
    frame = rate // 100

    def quiet(i: int) -> bool:
        return rms(x[i:i + frame]) < 0.01

    while a - frame >= 0 and quiet(a - frame):
        a -= frame
    while b + frame <= len(x) and quiet(b):
        b += frame
    return (b - a) / rate


PAUSES = [
    ("tag-plus-sentence", "Yes. [pause 300ms] No.", "text", 0.2, 0.4, 0.5),
    ("tag-mid-sentence", "Yes [pause 700ms] no.", "text", 0.2, 0.4, 0.7),
    ("sentence", "Yes. No.", "text", 0.25, 0.4, 0.25),
    ("paragraph", "Yes.\n\nNo.", "text", 0.2, 0.6, 0.6),
    ("chinese-tag", "Yes【停顿0.3秒】no.", "text", 0.2, 0.4, 0.3),
    ("ssml-break", '<speak>Yes <break time="1s"/> no.</speak>', "ssml", 0.2, 0.4, 1.0),
    ("ssml-break-strength", 'Yes. <break strength="strong"/> No.', "ssml", 0.1, 0.4, 0.8),
    ("ssml-paragraphs", "<p>Yes.</p><p>No.</p>", "ssml", 0.1, 0.5, 0.5),
    ("ssml-sentences", "<s>Yes</s><s>No</s>", "ssml", 0.3, 0.5, 0.3),
]


@pytest.mark.parametrize("case_id,text,fmt,sentence_pause,paragraph_pause,expected",
                         [pytest.param(*c, id=c[0]) for c in PAUSES])
def test_pause_lengths(composer: Composer, case_id: str, text: str, fmt: str,
                       sentence_pause: float, paragraph_pause: float, expected: float) -> None:
    comp = composer.stream(text, fmt, OPTS, sentence_pause=sentence_pause,  # type: ignore[arg-type]
                           paragraph_pause=paragraph_pause)
    x = _audio(list(comp))
    rate = comp.sample_rate
    runs = _zero_runs(x, int(0.05 * rate))
    assert len(runs) == 1, f"expected one inserted silence, found {runs}"
    a, b = runs[0]
    assert abs((b - a) / rate - expected) <= 0.02, f"pause {(b - a) / rate:.3f} s"
    before, after = x[:a], x[b:]
    assert rms(before) > 0.02 and rms(after) > 0.02, "the pause is not between two speech parts"
    gap = _quiet_gap(x, rate, a, b)
    assert expected - 0.02 <= gap <= expected + 0.5, f"quiet gap {gap:.3f} s"


def test_no_pause_after_the_last_sentence(composer: Composer) -> None:
    steps = _plan(composer, "One. Two.\n\n")
    assert isinstance(steps[-1], Say) and steps[-1].last_in_sentence
    trailing = _plan(composer, "One. [pause 1s]")
    assert isinstance(trailing[-1], Silence) and trailing[-1].seconds == 1.0  # asked for


# --- malformed markup ------------------------------------------------------------------------

def test_malformed_ssml_raises_or_is_spoken_as_text(composer: Composer) -> None:
    text = "Hello <b>there & everyone."
    with pytest.raises(MarkupError, match="line 1"):
        composer.stream(text, "ssml")
    comp = composer.stream(text, "ssml", OPTS, markup_errors="text")
    assert "malformed SSML" in comp.warnings[0] and "plain text" in comp.warnings[0]
    assert _said(comp.steps) == [(JOE, "Hello there & everyone.")]
    assert_speech(_audio(list(comp)), comp.sample_rate, min_seconds=0.8)


# --- one output rate across voices -----------------------------------------------------------

def test_other_rates_are_resampled(zh_catalog: VoiceCatalog) -> None:
    composer = Composer(zh_catalog)
    comp = composer.stream("你好。Hi.", options=OPTS)
    assert comp.sample_rate == 22050
    chunks = list(comp)
    zh = _audio([c for c in chunks if c.voice == ZH])
    own = zh_catalog.synthesizer(ZH).synthesize("你好。", SynthesisOptions(seed=7))
    resampler = Resampler(16000, 22050)
    expected = np.concatenate([resampler.process(own), resampler.flush()])
    assert len(zh) == len(expected)
    assert np.allclose(zh, expected, atol=1e-4) and rms(zh) > 0
    # The 16 kHz voice as the request voice: the English voice and espeak-ng come down to it.
    comp16 = composer.stream('<lang xml:lang="en-US">Hi.</lang> こんにちは', "ssml", OPTS,
                             voice=ZH)
    assert comp16.sample_rate == 16000
    chunks16 = list(comp16)
    assert {c.voice for c in chunks16} == {JOE, "espeak:ja"}
    joe = zh_catalog.synthesizer(JOE).synthesize("Hi.", SynthesisOptions(seed=7))
    down = Resampler(22050, 16000)
    assert sum(len(c.samples) for c in chunks16 if c.voice == JOE) == down.expected_length(
        len(joe))
    ja = composer.fallback.synthesize("こんにちは", composer.fallback.resolve("ja"))  # type: ignore[union-attr]
    ja16 = sum(len(c.samples) for c in chunks16 if c.voice == "espeak:ja")
    assert abs(ja16 - down.expected_length(len(ja))) < 0.05 * 16000  # espeak-ng varies a bit


# --- a Chinese pinyin voice ------------------------------------------------------------------

PINYIN = "zh_CN-pinyin-x_low"  # a small 16 kHz voice of Piper's pinyin type (typed_voices)
ZH_EN = "我用iPhone给妈妈打电话，她说OK。Then I went home."


@pytest.fixture(scope="module")
def pinyin_composer(typed_voices) -> Composer:  # type: ignore[no-untyped-def]
    return Composer(VoiceCatalog([typed_voices]))


@pytest.mark.parametrize("voice", [None, PINYIN])
def test_chinese_to_the_pinyin_voice_english_to_english(pinyin_composer: Composer,
                                                        voice: str | None) -> None:
    """Whoever the request's voice, the Chinese goes to the pinyin voice and the English to
    the English one: the pinyin voice would drop (or garble) Latin letters."""
    assert _said(_plan(pinyin_composer, ZH_EN, voice=voice)) == [
        (PINYIN, "我用"), (JOE, "iPhone"), (PINYIN, "给妈妈打电话，她说"), (JOE, "OK."),
        (JOE, "Then I went home.")]
    assert _said(_plan(pinyin_composer, "今天气温-7°C，湿度77%。", voice=voice)) == [
        (PINYIN, "今天气温-7°C，湿度77%。")]  # read by Piper's Chinese number rules


def test_hebrew_and_thai_go_to_their_voices(pinyin_composer: Composer, composer: Composer
                                            ) -> None:
    """Hebrew and Thai letters go to a voice of their language (else espeak-ng's), Latin
    words in a request to those voices to the English one: they would drop them."""
    he, th = "he_IL-test-x_low", "th_TH-test-x_low"
    for voice in (None, he, th):
        assert _said(_plan(pinyin_composer, "אני משתמש ב-iPhone כל יום.", voice=voice)) == [
            (he, "אני משתמש ב-"), (JOE, "iPhone"), (he, "כל יום.")]
        assert _said(_plan(pinyin_composer, "ราคา 1,250 บาท OK", voice=voice)) == [
            (th, "ราคา 1,250 บาท"), (JOE, "OK")]
    assert _said(_plan(composer, "Hello שלום, สวัสดีครับ!")) == [
        (JOE, "Hello"), ("espeak:he", "שלום,"), ("espeak:th", "สวัสดีครับ!")]


def test_chinese_markup_with_the_pinyin_voice(pinyin_composer: Composer) -> None:
    steps = _plan(pinyin_composer, "你好【停顿0.5秒】世界。", voice=PINYIN)
    assert [(type(s).__name__, getattr(s, "text", getattr(s, "seconds", None)))
            for s in steps] == [("Say", "你好"), ("Silence", 0.5), ("Say", "世界。")]
    quiet = SynthesisOptions(seed=3, noise_scale=0.0, noise_w=0.0)
    normal = len(_audio(list(pinyin_composer.stream("你好，世界", voice=PINYIN, options=quiet))))
    slow = len(_audio(list(pinyin_composer.stream("【慢速】你好，世界", voice=PINYIN,
                                                  options=quiet))))
    assert slow > 1.15 * normal
    loud = _plan(pinyin_composer, "【强调】你好【/强调】世界", voice=PINYIN)
    assert [(s.text, s.gain > 1.0) for s in loud if isinstance(s, Say)] == [
        ("你好", True), ("世界", False)]


def test_mixed_text_is_one_stream_of_the_pinyin_voices_format(pinyin_composer: Composer
                                                               ) -> None:
    """One format for the whole stream (the request voice's 16 kHz): the Chinese runs are
    the pinyin voice's own samples, the English ones the English voice's, resampled."""
    opts = SynthesisOptions(seed=7, noise_w=0.0)  # durations, so lengths, are fixed
    comp = pinyin_composer.stream(ZH_EN, voice=PINYIN, options=opts)
    assert comp.sample_rate == 16000
    chunks = list(comp)
    assert {c.voice for c in chunks} == {PINYIN, JOE}
    catalog = pinyin_composer.catalog
    first = _audio([c for c in chunks if c.text == "我用"])
    own = catalog.synthesizer(PINYIN).synthesize("我用", opts)  # the first: the same noise
    assert len(first) == len(own) and np.allclose(first, own, atol=1e-4) and rms(own) > 0
    english = _audio([c for c in chunks if c.text == "Then I went home."])
    joe = catalog.synthesizer(JOE).synthesize("Then I went home.", opts)
    assert len(english) == Resampler(22050, 16000).expected_length(len(joe))
    assert_speech(english, 16000)


# --- streaming -------------------------------------------------------------------------------

def test_first_audio_before_the_rest_is_rendered(composer: Composer) -> None:
    """Rendering pulls steps lazily: the first chunk exists before the second sentence's
    step has even been taken, and a sentence comes in several chunks (its first window's and
    the rest, in as many windows as the host's speed allows)."""
    steps = _plan(composer, "Good morning to you. The weather is fine today.")
    taken: list[Step] = []

    def lazily() -> Iterator[Step]:
        for s in steps:
            taken.append(s)
            yield s

    chunks = composer.render(lazily(), OPTS)
    first = next(chunks)
    assert first.voice == JOE and len(taken) == 1
    rest = list(chunks)
    assert first.sentence == 0 and len(taken) == len(steps)
    assert len([c for c in rest if c.sentence == 0]) >= 1


def test_a_voices_sentences_are_one_synthesis_so_helpers_get_the_next(
        composer: Composer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three sentences: rendered as one synthesis, a sentence after the first goes to the
    helpers whole while the first plays; the audio,
    pauses included, is the same as without helpers, chunk for chunk in sentence order.

    Computed on the sharing thread, the next sentence's prior can be done after the first
    sentence's last window on a busy host, and that sentence is then begun here and cut,
    not handed out whole (``tts.lanes``): it is computed here, at the hand-out, so that the
    verdict does not depend on how busy the host is (``crowded`` is fixed for every test)."""
    import tts.sharing as sharing_module

    monkeypatch.setattr(sharing_module, "core_free", lambda: False)
    planner = composer.planner(sentence_pause=0.2)
    steps = planner.feed("Good morning. The door is locked. It will rain after six.")
    steps += planner.finish()
    assert sum(isinstance(s, Silence) for s in steps) >= 2  # pauses between the sentences
    helpers = Inline(2)
    shared = list(composer.render(steps, OPTS, helpers=helpers))
    alone = list(composer.render(steps, OPTS))
    # a later sentence handed out whole (a piece of the one playing starts past its context)
    assert any(job.start == 0 and job.end is None for job in helpers.handed), helpers.handed
    assert [c.sentence for c in shared] == sorted(c.sentence for c in shared)
    for k in sorted({c.sentence for c in alone}):
        ours = np.concatenate([c.samples for c in shared if c.sentence == k])
        theirs = np.concatenate([c.samples for c in alone if c.sentence == k])
        assert len(ours) == len(theirs) and np.abs(ours - theirs).max() < 1e-4, k
    assert [c.last_in_sentence for c in shared].count(True) == \
        [c.last_in_sentence for c in alone].count(True)


def test_planner_releases_each_sentence_as_it_completes(composer: Composer) -> None:
    planner = composer.planner(sentence_pause=0.2)
    assert planner.feed("[rate 0.8]First sen") == []
    got = planner.feed("tence. Sec")
    assert _said(got) == [(JOE, "First sentence.")] and got[0].rate == 0.8  # type: ignore[union-attr]
    assert planner.feed("ond one") == []
    tail = planner.finish()
    assert [type(s) for s in tail] == [Silence, Say]
    assert tail[1].rate == 0.8 and tail[1].text == "Second one"  # type: ignore[union-attr]


def test_fallback_voices() -> None:
    fallback = EspeakFallback()
    labels = {v.label for v in fallback.voices()}
    assert {"espeak:cmn", "espeak:yue", "espeak:ja", "espeak:ko", "espeak:en-us"} <= labels
    for code, label in [("zh", "espeak:cmn"), ("zh_CN", "espeak:cmn"), ("cmn", "espeak:cmn"),
                        ("zh-HK", "espeak:yue"), ("yue", "espeak:yue"), ("en_US", "espeak:en-us"),
                        ("de", "espeak:de"), ("espeak:ja", "espeak:ja")]:
        found = fallback.find(code)
        assert found is not None and found.label == label, code
    assert fallback.find("tlh") is None
    # Han characters are read as their pinyin (Debian's espeak-ng 1.51 'cmn' voice would say
    # the tone numbers as English words, twice as long).
    han = fallback.synthesize("你好", fallback.resolve("zh"))
    pinyin = fallback.synthesize("ni3 hao3", fallback.resolve("cmn-latn-pinyin"))
    assert abs(len(han) - len(pinyin)) < 0.05 * len(pinyin)
    assert_speech(fallback.synthesize("你好，欢迎使用。", fallback.resolve("zh")),
                  fallback.sample_rate)


@pytest.mark.parametrize("sentence_silence,paragraph_silence", [(0.0, 0.4), (0.15, 0.9)])
def test_pauses_come_from_the_options(composer: Composer, sentence_silence: float,
                                      paragraph_silence: float) -> None:
    """``synthesis.sentence_silence`` / ``paragraph_silence`` reach the audio as set."""
    from dataclasses import replace

    opts = replace(OPTS, sentence_silence=sentence_silence, paragraph_silence=paragraph_silence)
    comp = composer.stream("Yes. No.\n\nMaybe.", "text", opts)
    x = _audio(list(comp))
    rate = comp.sample_rate
    runs = _zero_runs(x, int(0.05 * rate))
    want = [p for p in (sentence_silence, paragraph_silence) if p >= 0.05]
    assert [round((b - a) / rate, 2) for a, b in runs] == [round(p, 2) for p in want]


def _by_sentence(steps: list[Step]) -> list[list[Step]]:
    """A text's steps in batches as a streamed text brings them: one sentence each."""
    batches: dict[int, list[Step]] = {}
    for step in steps:
        batches.setdefault(step.sentence, []).append(step)
    return list(batches.values())


def test_a_feeds_batches_render_together_as_each_alone(composer: Composer) -> None:
    """A streamed text's sentences that came while one rendered are one synthesis
    (``StepFeed``); each starts the seeded noise afresh, so the audio is what each sentence
    gives in a render of its own, however the batches came together. A render ends when the
    feed is empty; what is put later is the next render's."""
    planner = composer.planner(sentence_pause=0.2)
    steps = planner.feed("Good morning. The door is locked. It will rain after six.")
    batches = _by_sentence(steps + planner.finish())
    assert len(batches) == 3
    alone = [c for batch in batches for c in composer.render(batch, OPTS)]
    feed = StepFeed()
    feed.put(batches[0])
    first = list(composer.render(feed, OPTS))
    assert {c.sentence for c in first} == {batches[0][0].sentence} and not feed
    for batch in batches[1:]:
        feed.put(batch)
    rest = list(composer.render(feed, OPTS))
    together = first + rest
    assert [c.sentence for c in together] == sorted(c.sentence for c in together)
    assert len(_audio(together)) == len(_audio(alone))
    assert np.abs(_audio(together) - _audio(alone)).max() < 1e-4
    # the noise matters: one seed drawn on through the sentences gives other audio
    drawn_on = _audio(list(composer.render([s for b in batches[1:] for s in b], OPTS)))
    assert len(drawn_on) != len(_audio(rest)) or np.abs(drawn_on - _audio(rest)).max() > 1e-2

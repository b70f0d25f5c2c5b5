"""Streamed audio equals one-shot audio: for every voice variant, and for the real voice
with sampling noise on (same seed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from audio_checks import assert_speech
from sentences import LONG_SENTENCE
from synthetic_voice import VARIANTS, random_model

from tts import SynthesisOptions
from tts.stream import FlowPace, decode_windows


def stopped_clock() -> float:
    """Time that never moves: all audio handed out stays buffered, so a ``FlowPace`` lets
    the flow run as far ahead as its cap allows."""
    return 0.0


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("frames", [5, 37, 300])
@pytest.mark.parametrize("ahead", [0, 50])
def test_windows_equal_one_shot(variant: str, frames: int, ahead: int) -> None:
    model = random_model(VARIANTS[variant])
    torch.manual_seed(1)
    z_p = torch.randn(1, model.config.inter_channels, frames)
    g = model.speaker_embedding(2)
    with torch.inference_mode():
        whole = model.decode(z_p, g)[0, 0].numpy()
    pace = FlowPace(16000, cap=ahead, clock=stopped_clock) if ahead else None
    chunks = [c for c, _ in decode_windows(model, z_p, g, pace=pace)]
    streamed = np.concatenate(chunks)
    assert len(streamed) == len(whole) == frames * model.config.hop_length
    assert np.abs(streamed - np.clip(whole, -1, 1)).max() < 1e-4
    assert np.abs(whole).max() > 1e-3  # the comparison is not between two silences
    if frames >= 37:
        assert len(chunks) > 1


class StepClock:
    """Advances only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_flow_runs_ahead_only_as_far_as_the_buffered_audio_pays_for() -> None:
    clock = StepClock()
    pace = FlowPace(1000, cap=400, clock=clock)
    assert pace.ahead() == 0  # before the first audio: nothing buffered, nothing ahead
    pace.flow_ran(frames=50, seconds=0.05)  # 1 ms a frame
    assert pace.ahead() == 0
    pace.out(200)  # 0.2 s of audio handed out at t = 0
    assert pace.ahead() == 100  # half of the 0.2 s buffered, at 1 ms a frame
    clock.now = 0.15
    assert pace.ahead() == 25  # 0.05 s still buffered
    clock.now = 0.3
    assert pace.ahead() == 0  # playback would have caught up: no running ahead
    pace.out(2000)
    assert pace.ahead() == 400  # capped
    pace.flow_ran(frames=10, seconds=1.0)  # the machine got slow
    assert pace.ahead() == 9


def test_a_paced_stream_pushes_the_flow_fewer_times(synth) -> None:  # type: ignore[no-untyped-def]
    """The real voice, a stopped clock: the flow runs ahead and the audio is the same."""
    opts = SynthesisOptions(seed=5).with_defaults(synth.voice)
    z_p, g = synth.prior(synth.sentences(LONG_SENTENCE)[0], opts)
    pushes: list[int] = []

    class Counting(FlowPace):
        def flow_ran(self, frames: int, seconds: float) -> None:
            pushes.append(frames)
            super().flow_ran(frames, seconds)

    plain = np.concatenate([c for c, _ in decode_windows(synth.model, z_p, g,
                                                         pace=Counting(22050, cap=0))])
    windows = len(pushes)
    pushes.clear()
    ahead = np.concatenate([c for c, _ in decode_windows(
        synth.model, z_p, g, pace=Counting(22050, cap=400, clock=stopped_clock))])
    assert sum(pushes) == z_p.shape[2]
    assert len(pushes) < windows / 2, (pushes, windows)
    assert np.abs(ahead - plain).max() < 1e-4


@pytest.mark.parametrize("variant", ["medium", "multi_speaker", "plain_dp"])
def test_the_prior_in_parts_keeps_the_whole_sentences_durations(variant: str) -> None:
    """Split at the head, the parts join into the latent of the unsplit prior: same frames,
    same expanded means (no sampling noise), nothing dropped or repeated at the cut. That
    each part's log-durations are the whole sentence's is
    ``test_log_durations_of_a_part_are_the_whole_sentences``; rounded up to whole frames,
    durations hide differences that small."""
    model = random_model(VARIANTS[variant])
    ids = torch.randint(1, model.config.n_vocab, (1, 260),
                        generator=torch.Generator().manual_seed(4))
    g = model.speaker_embedding(1)

    def parts(head: int) -> list[torch.Tensor]:
        noise = torch.Generator().manual_seed(3)
        with torch.inference_mode():
            return list(model.prior_parts(ids, g, 0.0, 0.5, 0.8, noise, head=head))

    split, whole = parts(head=16), parts(head=10_000)
    assert len(split) == 2 and len(whole) == 1
    joined = torch.cat(split, dim=-1)
    assert joined.shape == whole[0].shape and split[0].shape[-1] > 0
    assert torch.allclose(joined, whole[0], atol=1e-5)


@pytest.mark.parametrize("predictor", ["stochastic", "plain"])
def test_log_durations_of_a_part_are_the_whole_sentences(
        synth, predictor: str) -> None:  # type: ignore[no-untyped-def]
    """What ``prior_parts`` relies on: the predictor over a part of the sentence and its
    ``radius`` gives the log-durations it gives over the whole sentence."""
    model = synth.model if predictor == "stochastic" else random_model(VARIANTS["plain_dp"])
    ids = torch.tensor(synth.sentences(LONG_SENTENCE)[0]) % model.config.n_vocab
    n, r = len(ids), model.dp.radius
    with torch.inference_mode():
        x, _, _ = model.enc_p(ids)
        noise = torch.randn(n, 2, generator=torch.Generator().manual_seed(7)) * 0.8
        whole = model.dp(x, noise, None)
        for cut in (100, 250):
            for a, b in ((0, cut), (cut, n), (cut - 40, cut + 40)):
                part = model.log_durations(x, noise, None, a, b)
                # float rounding only: products over other row offsets may round differently
                assert torch.allclose(part, whole[a:b], rtol=0, atol=1e-6), (a, b)
            # without the radius past it, the part's last ids would be wrong
            cropped = model.dp(x[:cut], noise[:cut], None)
            assert not torch.allclose(cropped[cut - r :], whole[cut - r : cut], rtol=0, atol=1e-6)


@pytest.mark.parametrize("length_scale", [1.0, 0.3])
def test_the_first_chunk_needs_only_the_head_of_the_prior(  # type: ignore[no-untyped-def]
        synth, length_scale: float) -> None:
    """A long sentence's first audio waits for the durations of its first ids only; the
    rest of the prior is computed after that audio is out. Also when spoken fast (fewer
    frames an id, so the head takes more ids)."""
    opts = SynthesisOptions(seed=2, length_scale=length_scale)
    parts, g = synth.prior_parts(synth.sentences(LONG_SENTENCE)[0], opts)
    pulled: list[int] = []

    def watched():  # type: ignore[no-untyped-def]
        for part in parts:
            pulled.append(part.shape[-1])
            yield part

    chunks = decode_windows(synth.model, watched(), g)
    next(chunks)
    assert len(pulled) == 1
    rest = list(chunks)
    assert len(pulled) == 2 and rest[-1][1]  # the rest followed, through the sentence's end
    assert pulled[0] < pulled[1]  # the head is the smaller part


def window_ends(frames: int, first: int, largest: int) -> list[int]:
    """Where ``decode_windows`` ends its windows over ``frames`` latent frames (a chunk's
    samples need not fall on a frame boundary: the nearest)."""
    model = random_model(VARIANTS[sorted(VARIANTS)[0]])
    hop = model.config.hop_length
    z_p = torch.randn(1, model.config.inter_channels, frames)
    ends, samples = [], 0
    for chunk, _ in decode_windows(model, z_p, None, first=first, largest=largest):
        samples += len(chunk)
        ends.append(round(samples / hop))
    return ends


def test_windows_double_up_to_the_largest() -> None:
    """``first`` frames, then doubling up to ``largest``; a tail shorter than ``first`` is
    folded into the window before it."""
    assert window_ends(300, 8, 128) == [8, 24, 56, 120, 248, 300]
    assert window_ends(10, 8, 128) == [10]  # a tail shorter than 8 is folded in
    assert window_ends(0, 8, 128) == []


def test_real_voice_streams_exactly_with_noise(synth) -> None:  # type: ignore[no-untyped-def]
    opts = SynthesisOptions(seed=42)
    streamed = list(synth.stream(LONG_SENTENCE, opts))
    one_shot = synth.synthesize(LONG_SENTENCE, opts)
    audio = np.concatenate([c.samples for c in streamed])
    assert len(audio) == len(one_shot)
    assert np.abs(audio - one_shot).max() < 1e-4
    assert len(streamed) >= 5  # audio arrives within the sentence, not after it
    assert streamed[-1].last_in_sentence and not streamed[0].last_in_sentence
    assert_speech(audio, synth.sample_rate, min_seconds=6)


def test_sentences_follow_each_other(synth) -> None:  # type: ignore[no-untyped-def]
    opts = SynthesisOptions(seed=1, sentence_silence=0.2)
    chunks = list(synth.stream("First sentence. Second one!", opts))
    assert sorted({c.sentence for c in chunks}) == [0, 1]
    audio = np.concatenate([c.samples for c in chunks])
    plain = synth.synthesize("First sentence. Second one!", SynthesisOptions(seed=1))
    assert len(audio) == len(plain) + 2 * int(0.2 * synth.sample_rate)


def test_speaker_and_gain(synth) -> None:  # type: ignore[no-untyped-def]
    quiet = synth.synthesize("Hello.", SynthesisOptions(seed=3, gain=0.5))
    loud = synth.synthesize("Hello.", SynthesisOptions(seed=3))
    assert np.allclose(quiet, loud * 0.5, atol=1e-6)
    from tts import VoiceError

    with pytest.raises(VoiceError, match="single speaker"):
        synth.synthesize("Hello.", SynthesisOptions(speaker="bob"))


@pytest.mark.parametrize("field, value", [("length_scale", 0.0), ("length_scale", -1.0),
                                          ("length_scale", math.nan), ("noise_w", math.inf),
                                          ("noise_scale", -0.1), ("gain", 0.0)])
def test_options_refuse_values_the_model_cannot_use(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"SynthesisOptions.{field} must be a finite number"):
        SynthesisOptions(**{field: value})


def test_options_take_zero_noise_and_unset_values() -> None:
    opts = SynthesisOptions(noise_scale=0.0, noise_w=0.0, sentence_silence=0.0)
    assert (opts.noise_scale, opts.noise_w, opts.length_scale) == (0.0, 0.0, None)


class CountingPace(FlowPace):
    """A ``FlowPace`` that notes how many frames each flow push took."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.pushes: list[int] = []

    def flow_ran(self, frames: int, seconds: float) -> None:
        self.pushes.append(frames)
        super().flow_ran(frames, seconds)


def test_windows_are_as_long_as_the_demand_asks_and_still_join_exactly() -> None:
    """A demand asks for 40 frames at the first window and the third, nothing otherwise:
    those windows hold 40 frames, the others follow the doubling plan from there, the flow
    never runs ahead while a demand is made (though the pace would let it), and the chunks
    join into the one-shot audio."""
    model = random_model(VARIANTS[sorted(VARIANTS)[0]])
    hop = model.config.hop_length
    torch.manual_seed(3)
    z_p = torch.randn(1, model.config.inter_channels, 300)
    with torch.inference_mode():
        whole = model.decode(z_p, None)[0, 0].numpy()
    asks = iter([40, 0, 40])
    pace = CountingPace(16000, cap=50, clock=stopped_clock)
    chunks = [c for c, _ in decode_windows(model, z_p, None, pace=pace,
                                           wanted=lambda: next(asks, 0))]
    # 40, then doubling (80), asked 40 but planned 160 -> the largest, 96; the rest
    assert [round(len(c) / hop) for c in chunks] == [40, 80, 96, 84]
    # The flow: the first window and its look-ahead, then each window, then the rest.
    ahead = model.dec.receptive_field + model.flow.receptive_field
    assert pace.pushes == [40 + ahead, 80, 96, 300 - 216 - ahead]
    assert np.abs(np.concatenate(chunks) - np.clip(whole, -1, 1)).max() < 1e-4
    unasked = CountingPace(16000, cap=50, clock=stopped_clock)
    list(decode_windows(model, z_p, None, pace=unasked))
    assert unasked.pushes[1] > 16  # without a demand the flow runs ahead of the 2nd window

"""A streamed text through the engine (``Engine.stream_steps``): sentences that arrive
while one renders join that synthesis, so its lanes can decode the next sentence while one
plays; the audio is what each sentence gives alone, and the engine says it waits for text
only when it has nothing in hand."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np

from daemon.synthesis.engine import Engine
from tts import AudioChunk, SynthesisOptions
from tts.compose import Step

OPTS = SynthesisOptions(seed=3)
TEXT = "Good morning. The door is locked. It will rain after six."


def _batches(engine: Engine) -> list[list[Step]]:
    planner = engine.planner(None, OPTS)
    batches: dict[int, list[Step]] = {}
    for step in planner.feed(TEXT) + planner.finish():
        batches.setdefault(step.sentence, []).append(step)
    return list(batches.values())


async def _audio(chunks: AsyncGenerator[AudioChunk, None]) -> np.ndarray:
    return np.concatenate([c.samples async for c in chunks])


async def test_sentences_in_hand_are_one_synthesis_with_each_ones_audio(engine: Engine) -> None:
    batches = _batches(engine)
    assert len(batches) == 3
    alone = [np.concatenate([c.samples for c in engine.composer.render(b, OPTS)])
             for b in batches]
    renders = engine.renders
    waits: list[bool] = []

    async def arriving() -> AsyncGenerator[list[Step], None]:
        for batch in batches:  # all of them in hand before the first is rendered
            yield batch

    together = await _audio(engine.stream_steps(arriving(), None, OPTS, waits.append))
    assert engine.renders - renders == 1
    assert waits == [True, False]  # before the first sentence; never while one renders
    expected = np.concatenate(alone)
    assert len(together) == len(expected) and np.abs(together - expected).max() < 1e-4


async def test_a_sentence_that_comes_once_all_in_hand_is_done_is_the_next_synthesis(
        engine: Engine) -> None:
    batches = _batches(engine)
    waits: list[bool] = []
    idle = asyncio.Event()

    def waiting(now: bool) -> None:
        waits.append(now)
        if now and waits.count(True) == 2:  # the first sentence is all rendered
            idle.set()

    async def arriving() -> AsyncGenerator[list[Step], None]:
        yield batches[0]
        await idle.wait()
        yield batches[1]

    renders = engine.renders
    got = [c async for c in engine.stream_steps(arriving(), None, OPTS, waiting)]
    assert engine.renders - renders == 2
    assert waits == [True, False, True, False]
    assert {c.sentence for c in got} == {batches[0][0].sentence, batches[1][0].sentence}

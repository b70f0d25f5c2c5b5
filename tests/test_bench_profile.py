"""``bench.profile`` times onnxruntime's prior, flow and decoder as sessions of their own, cut
from the voice's graph. Its figures mean something only if the cut is where the parts meet:
chained, the three parts must give the whole graph's audio."""

from __future__ import annotations

import numpy as np

from bench.profile import onnxruntime_sessions, piper_inputs


def test_the_graph_cut_into_prior_flow_and_decoder_chains_into_the_whole(catalog) -> None:  # type: ignore[no-untyped-def]
    ids = catalog.synthesizer().sentences("Turn on the kitchen lights.")[0]
    # No sampling noise: the prior is the same in both runs.
    feed = piper_inputs(ids, (0.0, 1.0, 0.0))
    parts = onnxruntime_sessions(catalog.resolve().model_path)
    prior = parts.prior.run(None, feed)
    frames = max(prior, key=lambda a: a.shape[1])  # beside it, the frames' mask
    assert frames.shape[1] == 192 and frames.shape[-1] > 50  # the prior's frames, not ids
    latent = parts.flow.run(None, dict(zip(parts.flow_in, prior)))
    assert len(latent) == 1 and latent[0].shape == frames.shape
    chained = parts.dec.run(None, {parts.dec_in[0]: latent[0]})[0]
    whole = parts.whole.run(None, feed)[0]
    assert chained.shape == whole.shape
    assert np.abs(chained - whole).max() < 1e-4
    assert np.abs(whole).max() > 0.05  # speech, not silence

"""Where the time goes: herald's engine stage by stage and operator by operator, beside
onnxruntime running the same voice on the same sentence, in one process, at one thread.

    .venv/bin/python -m bench.profile [--repeats 7] [--text long|short] [--ops 12]

herald's stages: the text encoder, the durations and the prior sampling, the flow and the
generator, each over the whole sentence at once; then the same sentence streamed as herald
streams it (its windows, with no helper), so the difference is what streaming costs.
onnxruntime's parts: the voice's graph cut where the flow and the generator begin
(``onnx.utils.Extractor``) into three sessions, prior, flow and decoder, each fed what the
one before it gave; and the whole graph in one session, as piper-tts runs it. All of them are
timed by turns, run by run, so that a host's drift hits both engines alike; times are the
thread's CPU time (what other processes on a shared host do not change), medians. None of
these runs is profiled: onnxruntime's profiler adds a cost to each of the graph's thousand-odd
nodes (a fifth of a short command's time), so its sums would flatter herald.

The operator tables come from the profilers, torch's over the streamed sentence and
onnxruntime's over the whole graph, and carry each profiler's own cost per operator: read
them for where the time goes inside each engine, not for one engine against the other.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from bench.engine import LONG, SHORT
from bench.machine import describe

K = TypeVar("K")


def _timed(fns: dict[K, Callable[[], object]], repeats: int) -> dict[K, float]:
    """Median thread CPU seconds of each of ``fns``, run by turns (two rounds first to warm
    up; the order reversed every other round, so that none always follows the same one)."""
    names = list(fns)
    times: dict[K, list[float]] = {name: [] for name in names}
    for i in range(repeats + 2):
        for name in names if i % 2 == 0 else reversed(names):
            t = time.thread_time()
            fns[name]()
            if i >= 2:
                times[name].append(time.thread_time() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def herald_stages(text: str) -> tuple[dict[str, Callable[[], object]], float, Any, Any]:
    """herald's stages as calls to time, the sentence's seconds of audio, and the prior's
    and the flow's frames (``[1, c, t]`` arrays) for onnxruntime's parts to run on."""
    import torch

    from tts import SynthesisOptions, VoiceCatalog, prepare_process
    from tts.flow_stream import StreamingFlow
    from tts.generator_stream import StreamingGenerator
    from tts.vits import nhwc

    prepare_process()
    synth = VoiceCatalog().synthesizer()
    model = synth.model
    opts = SynthesisOptions(seed=1).with_defaults(synth.voice)
    ids = synth.sentences(text)[0]
    z_p, g = synth.prior(ids, opts)
    with torch.inference_mode():
        z = StreamingFlow(model.flow, g).push(nhwc(z_p), final=True)

    def encoder() -> None:
        with torch.inference_mode():
            model.enc_p(torch.tensor(ids))

    def prior() -> None:
        synth.prior(ids, opts)

    def flow() -> None:
        with torch.inference_mode():
            StreamingFlow(model.flow, g).push(nhwc(z_p), final=True)

    def generator() -> None:
        with torch.inference_mode():
            StreamingGenerator(model.dec, g).push(z, final=True)

    def streamed() -> None:
        for _ in synth.stream(text, opts):
            pass

    stages: dict[str, Callable[[], object]] = {
        "encoder": encoder, "prior (encoder included)": prior,
        "flow, whole sentence": flow, "generator, whole sentence": generator,
        "streamed (all of it)": streamed}
    audio_s = z_p.shape[-1] * model.config.hop_length / synth.sample_rate
    return stages, audio_s, z_p.squeeze(2).numpy(), z.squeeze(2).numpy()


def piper_inputs(ids: list[int], scales: tuple[float, float, float]) -> dict[str, Any]:
    """A piper voice's graph inputs for one sentence's ``ids``: its noise scale, length
    scale and duration noise (``scales``)."""
    import numpy as np

    return {"input": np.array([ids], np.int64), "input_lengths": np.array([len(ids)], np.int64),
            "scales": np.array(scales, np.float32)}


@functools.cache
def _feed(text: str) -> tuple[Path, dict[str, Any]]:
    """The voice's model file and piper-tts's inputs for ``text``'s first sentence, with the
    voice's own scales (as piper-tts and herald's stages use them)."""
    from tts import VoiceCatalog

    catalog = VoiceCatalog()
    synth = catalog.synthesizer()
    c = synth.voice.config
    return catalog.resolve().model_path, piper_inputs(
        synth.sentences(text)[0], (c.noise_scale, c.length_scale, c.noise_w))


def _session_options() -> Any:
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return so


def _inputs_of(graph: Any, prefix: str) -> list[str]:
    """The tensors the part of ``graph`` whose nodes are named ``prefix...`` reads from the
    rest: not constants, not weights, and not computed from the part itself (some of a
    part's nodes are exported without its prefix, downstream of its named ones)."""
    constants = {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    constants |= {t.name for t in graph.initializer}
    downstream: set[str] = set()
    for n in graph.node:  # topologically ordered
        if n.name.startswith(prefix) or any(i in downstream for i in n.input):
            downstream.update(n.output)
    found: list[str] = []
    for n in graph.node:
        if n.name.startswith(prefix):
            found += [i for i in n.input
                      if i and i not in constants and i not in downstream and i not in found]
    return found


class OnnxParts(NamedTuple):
    """A piper voice's graph in onnxruntime sessions: cut where ``/flow/`` and ``/dec/``
    begin, and whole. ``flow_in``: the tensors the flow reads (the prior's frames and their
    mask), ``dec_in``: the one the decoder reads (the latent frames)."""

    prior: Any
    flow: Any
    dec: Any
    whole: Any
    flow_in: list[str]
    dec_in: list[str]


def onnxruntime_sessions(path: Path) -> OnnxParts:
    """``path``'s graph cut into its prior, flow and decoder, each its own session, and the
    whole graph, as piper-tts exports its voices; one thread each."""
    import onnx
    import onnxruntime
    from onnx.utils import Extractor

    model = onnx.load(str(path))
    graph = model.graph
    flow_in, dec_in = _inputs_of(graph, "/flow/"), _inputs_of(graph, "/dec/")
    if len(flow_in) != 2 or len(dec_in) != 1:
        raise SystemExit(f"{path}: its flow reads {len(flow_in)} tensors and its decoder "
                         f"{len(dec_in)} ({flow_in[:3]}, {dec_in[:3]}), where a piper voice's "
                         "read two (the prior's frames and mask) and one (the latent)")
    cut = Extractor(model)
    so = _session_options()

    def session(model_bytes: bytes | str) -> Any:
        return onnxruntime.InferenceSession(model_bytes, so,
                                            providers=["CPUExecutionProvider"])

    def part(inputs: list[str], outputs: list[str]) -> Any:
        return session(cut.extract_model(inputs, outputs).SerializeToString())

    return OnnxParts(part([i.name for i in graph.input], flow_in), part(flow_in, dec_in),
                     part(dec_in, [o.name for o in graph.output]), session(str(path)),
                     flow_in, dec_in)


def onnxruntime_parts(text: str, z_p: Any, z: Any) -> dict[str, Callable[[], object]]:
    """onnxruntime's prior, flow, decoder and whole graph as calls to time
    (``onnxruntime_sessions``). The flow and the decoder run on herald's frames (``z_p``,
    ``z``: ``[1, c, t]`` arrays), so that both engines' parts do the same work: the prior's
    durations are random."""
    import numpy as np

    path, feed = _feed(text)
    s = onnxruntime_sessions(path)
    flow_feed = {}
    for name, got in zip(s.flow_in, s.prior.run(None, feed)):
        flow_feed[name] = z_p if got.shape[1] == z_p.shape[1] else np.ones(
            (1, 1, z_p.shape[-1]), np.float32)  # the frames' mask
    dec_feed = {s.dec_in[0]: z}
    return {"prior (enc_p, dp)": lambda: s.prior.run(None, feed),
            "flow": lambda: s.flow.run(None, flow_feed),
            "decoder (dec)": lambda: s.dec.run(None, dec_feed),
            "all of it": lambda: s.whole.run(None, feed)}


def herald_ops(text: str, top: int) -> list[tuple[str, float, int]]:
    from torch.profiler import ProfilerActivity, profile

    from tts import SynthesisOptions, VoiceCatalog, prepare_process

    prepare_process()
    synth = VoiceCatalog().synthesizer()
    opts = SynthesisOptions(seed=1)
    for _ in range(2):
        for _ in synth.stream(text, opts):
            pass
    runs = 3
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(runs):
            for _ in synth.stream(text, opts):
                pass
    rows = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)
    return [(e.key, e.self_cpu_time_total / runs / 1e6, e.count // runs) for e in rows[:top]]


def onnxruntime_ops(text: str, runs: int = 3) -> collections.Counter[str]:
    """onnxruntime's seconds per operator type over the whole graph, from its profiler."""
    import onnxruntime

    path, feed = _feed(text)
    with tempfile.TemporaryDirectory() as tmp:
        so = _session_options()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        session = onnxruntime.InferenceSession(str(path), so,
                                               providers=["CPUExecutionProvider"])
        for _ in range(runs):
            session.run(None, feed)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    ops: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            ops[e["args"].get("op_name", "?")] += e["dur"] / 1e6 / runs
    return ops


def main(repeats: int = 7, which: str = "long", top: int = 12) -> int:
    text = LONG if which == "long" else SHORT
    print(describe())
    print(f"text: {which} ({text[:40]}...), one thread, thread CPU time, medians of "
          f"{repeats}, both engines timed by turns, neither profiled\n")
    stages, audio_s, z_p, z = herald_stages(text)
    parts = onnxruntime_parts(text, z_p, z)
    t = _timed({**{("herald", k): v for k, v in stages.items()},
                **{("onnxruntime", k): v for k, v in parts.items()}}, repeats)
    h = {k: t[("herald", k)] for k in stages}
    o = {k: t[("onnxruntime", k)] for k in parts}
    h["streaming's own cost"] = h["streamed (all of it)"] - (
        h["prior (encoder included)"] + h["flow, whole sentence"]
        + h["generator, whole sentence"])
    print(f"{'herald stage':<30} {'ms':>8}    {'onnxruntime part':<18} {'ms':>8}")
    herald_rows = list(h.items())
    ort_rows = [(k, v) for k, v in o.items() if k != "all of it"]
    ort_rows += [("(parts summed)", sum(v for _, v in ort_rows)), ("all of it", o["all of it"])]
    for i in range(max(len(ort_rows), len(herald_rows))):
        left = (f"{herald_rows[i][0]:<30} {herald_rows[i][1] * 1000:>8.1f}"
                if i < len(herald_rows) else " " * 39)
        right = (f"{ort_rows[i][0]:<18} {ort_rows[i][1] * 1000:>8.1f}"
                 if i < len(ort_rows) else "")
        print(f"{left}    {right}")
    print(f"\naudio: {audio_s:.2f} s; herald / onnxruntime: prior "
          f"{h['prior (encoder included)'] / o['prior (enc_p, dp)']:.3f}, flow "
          f"{h['flow, whole sentence'] / o['flow']:.3f}, generator "
          f"{h['generator, whole sentence'] / o['decoder (dec)']:.3f}, streamed / all of it "
          f"{h['streamed (all of it)'] / o['all of it']:.3f}\n")
    print(f"{'herald operator (streamed)':<36} {'ms':>8} {'calls':>7}    "
          f"{'onnxruntime operator':<22} {'ms':>8}")
    hops = herald_ops(text, top)
    oops = onnxruntime_ops(text).most_common(top)
    for i in range(top):
        left = (f"{hops[i][0][:36]:<36} {hops[i][1] * 1000:>8.1f} {hops[i][2]:>7}"
                if i < len(hops) else " " * 53)
        right = f"{oops[i][0][:22]:<22} {oops[i][1] * 1000:>8.1f}" if i < len(oops) else ""
        print(f"{left}    {right}")
    print("(operators: each engine's profiler, with its own cost per operator)")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--text", choices=("long", "short"), default="long")
    ap.add_argument("--ops", type=int, default=12, help="operators listed (the costliest)")
    a = ap.parse_args()
    raise SystemExit(main(a.repeats, a.text, a.ops))

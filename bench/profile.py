"""Where the time goes: herald's engine stage by stage and operator by operator, beside
onnxruntime running the same voice on the same sentence, in one process, at one thread.

    .venv/bin/python -m bench.profile [--repeats 7] [--text long|short] [--ops 12]

herald's stages: the text encoder, the durations and the prior sampling, the flow and the
generator, each over the whole sentence at once; then the same sentence streamed as herald
streams it (its windows, with no helper), so the difference is what streaming costs. Times
are the thread's CPU time (what other processes on a shared host do not change), medians.
onnxruntime's come from its own profiler (``SessionOptions.enable_profiling``), summed per
part of the model (``/enc_p``, ``/dp``, ``/flow``, ``/dec``) and per operator type. The
operator tables: herald's from torch's profiler over the streamed sentence (which adds a
little to every operator), onnxruntime's from its profiler.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.engine import LONG, SHORT
from bench.machine import describe


def _cpu(fn: Callable[[], object], repeats: int) -> float:
    """Median thread CPU seconds of ``fn`` (two runs first to warm up)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        times.append(time.thread_time() - t)
    return statistics.median(times)


def herald_stages(text: str, repeats: int) -> dict[str, float]:
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

    out = {"encoder": _cpu(encoder, repeats), "prior (encoder included)": _cpu(prior, repeats),
           "flow, whole sentence": _cpu(flow, repeats),
           "generator, whole sentence": _cpu(generator, repeats),
           "streamed (all of it)": _cpu(streamed, repeats)}
    out["streaming's own cost"] = out["streamed (all of it)"] - (
        out["prior (encoder included)"] + out["flow, whole sentence"]
        + out["generator, whole sentence"])
    out["audio seconds"] = z_p.shape[-1] * model.config.hop_length / synth.sample_rate
    return out


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


def onnxruntime_profile(text: str, repeats: int) -> dict[str, Any]:
    import numpy as np
    import onnxruntime

    from tts import VoiceCatalog

    catalog = VoiceCatalog()
    synth = catalog.synthesizer()
    ids = synth.sentences(text)[0]
    with tempfile.TemporaryDirectory() as tmp:
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        session = onnxruntime.InferenceSession(str(catalog.resolve().model_path), so,
                                               providers=["CPUExecutionProvider"])
        feed = {"input": np.array([ids], np.int64),
                "input_lengths": np.array([len(ids)], np.int64),
                "scales": np.array([0.667, 1.0, 0.8], np.float32)}
        for _ in range(2):
            session.run(None, feed)
        wall = []
        for _ in range(repeats):
            t = time.thread_time()
            session.run(None, feed)
            wall.append(time.thread_time() - t)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    runs = repeats + 2
    parts: collections.Counter[str] = collections.Counter()
    ops: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name, seconds = e["name"][: -len("_kernel_time")], e["dur"] / 1e6 / runs
        parts[name.split("/")[1] if name.startswith("/") and name.count("/") > 1
              else "(glue)"] += seconds
        ops[e["args"].get("op_name", "?")] += seconds
    return {"total": statistics.median(wall), "parts": dict(parts), "ops": ops}


def main(repeats: int = 7, which: str = "long", top: int = 12) -> int:
    text = LONG if which == "long" else SHORT
    print(describe())
    print(f"text: {which} ({text[:40]}...), one thread, thread CPU time, medians of {repeats}\n")
    h = herald_stages(text, repeats)
    o = onnxruntime_profile(text, repeats)
    print(f"{'herald stage':<30} {'ms':>8}    {'onnxruntime part':<18} {'ms':>8}")
    ort_rows = [(k, o["parts"].get(k, 0.0)) for k in ("enc_p", "dp", "flow", "dec", "(glue)")]
    herald_rows = [(k, v) for k, v in h.items() if k != "audio seconds"]
    for i in range(max(len(ort_rows), len(herald_rows))):
        left = (f"{herald_rows[i][0]:<30} {herald_rows[i][1] * 1000:>8.1f}"
                if i < len(herald_rows) else " " * 39)
        right = (f"{ort_rows[i][0]:<18} {ort_rows[i][1] * 1000:>8.1f}"
                 if i < len(ort_rows) else "")
        print(f"{left}    {right}")
    print(f"{'':<39}    {'all of it':<18} {o['total'] * 1000:>8.1f}")
    print(f"\naudio: {h['audio seconds']:.2f} s; herald streamed / onnxruntime: "
          f"{h['streamed (all of it)'] / o['total']:.3f}\n")
    print(f"{'herald operator (streamed)':<36} {'ms':>8} {'calls':>7}    "
          f"{'onnxruntime operator':<22} {'ms':>8}")
    hops = herald_ops(text, top)
    oops = o["ops"].most_common(top)
    for i in range(top):
        left = (f"{hops[i][0][:36]:<36} {hops[i][1] * 1000:>8.1f} {hops[i][2]:>7}"
                if i < len(hops) else " " * 53)
        right = f"{oops[i][0][:22]:<22} {oops[i][1] * 1000:>8.1f}" if i < len(oops) else ""
        print(f"{left}    {right}")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--text", choices=("long", "short"), default="long")
    ap.add_argument("--ops", type=int, default=12, help="operators listed (the costliest)")
    a = ap.parse_args()
    raise SystemExit(main(a.repeats, a.text, a.ops))

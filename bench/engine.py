"""Engine benchmark: herald's streaming PyTorch engine against piper-tts (onnxruntime), same
voice, same texts, same number of cores, in one run.

For each core count, both engines are loaded in one process and alternate run by run (so a
load that drifts hits both alike); every time is a median over repetitions. At N cores,
piper-tts runs onnxruntime on N intra-op threads; herald runs as the daemon does, one thread
of its own and N - 1 helper processes (``daemon.synthesis.helpers``). Figures: the first audio and
the whole audio of a short command and of a long sentence, the real-time factor of the long one,
and the CPU time per second of speech (herald's helpers included). Memory is measured apart,
each engine alone in a fresh process speaking the long sentence: peak RSS of the main
process, PSS and USS over all of its processes. Shared machines drift, so read the ratios
herald / piper-tts, with the machine line printed first.

    .venv/bin/herald bench [--json] [--repeats N] [--threads 1 2] [--keep-warm auto|on|off]

``--keep-warm`` is the daemon's ``voices.keep_warm`` (default ``auto``: where idle memory goes
cold, as on some VM hosts, herald keeps its voice's weights warm between requests;
piper-tts has no such thing and does not get it).

What that costs while nobody speaks: ``python -m bench.engine --idle-cpu 20`` holds the voice,
speaks once, then reports the process's CPU over 20 s of idle with the sweeps and without.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.machine import describe
from tts.neighbours import cpu_seconds  # torch-free

if TYPE_CHECKING:  # tts imports torch: the piper-tts RSS process must not (see _peak_rss)
    from tts.memory import KeepWarm

COOL_DOWN = 0.3  # seconds between runs
RSS_RUNS = 3  # fresh processes per engine for the memory figures, alternating
SHORT = "Turn on the kitchen lights."
LONG = ("The weather service says that a band of heavy rain will reach the coast this evening, "
        "bringing strong winds, falling temperatures and the chance of thunder before it clears "
        "out early tomorrow morning.")


Run = tuple[float, float, float, float]  # first chunk, all of it, audio, CPU (seconds)
Timed = Callable[[str], Run]


def _cpu_of(pids: Callable[[], list[int]]) -> Callable[[], float]:
    """CPU seconds this process and the processes ``pids`` gives have used so far."""
    return lambda: cpu_seconds(pids())


def _timed(chunks: Callable[[str], Iterable[np.ndarray]], rate: int,
           cpu: Callable[[], float] = time.process_time) -> Timed:
    """A run of one text: (seconds to the first chunk, seconds in all, seconds of audio,
    CPU seconds used meanwhile)."""

    def once(text: str) -> Run:
        c0, t0 = cpu(), time.perf_counter()
        first = None
        samples = 0
        for chunk in chunks(text):
            if first is None:
                first = time.perf_counter() - t0
            samples += len(chunk)
        return first or 0.0, time.perf_counter() - t0, samples / rate, cpu() - c0

    return once


def _herald(threads: int | None, keep_warm: KeepWarm = "auto"
            ) -> tuple[Timed, Timed, bool]:
    """herald as the daemon runs it (``threads`` None: its default): streaming to a listener,
    and making audio nobody plays before the end (``whole``, as for an HTTP WAV); and whether
    its warmer sweeps while idle."""
    from daemon.synthesis.helpers import HelperPool
    from tts import SynthesisOptions, VoiceCatalog, default_threads, prepare_process
    from tts.warm import Warmer

    prepare_process()
    catalog = VoiceCatalog()
    synth = catalog.synthesizer()
    lanes = threads or default_threads()
    # As the daemon runs it: a synthesis on one thread, and helper processes forked once the
    # voice is loaded, for the cores beyond the first.
    helpers = HelperPool(catalog, lanes - 1) if lanes > 1 else None
    if helpers is not None:
        atexit.register(helpers.close)
    opts = SynthesisOptions()
    cpu = _cpu_of(lambda: helpers.pids if helpers else [])
    once = _timed(lambda text: (c.samples for c in synth.stream(text, opts, helpers)),
                  synth.sample_rate, cpu)
    whole = _timed(lambda text: (c.samples for c in synth.stream(text, opts, helpers,
                                                                 whole=True)),
                   synth.sample_rate, cpu)
    _herald_processes[:] = [os.getpid(), *(helpers.pids if helpers else [])]
    if keep_warm == "off":
        return once, whole, False
    busy = threading.Event()  # as the daemon's engine: no sweep while it speaks
    runs = [0]  # as the engine's renders: the warmer relearns weights and code after them
    warmer = Warmer(lambda: [synth.model], busy=busy.is_set, generation=lambda: runs[0])
    warmer.start(keep_warm)
    atexit.register(warmer.stop)
    warmer.decided.wait()  # measure herald as it will run: with or without the sweeps

    def speaking(how: Timed) -> Timed:
        def run(text: str) -> Run:
            busy.set()
            try:
                return how(text)
            finally:
                runs[0] += 1
                busy.clear()
        return run

    return speaking(once), speaking(whole), warmer.sweeping


def _default_voice_model() -> Path:
    from tts import VoiceCatalog

    return VoiceCatalog().resolve().model_path


def _piper(threads: int | None, model: Path | None = None) -> Timed:
    """piper-tts on ``model`` (NAME.onnx beside NAME.onnx.json; default: herald's default
    voice, found through ``tts``, which imports torch). ``threads`` None: onnxruntime's
    default session options, as ``PiperVoice.load`` makes them."""
    import onnxruntime
    from piper import PiperVoice, SynthesisConfig
    from piper.config import PiperConfig

    model = model or _default_voice_model()
    so = onnxruntime.SessionOptions()
    if threads is not None:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(model), sess_options=so,
                                           providers=["CPUExecutionProvider"])
    config = json.loads(model.with_name(model.name + ".json").read_text())
    voice = PiperVoice(session=session, config=PiperConfig.from_dict(config))
    cfg = SynthesisConfig()
    return _timed(lambda text: (c.audio_float_array for c in voice.synthesize(text, cfg)),
                  voice.config.sample_rate)


def _timing(threads: int | None, repeats: int, keep_warm: KeepWarm = "auto"
            ) -> dict[str, Any]:
    """Both engines in one process, alternating run by run, so load drifts hit both alike."""
    herald, whole, sweeping = _herald(threads, keep_warm)
    engines = {"herald": herald, "herald_whole": whole, "piper": _piper(threads)}
    for once in engines.values():
        once(SHORT)  # warm-up
    raw: dict[str, dict[str, list[Run]]] = {
        name: {"short": [], "long": []} for name in engines}
    for rep in range(repeats):
        order = list(engines) if rep % 2 == 0 else list(reversed(engines))
        for label, text in (("short", SHORT), ("long", LONG)):
            for name in order:
                # Let the other engine's idle workers stop spinning first (onnxruntime's
                # and OpenMP's threads busy-wait for a while after a run); without the pause,
                # whichever engine runs second at 2 threads finds a core taken.
                time.sleep(COOL_DOWN)
                raw[name][label].append(engines[name](text))
    out: dict[str, Any] = {}
    for name, by_text in raw.items():
        out[name] = {}
        for label, runs in by_text.items():
            out[name][label] = {
                "first_audio_ms": statistics.median(r[0] for r in runs) * 1000,
                "total_ms": statistics.median(r[1] for r in runs) * 1000,
                "rtf": statistics.median(r[1] / r[2] for r in runs),
                "cpu_per_audio_s": statistics.median(r[3] / r[2] for r in runs),
                "audio_s": runs[0][2],
            }
    out["herald"]["keep_warm_sweeping"] = sweeping
    return out


def _peak_rss(engine: str, threads: int, model: Path | None = None) -> None:
    """Load one engine alone and speak the long sentence once: its own peak RSS, and its
    PSS and USS right after (what it shares with other processes, libraries' code above
    all, counted by share or not at all). piper-tts gets its voice file from the caller:
    found through ``tts``, it would carry torch's ~220 MB in its figure."""
    (_herald(threads, "off")[0] if engine == "herald" else _piper(threads, model))(LONG)
    pids = _herald_processes if engine == "herald" else [os.getpid()]
    sizes = [_pss_uss_mb(pid) for pid in pids]
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "pss_mb": sum(s.get("pss_mb", 0.0) for s in sizes),
                      "uss_mb": sum(s.get("uss_mb", 0.0) for s in sizes)}))


_herald_processes: list[int] = []  # herald's process and its helpers, once _herald ran


def _pss_uss_mb(pid: int | str = "self") -> dict[str, float]:
    """A process's proportional and unique set sizes now, in MB (Linux)."""
    kb: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if rest.strip().endswith("kB"):
                    kb[key] = int(rest.split()[0])
    except OSError:
        return {}
    return {"pss_mb": kb.get("Pss", 0) / 1024,
            "uss_mb": (kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) / 1024}


def _idle_cpu(seconds: float) -> None:
    """Percent of one core a process holding the voice uses over ``seconds`` of idle after
    one sentence, with ``keep_warm`` on and off (each in a fresh process)."""
    for mode in ("on", "off"):
        out = _spawn("--idle-cpu-of", mode, "--seconds", str(seconds))
        print(f"keep_warm {mode}: {out['cpu_percent']:.1f}% of one core over {seconds:g} s "
              "of idle")


def _idle_cpu_of(mode: KeepWarm, seconds: float) -> None:
    speak, _, _ = _herald(1, mode)
    speak(SHORT)
    time.sleep(3)  # the sweeps learn what the sentence ran
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(seconds)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(json.dumps({"cpu_percent": 100 * cpu / seconds}))


def _spawn(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.engine", *args],
                         capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(repeats: int = 5, threads: list[int] | None = None, as_json: bool = False,
         keep_warm: KeepWarm = "auto") -> int:
    from tts.memory import KEEP_WARM_MODES

    if keep_warm not in KEEP_WARM_MODES:
        raise ValueError(f"keep_warm must be one of {', '.join(KEEP_WARM_MODES)}")
    model = str(_default_voice_model())
    results: dict[str, Any] = {}
    for n in threads or [1, 2]:
        if not as_json:
            print(f"measuring at {n} thread(s): herald (keep_warm {keep_warm}), piper-tts ...",
                  file=sys.stderr)
        timing = _spawn("--timing", "--threads", str(n), "--repeats", str(repeats),
                        "--keep-warm", keep_warm)
        h, p = timing["herald"], timing["piper"]
        # One process of each in turn, RSS_RUNS times: memory drifts with the host's too.
        mem: dict[str, list[dict[str, float]]] = {"herald": [], "piper": []}
        for _ in range(RSS_RUNS):
            mem["herald"].append(_spawn("--rss", "herald", "--threads", str(n)))
            mem["piper"].append(_spawn("--rss", "piper", "--threads", str(n), "--model", model))
        for side, figures in ((h, mem["herald"]), (p, mem["piper"])):
            for k in figures[0]:
                side[k] = statistics.median(f[k] for f in figures)
        rtf_h, rtf_p = h["long"]["rtf"], p["long"]["rtf"]
        results[f"threads_{n}"] = {
            "herald": h, "herald_whole": timing["herald_whole"], "piper": p,
            "rtf_herald": round(rtf_h, 4), "rtf_piper": round(rtf_p, 4),
            "first_audio_short_ratio": round(h["short"]["first_audio_ms"]
                                             / p["short"]["first_audio_ms"], 3),
            "first_audio_long_ratio": round(h["long"]["first_audio_ms"]
                                            / p["long"]["first_audio_ms"], 3),
            "total_short_ratio": round(h["short"]["total_ms"] / p["short"]["total_ms"], 3),
            "total_long_ratio": round(h["long"]["total_ms"] / p["long"]["total_ms"], 3),
            "rtf_ratio": round(rtf_h / rtf_p, 3),
            "cpu_short_ratio": round(h["short"]["cpu_per_audio_s"]
                                     / p["short"]["cpu_per_audio_s"], 3),
            "cpu_long_ratio": round(h["long"]["cpu_per_audio_s"]
                                    / p["long"]["cpu_per_audio_s"], 3),
            "peak_rss_mb": round(h["peak_rss_mb"], 1),
            "peak_rss_mb_piper": round(p["peak_rss_mb"], 1),
        }
    summary = {k: max(r[k] for r in results.values())
               for k in ("first_audio_short_ratio", "first_audio_long_ratio",
                         "total_short_ratio", "total_long_ratio", "rtf_ratio",
                         "cpu_short_ratio", "cpu_long_ratio", "peak_rss_mb")}
    report = {**summary, "repeats": repeats, "keep_warm": keep_warm, "machine": describe(),
              "by_threads": results}
    if as_json:
        print(json.dumps(report, indent=2))
        return 0
    print(describe())
    print(f"{'threads':>7} {'figure':<28} {'herald':>10} {'piper-tts':>10} {'ratio':>7}")
    for key, r in results.items():
        label = key.split("_")[1]
        h, w, p = r["herald"], r["herald_whole"], r["piper"]
        rows = [("first audio, short (ms)", h["short"]["first_audio_ms"],
                 p["short"]["first_audio_ms"]),
                ("first audio, long (ms)", h["long"]["first_audio_ms"],
                 p["long"]["first_audio_ms"]),
                ("all of it, short (ms)", h["short"]["total_ms"], p["short"]["total_ms"]),
                ("all of it, long (ms)", h["long"]["total_ms"], p["long"]["total_ms"]),
                ("made whole, short (ms)", w["short"]["total_ms"], p["short"]["total_ms"]),
                ("made whole, long (ms)", w["long"]["total_ms"], p["long"]["total_ms"]),
                ("real-time factor, long", r["rtf_herald"], r["rtf_piper"]),
                ("CPU s per s of speech, short", h["short"]["cpu_per_audio_s"],
                 p["short"]["cpu_per_audio_s"]),
                ("CPU s per s of speech, long", h["long"]["cpu_per_audio_s"],
                 p["long"]["cpu_per_audio_s"]),
                ("peak RSS (MB)", h["peak_rss_mb"], p["peak_rss_mb"]),
                ("PSS after (MB)", h["pss_mb"], p["pss_mb"]),
                ("USS after (MB)", h["uss_mb"], p["uss_mb"])]
        for name, a, b in rows:
            print(f"{label:>7} {name:<28} {a:>10.3f} {b:>10.3f} {a / b:>7.3f}")
    print("(summary: worst ratio over thread counts) "
          + ", ".join(f"{k}={v}" for k, v in summary.items()))
    sweeping = [key.split("_")[1] for key, r in results.items()
                if r["herald"]["keep_warm_sweeping"]]
    print(f"herald keep_warm {keep_warm}: "
          + (f"swept while idle at {' and '.join(sweeping)} thread(s)" if sweeping
             else "no sweeps (memory stays warm here, or off)"))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--timing", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rss", choices=("herald", "piper"), help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep-warm", default="auto", help="auto, on or off (checked by main)")
    ap.add_argument("--idle-cpu", type=float, metavar="SECONDS",
                    help="instead: herald's CPU while idle, keep_warm on against off")
    ap.add_argument("--idle-cpu-of", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=20.0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.idle_cpu:
        _idle_cpu(a.idle_cpu)
    elif a.idle_cpu_of:
        _idle_cpu_of(a.idle_cpu_of, a.seconds)
    elif a.timing:
        print(json.dumps(_timing(a.threads[0], a.repeats, a.keep_warm)))
    elif a.rss:
        _peak_rss(a.rss, a.threads[0], a.model)
    else:
        sys.exit(main(a.repeats, a.threads, a.json, a.keep_warm))

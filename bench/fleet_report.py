"""The fleet benchmark's table (``bench.fleet``; ``--json`` prints the same figures raw)."""

from __future__ import annotations

from typing import Any


def _n(x: Any, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def print_report(r: dict[str, Any]) -> None:
    load = lambda xs: "/".join(f"{x:.2f}" for x in xs)  # noqa: E731
    print(f"herald fleet benchmark, {r['date']}, {r['cpus']} CPUs, load average (1/5/15 min) "
          f"{load(r['load_before'])} before, {load(r['load_after'])} after, {r['seconds']} s; "
          f"medians of {r['repeats']}")
    print("workers: one torch thread each (one core); satellites: no model, speaker on ALSA "
          "null; one host, loopback")

    print("\njob latency, ms from the publish (group: announcement to the n members; own: "
          "one satellite's say)")
    head = (f"{'w':>1} {'n':>3} {'kind':5} {'text':5} {'chunk0@bench':>12} "
            f"{'audio at satellite':>18} {'playback start':>15} {'skew':>5} {'spread':>6} "
            f"{'worker 1st':>10} {'rtf':>5}")
    print(head + "\n" + "-" * len(head))
    for x in r["latency"]:
        print(f"{x['workers']:>1} {x['satellites']:>3} {x['kind']:5} {x['text']:5} "
              f"{x['probe_first_chunk_ms']:>12.0f} "
              f"{x['satellite_first_ms']:>8.0f} / {x['satellite_first_slowest_ms']:<7.0f} "
              f"{x['playback_ms']:>6.0f} / {x['playback_slowest_ms']:<6.0f} "
              f"{_n(x['start_skew_ms'], '.1f'):>5} {_n(x['start_skew_spread_ms'], '.1f'):>6} "
              f"{x['worker_first_ms']:>10.0f} {x['worker_rtf']:>5.3f}")
    print("(audio at satellite, playback start: median / slowest satellite; skew: members' "
          "start_skew_ms, spread: latest - earliest)")

    print("\nfan-out per announcement: Mosquitto (without the benchmark's own subscription "
          "and its idle cost), the workers, each member")
    head = (f"{'w':>1} {'n':>3} {'text':5} {'chunks':>6} {'CPU ms':>7} {'messages':>8} "
            f"{'payload kB':>10} {'wire kB':>8} {'worker CPU ms':>13} "
            f"{'member CPU ms med/max':>21}")
    print(head + "\n" + "-" * len(head))
    for x in r["fanout"]:
        print(f"{x['workers']:>1} {x['satellites']:>3} {x['text']:5} {x['audio_chunks']:>6.0f} "
              f"{x['broker_cpu_ms']:>7.2f} {x['messages']:>8.1f} {x['payload_kb']:>10.1f} "
              f"{x['kb']:>8.1f} {x['worker_cpu_ms']:>13.0f} "
              f"{x['satellite_cpu_ms']:>12.0f} / {x['satellite_cpu_max_ms']:<6.0f}")
    idle = r["broker_idle"]
    print(f"(idle, subtracted: {idle['cpu'] * 1000:.2f} ms CPU/s, {idle['messages']:.1f} "
          "messages/s)")

    if r["bursts"]:
        print("\nshort commands from k satellites at once")
        head = (f"{'w':>1} {'k':>3} {'ok':>3} {'failed':>6} {'seconds':>7} {'jobs/s':>6} "
                f"{'first audio med / slowest':>25} {'worker queue':>12} {'rtf':>5}  refused")
        print(head + "\n" + "-" * len(head))
        for x in r["bursts"]:
            print(f"{x['workers']:>1} {x['k']:>3} {x['ok']:>3} {x['failed']:>6} "
                  f"{x['seconds']:>7.2f} {x['jobs_per_s']:>6.2f} "
                  f"{_n(x['first_ms']):>14} / {_n(x['first_slowest_ms']):<8} "
                  f"{_n(x['worker_queue_ms']):>12} {_n(x['worker_rtf'], '.3f'):>5}  "
                  f"{', '.join(x['refused']) or '-'}")

    if r["streams"]:
        print("\nconcurrent streams of the long sentence (gaps: played from the first chunk; "
              f"buffered: from {r['buffer_ms']:.0f} ms after it; in time: first chunk within "
              f"{r['start_ms']:.0f} ms)")
        head = (f"{'w':>1} {'N':>3} {'worst gap':>9} {'with gaps':>9} {'buffered':>8} "
                f"{'slowest first':>13} {'in time':>7} {'rtf med/max':>11} {'real time':>9}  "
                "last round's gaps (ms)")
        print(head + "\n" + "-" * len(head))
        for x in r["streams"]:
            print(f"{x['workers']:>1} {x['streams']:>3} {x['worst_gap_ms']:>7.0f}ms "
                  f"{x['streams_with_gaps']:>9.0f} {x['worst_gap_buffered_ms']:>6.0f}ms "
                  f"{x['slowest_first_ms']:>11.0f}ms {x['started_in_time']:>7.0f} "
                  f"{x['worker_rtf']:>5.2f}/{x['worker_rtf_max']:<5.2f} "
                  f"{'yes' if x['real_time'] else 'no':>9}  "
                  f"{', '.join(str(g) for g in x['last_round_gaps_ms'])}")
        kept = ", ".join(f"{w} worker(s): {n}" for w, n in r["real_time_streams"].items())
        print(f"streams kept in real time: {kept} (workers' fleet.slots: "
              f"{r['worker_slots']})")

    print("\nmemory, MiB (median / largest)")
    for when in ("memory_idle", "memory_end"):
        for role, m in r[when].items():
            parts = ", ".join(f"{k.upper()} {v['median']:.0f} / {v['max']:.0f}"
                              for k, v in m.items())
            print(f"  {role:9} {'at start' if when == 'memory_idle' else 'at the end':10} "
                  f"{parts}")

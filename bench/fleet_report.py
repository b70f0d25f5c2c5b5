"""The fleet benchmark's tables (``bench.fleet``; ``--json`` prints the same figures raw)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

Row = dict[str, Any]
Column = tuple[str, int, Callable[[Row], str]]  # header, width, the cell


def _n(x: Any, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def _f(key: str, fmt: str = ".0f") -> Callable[[Row], str]:
    return lambda x: _n(x[key], fmt)


def _pair(a: str, b: str, fmt: str = ".0f") -> Callable[[Row], str]:
    """Two figures as "a / b" (a median and the slowest)."""
    return lambda x: f"{_n(x[a], fmt)} / {_n(x[b], fmt)}"


def say(text: str) -> None:
    """A line of prose, wrapped to fit beside the tables."""
    print(textwrap.fill(text, 100, subsequent_indent="  "))


def table(title: str, columns: list[Column], rows: list[Row],
          extra: Callable[[Row], str] = lambda x: "") -> None:
    """``rows`` under ``title``, one column per spec, ``extra`` after the last column."""
    print()
    say(title)
    head = " ".join(f"{h:>{w}}" for h, w, _ in columns)
    print(head + "\n" + "-" * len(head))
    for x in rows:
        print(" ".join(f"{cell(x):>{w}}" for _, w, cell in columns) + extra(x))


WHO: list[Column] = [("w", 1, _f("workers")), ("n", 3, _f("satellites"))]

LATENCY: list[Column] = [
    *WHO, ("kind", 5, lambda x: x["kind"]), ("text", 5, lambda x: x["text"]),
    ("chunk0@bench", 12, _f("probe_first_chunk_ms")),
    ("audio at satellite", 18, _pair("satellite_first_ms", "satellite_first_slowest_ms")),
    ("playback start", 15, _pair("playback_ms", "playback_slowest_ms")),
    ("skew", 5, _f("start_skew_ms", ".1f")), ("spread", 6, _f("start_skew_spread_ms", ".1f")),
    ("worker 1st", 10, _f("worker_first_ms")), ("rtf", 5, _f("worker_rtf", ".3f"))]

FANOUT: list[Column] = [
    *WHO, ("text", 5, lambda x: x["text"]), ("chunks", 6, _f("audio_chunks")),
    ("CPU ms", 7, _f("broker_cpu_ms", ".2f")), ("messages", 8, _f("messages", ".1f")),
    ("payload kB", 10, _f("payload_kb", ".1f")), ("wire kB", 8, _f("kb", ".1f")),
    ("worker CPU ms", 13, _f("worker_cpu_ms")),
    ("member CPU ms med/max", 21, _pair("satellite_cpu_ms", "satellite_cpu_max_ms"))]

BURSTS: list[Column] = [
    ("w", 1, _f("workers")), ("k", 3, _f("k")), ("ok", 3, _f("ok")),
    ("failed", 6, _f("failed")), ("seconds", 7, _f("seconds", ".2f")),
    ("jobs/s", 6, _f("jobs_per_s", ".2f")),
    ("first audio med / slowest", 25, _pair("first_ms", "first_slowest_ms")),
    ("worker queue", 12, _f("worker_queue_ms")), ("rtf", 5, _f("worker_rtf", ".3f"))]

STREAMS: list[Column] = [
    ("w", 1, _f("workers")), ("N", 3, _f("streams")),
    ("worst gap", 9, _f("worst_gap_ms")), ("with gaps", 9, _f("streams_with_gaps")),
    ("buffered", 8, _f("worst_gap_buffered_ms")),
    ("slowest first", 13, _f("slowest_first_ms")), ("in time", 7, _f("started_in_time")),
    ("rtf med/max", 11, _pair("worker_rtf", "worker_rtf_max", ".2f")),
    ("real time", 9, lambda x: "yes" if x["real_time"] else "no")]


def not_played(x: Row) -> str:
    return f"  ({x['failed']:.0f} not played)" if x["failed"] else ""


def print_report(r: dict[str, Any]) -> None:
    def load(xs: list[float]) -> str:
        return "/".join(f"{x:.2f}" for x in xs)

    say(f"herald fleet benchmark, {r['date']}, {r['cpus']} CPUs, load average (1/5/15 min) "
        f"{load(r['load_before'])} before, {load(r['load_after'])} after, {r['seconds']} s; "
        f"medians of {r['repeats']}")
    say("workers: one torch thread each (one core); satellites: no model, speaker on ALSA "
        "null; one host, loopback")
    say("load average (1 min) as each phase began: "
        + ", ".join(f"{at} {x:.1f}" for at, _, x in r["load_during"]))

    table("job latency, ms from the publish (group: announcement to the n members; own: one "
          "satellite's say)", LATENCY, r["latency"], not_played)
    say("(audio at satellite, playback start: median / slowest satellite; skew: members' "
        "start_skew_ms, spread: latest - earliest)")

    table("fan-out per announcement: Mosquitto (without the benchmark's own subscription and "
          "its idle cost), the workers, each member", FANOUT, r["fanout"])
    idle = r["broker_idle"]
    print(f"(idle, subtracted: {idle['cpu'] * 1000:.2f} ms CPU/s, {idle['messages']:.1f} "
          "messages/s)")

    if r["bursts"]:
        table("short commands from k satellites at once", BURSTS, r["bursts"],
              lambda x: f"  {', '.join(x['refused']) or '-'}")

    if r["streams"]:
        table(f"concurrent streams of the long sentence (gaps: played from the first chunk; "
              f"buffered: from {r['buffer_ms']:.0f} ms after it; in time: first chunk within "
              f"{r['start_ms']:.0f} ms)", STREAMS, r["streams"],
              lambda x: "  gaps " + ", ".join(str(g) for g in x["last_round_gaps_ms"])
              + not_played(x))
        kept = ", ".join(f"{w} worker(s): {n}" for w, n in r["real_time_streams"].items())
        say(f"streams kept in real time: {kept} (workers' fleet.slots: {r['worker_slots']})")

    if r["failures"]:
        print(f"\n{len(r['failures'])} request(s) a satellite did not play (left out above):")
        same: dict[tuple[str, str, str], list[str]] = {}  # (id, outcome, why) -> devices
        for f in r["failures"]:  # each log line without its time stamp, logger and id
            why = " | ".join(line.split("] ", 1)[-1] for line in f["log"])
            same.setdefault((f["id"], f["outcome"], why), []).append(f["device"])
        for (rid, outcome, why), devices in list(same.items())[:10]:
            say(f"  {rid} on {', '.join(devices)}: {outcome}; {why or 'nothing in its log'}")

    print("\nmemory, MiB (median / largest)")
    for when in ("memory_idle", "memory_end"):
        for role, m in r[when].items():
            parts = ", ".join(f"{k.upper()} {v['median']:.0f} / {v['max']:.0f}"
                              for k, v in m.items())
            print(f"  {role:9} {'at start' if when == 'memory_idle' else 'at the end':10} "
                  f"{parts}")

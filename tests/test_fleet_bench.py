"""The fleet benchmark (``bench.fleet``) at its smallest: one worker and two satellites on a
real Mosquitto, one round of everything. Its figures are the benchmark's business
(bench/README.md); here, that what it measures is there and hangs together."""

from __future__ import annotations

import pytest

from bench.fleet import parser, run

SYNC_DELAY_MS = 400  # fleet.sync_delay's default: members play this long after chunk 0


@pytest.mark.alone  # members play SYNC_DELAY_MS after chunk 0: a busy neighbour makes one late
def test_the_fleet_benchmark_measures_a_small_fleet() -> None:
    r = run(parser().parse_args(["--workers", "1", "--satellites", "2", "--repeats", "1",
                                 "--bursts", "2", "--streams", "1", "--stream-rounds", "1"]))
    rows = {(x["kind"], x["text"]): x for x in r["latency"]}
    assert set(rows) == {(k, t) for k in ("group", "own") for t in ("short", "long")}
    for text in ("short", "long"):
        group = rows[("group", text)]
        # Each member had the audio before the agreed instant, and reported its start skew
        # (how close they came is test_fleet's business).
        ahead = group["playback_ms"] - group["satellite_first_slowest_ms"]
        assert 0 < ahead <= SYNC_DELAY_MS + 50, group
        assert group["start_skew_spread_ms"] is not None and group["failed"] == 0, group
        own = rows[("own", text)]
        assert 0 < own["satellite_first_ms"] == own["playback_ms"], own
    for cost in r["fanout"]:  # both members got every chunk, its start and its stop
        assert cost["messages"] >= 2 * (cost["audio_chunks"] + 2), cost
        assert cost["satellite_cpu_max_ms"] > 0 and cost["worker_cpu_ms"] > 0, cost
    long_audio = [c for c in r["fanout"] if c["text"] == "long"][0]
    assert long_audio["payload_kb"] >= 2 * long_audio["audio_chunks"] * 4.4 * 0.9, long_audio
    assert [(b["k"], b["ok"]) for b in r["bursts"]] == [(2, 2)], r["bursts"]
    assert r["streams"][0]["streams"] == 1 and r["streams"][0]["slowest_first_ms"] > 0
    satellite, worker = r["memory_end"]["satellite"], r["memory_end"]["worker"]
    assert satellite["rss"]["max"] < 150 < worker["rss"]["max"], r["memory_end"]  # no torch

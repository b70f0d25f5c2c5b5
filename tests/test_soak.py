"""``herald run`` on its defaults, round after round of good and bad requests through every
front (``bench.soak``): every answer right, and nothing piling up.

Here the rounds are few and the check is what is exact: a file descriptor or a thread left
per request (a socket not closed, a thread per connection) would be hundreds after them.
Memory is the benchmark's (``python -m bench.soak``, figures in bench/README.md): glibc's
arenas grow in steps of megabytes at moments of their own, so over a few rounds resident
memory says little.
"""

from __future__ import annotations

import pytest

from bench.soak import run

WARMUP = 5  # rounds before the counts are taken: pools and connections reach their size
ROUNDS = 10  # 60 requests counted: a descriptor or thread left by each would be 60


@pytest.mark.slow
@pytest.mark.alone  # a neighbour changes how many pool jobs overlap, so the threads pools start
def test_rounds_of_requests_leave_no_file_descriptors_or_threads_behind() -> None:
    soak = run(ROUNDS, WARMUP)  # raises on any wrong answer, saying what was wrong
    g = soak.growth()
    trace = "\n".join(f"round {s.round}: {s.rss_mb:.1f} MB, {s.fds} fds, {s.threads} threads"
                      for s in soak.samples)
    assert g["requests"] == (ROUNDS - WARMUP) * 12
    # Exact: after each round herald is idle and every client has gone.
    assert g["fds"] == 0, trace
    # One spare: asyncio's default executor may start a thread late, when two of its jobs
    # first overlap (it keeps at most a handful); a thread per request would be 60.
    assert g["threads"] <= 1, trace

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

from bench.soak import SYNTHESIS, run

WARMUP = 5  # rounds before the counts are taken: connections and caches reach their size
ROUNDS = 10  # 60 requests counted: a descriptor or thread left by each would be 60


@pytest.mark.slow
def test_rounds_of_requests_leave_no_file_descriptors_or_threads_behind() -> None:
    soak = run(ROUNDS, WARMUP)  # raises on any wrong answer, saying what was wrong
    g = soak.growth()
    trace = "\n".join(f"round {s.round}: {s.rss_mb:.1f} MB ({s.anon_mb:.1f} anonymous), "
                      f"{s.fds} fds, {s.threads} threads {s.groups}" for s in soak.samples)
    assert g["requests"] == (ROUNDS - WARMUP) * 12
    # Exact: after each round herald is idle and every client has gone.
    assert g["fds"] == 0, trace
    # Outside the groups that start threads when their work first overlaps or finds a core
    # free (how busy the machine is decides when), no thread is added (``Soak.growth``);
    # those groups stay within their bounds.
    assert g["other_threads"] == 0, trace
    assert soak.over_bounds() == [], trace
    # The groups are told apart: the workers' threads carry their names.
    assert soak.samples[0].groups[SYNTHESIS] >= 1, trace

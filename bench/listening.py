"""What a listener hears of audio that arrives in chunks and is played from the first one as
it comes, in real time: when it starts, and the silence it hears whenever a chunk comes after
the audio before it has run out. Shared by the benchmarks that count such gaps (Wyoming
streams in ``bench.wyoming_bench``, ``bench.load`` and ``bench.concurrency``, fleet streams in
``bench.fleet``); nothing here imports torch."""

from __future__ import annotations


def played(arrivals: list[tuple[float, float]]) -> tuple[float, float]:
    """(first arrival, seconds of gaps) for chunks ``(arrival, seconds of audio)`` played
    from the first one's arrival: a chunk arriving after the audio before it ran out leaves
    a gap, and playback resumes with it."""
    if not arrivals:
        return 0.0, 0.0
    runs_out = arrivals[0][0]
    gaps = 0.0
    for arrival, seconds in arrivals:
        if arrival > runs_out:
            gaps += arrival - runs_out
            runs_out = arrival
        runs_out += seconds
    return arrivals[0][0], gaps

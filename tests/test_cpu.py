"""What herald makes of a torch build this CPU cannot fully run (``tts.cpu``).

The probe's verdicts are checked from the exit statuses and outputs a child gives in each
case; the real thing (an emulated Cortex-A72 with builds that die at import or on two
threads) is in bench/README.md's fresh-machine runs.
"""

from __future__ import annotations

import platform
import signal

import pytest
from fresh_python import run_python

from tts.cpu import (
    PROBE,
    TorchUnusable,
    cached_verdict,
    machine_thread_limit,
    needs_probe,
    probe_verdict,
    usable_threads,
)

SIGILL = -signal.SIGILL
CORTEX_A72 = 0xFF | (1 << 11)  # fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid: no atomics
CORTEX_A76 = CORTEX_A72 | (1 << 8)  # and more, the ARMv8.1 atomics (bit 8) among them


def test_only_an_armv8_0_cpu_is_probed() -> None:
    assert needs_probe("aarch64", CORTEX_A72)
    assert not needs_probe("aarch64", CORTEX_A76)  # Pi 5
    assert not needs_probe("x86_64", 0)


def test_a_build_that_dies_on_two_threads_runs_on_one() -> None:
    limit = probe_verdict(SIGILL, "import\n1\n")
    assert limit is not None and limit.threads == 1
    assert "SIGILL" in limit.reason and "scripts/setup" in limit.reason


def test_a_build_that_dies_at_import_stops_herald_with_what_to_do() -> None:
    with pytest.raises(TorchUnusable, match="dies at import .SIGILL.: run scripts/setup"):
        probe_verdict(SIGILL, "")
    with pytest.raises(TorchUnusable, match="dies on one thread"):
        probe_verdict(SIGILL, "import\n")


def test_a_build_that_runs_or_fails_for_another_reason_is_left_alone() -> None:
    assert probe_verdict(0, "import\n1\n2\n") is None
    assert probe_verdict(1, "") is None  # ImportError: torch's own import says why


def test_the_probe_runs_through_here() -> None:
    """The probe itself, on this machine: every stage reached, so no limit."""
    done = run_python(PROBE, timeout=300)
    assert done.stdout.split() == ["import", "1", "2"]
    assert probe_verdict(done.returncode, done.stdout) is None


def test_this_machine() -> None:
    if platform.machine() not in ("aarch64", "arm64"):
        assert machine_thread_limit() is None
    limit = machine_thread_limit()
    assert usable_threads(4) == (4 if limit is None else limit.threads)


def test_a_verdict_is_probed_once_per_build_and_cpu(tmp_path) -> None:
    store = tmp_path / "herald" / "torch-probe.json"
    runs: list[str] = []

    def probe(verdict: str):
        def run():
            runs.append(verdict)
            return probe_verdict(SIGILL, verdict)
        return run

    first = cached_verdict(store, "2.13.0 a72", probe("import\n1\n"))
    again = cached_verdict(store, "2.13.0 a72", probe("import\n1\n2\n"))
    assert first == again and first is not None and first.threads == 1
    assert runs == ["import\n1\n"]  # the second call read the verdict kept in the file
    for _ in range(2):  # a build that cannot run at all: refused again without a probe
        with pytest.raises(TorchUnusable, match="at import"):
            cached_verdict(store, "2.10.0 a72", probe(""))
    assert runs == ["import\n1\n", ""]


def test_the_cpu_check_runs_before_torch_is_imported_and_only_then() -> None:
    """The text front-end, the audio format and the options load without torch (a satellite
    plays audio without a model); the first import of torch, by any path, is preceded by
    the check of this CPU (``tts.cpu``)."""
    code = """
import sys
import tts, tts.text, tts.audio, tts.options, tts.errors
from tts import AudioFormat, SynthesisOptions, UnknownVoice
assert "torch" not in sys.modules, "torch was imported by the torch-free parts"
checked = []
tts.require_runnable_torch = lambda: checked.append("torch" in sys.modules)
import tts.stream
assert checked == [False], checked
assert "torch" in sys.modules
print("ok")
"""
    assert run_python(code).stdout.strip() == "ok"

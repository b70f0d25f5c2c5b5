"""Code run in a fresh interpreter from the project's root. What a module imports, what a
process keeps or hands back, how its threads and its exit behave: the test's own process,
which has imported pytest and whatever the suite loaded before, cannot show these."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

STDERR_TAIL = 3000  # characters of the interpreter's stderr shown when it fails


def run_python(code: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` in the project's root with this interpreter, asserted to
    exit 0; ``env`` replaces the environment when given."""
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"the interpreter exited {done.returncode}:\n"
                                  f"{done.stderr[-STDERR_TAIL:]}")
    return done

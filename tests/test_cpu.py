"""Which thread counts a CPU can run of a torch build (``tts.cpu``)."""

from __future__ import annotations

import platform

from tts.cpu import machine_thread_limit, thread_limit, usable_threads

# File names from torch 2.13.0's aarch64 wheels: PyPI's CUDA build and a CPU build.
CUDA_BUILD = ["libc10.so", "libc10_cuda.so", "libnvpl_blas_core.so.0",
              "libnvpl_blas_lp64_gomp.so.0", "libtorch_cpu.so", "libtorch_cuda.so"]
CPU_BUILD = ["libc10.so", "libarm_compute.so", "libopenblas-24fd393f.so.0", "libtorch_cpu.so"]
CORTEX_A72 = 0xFF | (1 << 11)  # fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid: no atomics
CORTEX_A76 = CORTEX_A72 | (1 << 8)  # and more, atomics (bit 8) among them


def test_a_pi_4_runs_nvpl_builds_on_one_thread() -> None:
    limit = thread_limit("aarch64", CORTEX_A72, CUDA_BUILD)
    assert limit is not None and limit.threads == 1
    assert "atomic" in limit.reason and "scripts/setup" in limit.reason


def test_no_limit_where_the_cpu_or_the_build_allows_it() -> None:
    assert thread_limit("aarch64", CORTEX_A76, CUDA_BUILD) is None  # Pi 5: has LSE atomics
    assert thread_limit("aarch64", CORTEX_A72, CPU_BUILD) is None  # no NVPL in the build
    assert thread_limit("x86_64", 0, CUDA_BUILD) is None


def test_this_machine() -> None:
    """Where the rule cannot apply, every thread count stays as asked."""
    if platform.machine() not in ("aarch64", "arm64"):
        assert machine_thread_limit() is None
    limit = machine_thread_limit()
    assert usable_threads(4) == (4 if limit is None else limit.threads)

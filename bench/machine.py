"""What a benchmark ran on: the CPU, its vector extensions, the versions of torch and
onnxruntime, and the instruction set torch's kernels were picked for. oneDNN (torch's
convolutions) and onnxruntime's MLAS pick theirs from the same CPU flags, the best the CPU
has. A ratio carries over from one machine to another only so far: an AVX-512 host and an
AVX2 one have given opposite real-time-factor ratios, so every figure is printed with
these."""

from __future__ import annotations

import os
import re

_EXTENSIONS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "asimd",
               "sve")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return "unknown CPU"
    for key in ("model name", "Model", "Hardware", "CPU part"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.M)
        if m:
            return m.group(1).strip()
    return "unknown CPU"


def cpu_extensions() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", f.read(), re.M)
    except OSError:
        return []
    flags = set(m.group(1).split()) if m else set()
    return [e for e in _EXTENSIONS if e in flags]


def versions() -> str:
    parts = []
    try:
        import torch

        parts.append(f"torch {torch.__version__} (kernels for "
                     f"{torch.backends.cpu.get_cpu_capability()})")
    except ImportError:
        pass
    try:
        import onnxruntime

        parts.append(f"onnxruntime {onnxruntime.__version__}")
    except ImportError:
        pass
    return ", ".join(parts)


def describe() -> str:
    """One line: CPU model, cores, vector extensions, library versions and ISAs."""
    ext = ", ".join(cpu_extensions()) or "none of " + "/".join(_EXTENSIONS[:3])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"machine: {cpu_model()}, {cores} cores ({ext}); {versions()}"

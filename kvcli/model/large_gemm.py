"""Which library multiplies prefill-sized float32 matrices on the CPU: MKL or oneDNN.

torch's CPU build sends ``F.linear`` to Intel MKL, and MKL takes its AVX2 code path on CPUs that
are not Intel's, AVX-512 or not. oneDNN, also inside torch (``torch.ops.mkldnn``), chooses its
kernels from the CPU's own feature flags. Measured on an AMD EPYC Zen 5 with AVX-512 (2 cores,
docs/BENCHMARKS.md): 1,024 x 576 x 3,072 at 79 GFLOP/s through MKL against 197 through oneDNN in
the same loaded window. On an AVX2-only CPU both run AVX2 code and MKL was as fast (Zen 3), and
on an Intel CPU MKL has its AVX-512 path, so MKL stays the choice there. The choice is made once
per process; ``KVCLI_LARGE_GEMM=mkl|onednn`` overrides it. The model's kernel routes
(routes.py) hold the choice and make the call.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import torch

CHOICES = ("mkl", "onednn")


def cpuinfo() -> tuple[str, set[str]]:
    """(vendor_id, feature flags) of the first CPU in /proc/cpuinfo; empty where unreadable."""
    vendor, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id" and not vendor:
                vendor = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return vendor, flags


@cache
def library() -> str:
    """"onednn" or "mkl": the library for CPU float32 matmuls past the native kernel's rows."""
    forced = os.environ.get("KVCLI_LARGE_GEMM", "")
    if forced:
        if forced not in CHOICES:
            raise ValueError(f"KVCLI_LARGE_GEMM={forced!r}: expected one of {', '.join(CHOICES)}")
        return forced
    vendor, flags = cpuinfo()
    usable = torch.backends.mkldnn.is_available()
    return "onednn" if usable and "avx512f" in flags and vendor != "GenuineIntel" else "mkl"

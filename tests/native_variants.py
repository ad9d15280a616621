"""The variants of the native kernels a kernel test runs: the default (-march=native) build,
plus the AVX2 one (KVCLI_NATIVE_ISA=avx2, what an AVX2-only CPU such as AMD Zen 3 compiles)
on a CPU with AVX-512, whose own build never runs the AVX2 code paths."""

from __future__ import annotations

import ctypes

import pytest

from kvcli.model import native

_FLAGS = set(native._cpu_flags().split())
VARIANTS = ["native", *(["avx2"] if {"avx512f", "avx2", "fma", "f16c"} <= _FLAGS else [])]


@pytest.fixture(params=VARIANTS)
def native_lib(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ctypes.CDLL:
    """The kernels of one variant; ``native.load()`` (the quantized matmul's) returns them too."""
    monkeypatch.setenv("KVCLI_NATIVE_ISA", request.param)
    lib = native.load()
    if lib is None:
        pytest.skip("no C compiler: the torch path is used")
    return lib

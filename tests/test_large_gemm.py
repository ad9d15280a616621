"""Prefill-sized CPU matmuls: MKL or oneDNN, chosen once per process (model/large_gemm.py).

Both libraries must give the float64 result to float32 rounding on the layout the loader
stores (a transposed view of an ``[in, out]`` buffer), 2-D and 3-D inputs, with and without
bias; the rule picks oneDNN only where MKL would leave AVX-512 unused; a whole engine run with
either library forced equals transformers (tie-aware) on prefill steps past the native rows.
"""

from __future__ import annotations

import random

import pytest
import torch
from fidelity import HFReference, compare

from kvcli.engine.llm import LLM
from kvcli.model import large_gemm, layers
from kvcli.sampling_params import SamplingParams

LIBRARIES = [lib for lib in large_gemm.CHOICES
             if lib == "mkl" or torch.backends.mkldnn.is_available()]


@pytest.fixture
def forced(monkeypatch):
    def force(lib: str) -> None:
        monkeypatch.setenv("KVCLI_LARGE_GEMM", lib)
        large_gemm.library.cache_clear()
    yield force
    large_gemm.library.cache_clear()


@pytest.mark.parametrize("lib", LIBRARIES)
@pytest.mark.parametrize("shape", [(200, 96, 64), (3, 70, 96, 40)])
def test_both_libraries_equal_float64(lib, shape, forced):
    forced(lib)
    torch.manual_seed(len(shape))
    *lead, in_f, out_f = shape
    x = torch.randn(*lead, in_f)
    w = (torch.randn(in_f, out_f) / in_f**0.5).t()  # [out, in] view of [in, out], as loaded
    for bias in (None, torch.randn(out_f)):
        want = x.double() @ w.double().t() + (0 if bias is None else bias.double())
        got = layers.linear(x, w, bias)
        assert got.shape == (*lead, out_f) and got.dtype == torch.float32
        torch.testing.assert_close(got, want.float(), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("vendor", "flags", "want"), [
    ("AuthenticAMD", {"avx2", "avx512f"}, "onednn"),  # MKL runs its AVX2 code here
    ("AuthenticAMD", {"avx2", "fma"}, "mkl"),  # Zen 3: both AVX2, MKL measured as fast
    ("GenuineIntel", {"avx2", "avx512f"}, "mkl"),  # MKL's own AVX-512 path
])
def test_rule(vendor, flags, want, monkeypatch, forced):
    monkeypatch.delenv("KVCLI_LARGE_GEMM", raising=False)
    monkeypatch.setattr(large_gemm, "cpuinfo", lambda: (vendor, flags))
    large_gemm.library.cache_clear()
    if want == "onednn" and not torch.backends.mkldnn.is_available():
        want = "mkl"
    assert large_gemm.library() == want


def test_bad_override_is_named(forced):
    forced("blas")
    with pytest.raises(ValueError, match="KVCLI_LARGE_GEMM='blas'"):
        large_gemm.library()


@pytest.mark.parametrize("lib", LIBRARIES)
def test_engine_with_either_library_equals_transformers(lib, forced, tiny_models):
    forced(lib)
    model_dir = tiny_models["llama-gqa"]
    ref = HFReference(model_dir, 8)
    llm = LLM(str(model_dir), block_size=4)
    rng = random.Random(3)
    vocab = llm.engine.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (90, 75, 120)]  # > 64 rows
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    ties = sum(compare(ref, p, o.outputs[0].token_ids) for p, o in zip(prompts, outs, strict=True))
    assert ties <= 1

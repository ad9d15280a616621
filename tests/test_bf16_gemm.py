"""The native AVX512_BF16 matmul of bfloat16 weights (kvcli/model/native/bf16_gemm.c, through
model/packed.py): equal to float32 arithmetic on the bfloat16-rounded operands, taken by
--dtype bfloat16 where the CPU has avx512_bf16, refused with the reason where it has not."""

from __future__ import annotations

import pytest
import torch

from kvcli.engine.llm import LLM
from kvcli.model import large_gemm, precision
from kvcli.model.packed import PackedWeight
from kvcli.model.precision import Bf16KernelError, bf16_kernel

NATIVE = "avx512_bf16" in precision.cpu_flags() and not precision._native_refusal()
needs_native = pytest.mark.skipif(not NATIVE, reason="no avx512_bf16 (or no native build) here")


def with_flags(monkeypatch: pytest.MonkeyPatch, flags: set[str]) -> None:
    monkeypatch.setattr(large_gemm, "cpuinfo", lambda: ("AuthenticAMD", set(flags)))


@needs_native
@pytest.mark.parametrize(("rows", "out_features", "in_features"),
                         [(1, 16, 32), (1, 40, 37), (3, 1000, 576), (7, 64, 1536),
                          (16, 333, 96), (65, 130, 31), (200, 48, 64)])
def test_native_kernel_equals_float32_on_rounded_operands(rows, out_features, in_features,
                                                        monkeypatch):
    monkeypatch.setenv("KVCLI_BF16_GEMM", "avx512-bf16")  # a CPU with AMX-BF16 defaults to oneDNN
    torch.manual_seed(rows * out_features + in_features)
    w = torch.randn(out_features, in_features).bfloat16()
    x, bias = torch.randn(rows, in_features), torch.randn(out_features)
    packed = PackedWeight.of(w.t().contiguous().t())  # an [in, out] buffer, as layers.py keeps
    assert packed.kernel == "avx512-bf16"
    assert torch.equal(packed.dense(), w)  # the layout holds the weights and nothing else
    ref = (x.bfloat16().double() @ w.double().t()).float()
    y = packed.linear(x, None)
    assert y.dtype == torch.float32 and y.shape == (rows, out_features)
    scale = x.abs().max() * w.float().abs().max() * in_features
    assert (y - ref).abs().max() <= 1e-6 * scale  # float32 sums of exact bf16 products
    assert torch.allclose(packed.linear(x[None], bias)[0], ref + bias, atol=1e-6 * float(scale))


@needs_native
def test_bfloat16_models_take_the_native_kernel(tiny_models, monkeypatch):
    monkeypatch.setenv("KVCLI_BF16_GEMM", "avx512-bf16")  # a CPU with AMX-BF16 defaults to oneDNN
    llm = LLM(str(tiny_models["llama"]), dtype="bfloat16")
    model = llm.engine.model
    assert model.model.layers[0].mlp.down_proj.weight.kernel == "avx512-bf16"
    assert model.logits_weight.kernel == "avx512-bf16"
    assert "native AVX512_BF16" in llm.engine.runner.backend.describe()["matmul"]


def test_cpus_without_avx512_bf16_get_onednn_or_a_clear_refusal(monkeypatch):
    with_flags(monkeypatch, {"avx512f", "amx_bf16", "amx_tile"})  # AMX without AVX512_BF16
    monkeypatch.delenv("KVCLI_BF16_GEMM", raising=False)
    assert bf16_kernel() == "onednn"
    monkeypatch.setenv("KVCLI_BF16_GEMM", "avx512-bf16")
    with pytest.raises(Bf16KernelError, match="no avx512_bf16"):
        bf16_kernel()
    monkeypatch.setenv("KVCLI_BF16_GEMM", "amx")
    with pytest.raises(Bf16KernelError, match="expected one of avx512-bf16, onednn"):
        bf16_kernel()
    with_flags(monkeypatch, {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    monkeypatch.delenv("KVCLI_BF16_GEMM")
    assert bf16_kernel() == "onednn"  # AMX keeps oneDNN's tiles
    monkeypatch.setenv("KVCLI_BF16_GEMM", "onednn")
    with_flags(monkeypatch, {"avx512f", "avx512_bf16"})
    assert bf16_kernel() == "onednn"  # asked for
    monkeypatch.delenv("KVCLI_BF16_GEMM")
    monkeypatch.setenv("KVCLI_NATIVE_ISA", "avx2")  # stands for a CPU without AVX-512
    assert bf16_kernel() == "onednn"


def test_onednn_stays_where_asked(monkeypatch):
    if not precision._has("bfloat16", precision._NATIVE, precision.cpu_flags()):
        pytest.skip("no native bfloat16 here")
    monkeypatch.setenv("KVCLI_BF16_GEMM", "onednn")
    w = torch.randn(48, 64).bfloat16()
    packed = PackedWeight.of(w)
    assert packed.kernel == "onednn" and torch.equal(packed.dense(), w)

"""Quantized weights (kvcli/model/quant, native/qgemm.c) against float references.

- int8 per output channel: de-quantized weights are exactly ``q * scale`` and within half a
  step (``scale / 2``) of the float weights.
- GGUF blocks (Q8_0, Q4_0, Q4_1 from gguf's quantizer; Q4_K, Q5_K, Q6_K as random blocks with
  sane fp16 scales, since gguf's Python package cannot quantize k-quants): the native
  de-quantization equals gguf's own ``gguf.quants.dequantize`` bit for bit.
- The matmul, direct (1-64 rows, de-quantized in registers) and through the float32 GEMM
  (more rows), equals a float64 product of the de-quantized weights within float32 rounding:
  activations stay float32, so the bound is that of a float32 dot product of length K
  (atol 1e-4, rtol 1e-4 on outputs of magnitude ~1), for row counts across the register
  tiles, channel counts that leave a remainder past the last whole tile, 1 and 3 threads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from k_quant_blocks import K_QUANTS, random_k_quant
from native_variants import native_lib  # noqa: F401 - fixture

from kvcli.model import native
from kvcli.model.quant import QuantError
from kvcli.model.quant.weights import (
    I8,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_0,
    QuantWeight,
    StackedWeight,
    quantize_int8,
)

lib = native.load()
needs_native = pytest.mark.skipif(lib is None, reason="no C compiler: the torch path is used")
pytestmark = pytest.mark.usefixtures("native_lib")  # every test under each variant


def gguf_weight(kind: int, w: torch.Tensor) -> QuantWeight:
    packed = quantize(w.numpy(), GGMLQuantizationType(kind))
    return QuantWeight(kind, torch.from_numpy(packed), tuple(w.shape))


def make_weight(kind: int, out_f: int, in_f: int, seed: int = 0) -> QuantWeight:
    if kind in K_QUANTS:
        return random_k_quant(kind, out_f, in_f, seed)
    torch.manual_seed(seed)
    w = torch.randn(out_f, in_f) / in_f**0.5
    return quantize_int8(w) if kind == I8 else gguf_weight(kind, w)


def test_int8_round_trip_is_within_half_a_step():
    torch.manual_seed(1)
    w = torch.randn(40, 96) * torch.rand(40, 1) * 3  # rows of very different ranges
    w[3] = 0.0  # an all-zero channel must not divide by zero
    q = quantize_int8(w)
    assert q.data.dtype == torch.int8 and q.data.abs().max() <= 127
    back = q.dequantize()
    assert torch.equal(back, q.data.float() * q.scale[:, None])
    assert torch.all((back - w).abs() <= q.scale[:, None] / 2 + 1e-7)
    assert torch.equal(back[3], torch.zeros(96))


@needs_native
@pytest.mark.parametrize("kind", [Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K])
def test_gguf_dequantize_equals_gguf_reference_exactly(kind):
    in_f = 512 if kind in K_QUANTS else 160
    q = make_weight(kind, 37, in_f, seed=kind)
    expected = dequantize(q.data.numpy(), GGMLQuantizationType(kind)).reshape(37, in_f)
    assert np.array_equal(q.dequantize().numpy(), expected)
    rows = torch.tensor([5, 0, 36, 5])
    assert np.array_equal(q.dequantize(rows).numpy(), expected[[5, 0, 36, 5]])


def test_dequantize_without_compiler_matches(monkeypatch):
    """No C compiler: the numpy path de-quantizes (once) to the same values."""
    q = make_weight(Q4_1, 16, 64, seed=3)
    expected = dequantize(q.data.numpy(), GGMLQuantizationType.Q4_1).reshape(16, 64)
    monkeypatch.setattr(native, "load", lambda: None)
    assert np.array_equal(q.dequantize().numpy(), expected)
    x = torch.randn(3, 64)
    assert torch.allclose(q.linear(x, None), x @ torch.from_numpy(expected).T, atol=1e-5)


@needs_native
@pytest.mark.parametrize("kind", [I8, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K])
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 64, 70])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_matmul_equals_float64_of_dequantized(kind, rows, threads, monkeypatch):
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    out_f, in_f = 37, 512 if kind in K_QUANTS else 192  # 37: a channel past the last pair
    q = make_weight(kind, out_f, in_f, seed=rows)
    w64 = q.dequantize().double()
    x = torch.randn(rows, in_f)
    for bias in (None, torch.randn(out_f)):
        expected = x.double() @ w64.T + (0 if bias is None else bias.double())
        got = q.linear(x, bias)
        assert got.shape == (rows, out_f) and got.dtype == torch.float32
        assert torch.allclose(got.double(), expected, atol=1e-4, rtol=1e-4)


@needs_native
def test_matmul_keeps_leading_dims():
    q = make_weight(Q8_0, 8, 64)
    x = torch.randn(2, 3, 64)
    assert torch.allclose(q.linear(x, None), (x.reshape(6, 64) @ q.dequantize().T).reshape(2, 3, 8),
                          atol=1e-5)


def test_rows_must_hold_whole_blocks():
    with pytest.raises(QuantError, match="32-blocks"):
        QuantWeight(I8, torch.zeros(4, 48, dtype=torch.int8), (4, 48), torch.ones(4))


@needs_native
def test_stacked_parts_of_different_types():
    """q/k/v in different types (a Q4_K_M file's Q6_K v) run part by part, side by side."""
    parts = [make_weight(Q4_K, 16, 256, seed=1), make_weight(Q6_K, 8, 256, seed=2)]
    stacked = StackedWeight(parts)
    dense = torch.cat([p.dequantize() for p in parts])
    assert stacked.shape == (24, 256) and torch.equal(stacked.dequantize(), dense)
    x, bias = torch.randn(5, 256), torch.randn(24)
    assert torch.allclose(stacked.linear(x, bias), x @ dense.T + bias, atol=1e-4, rtol=1e-4)


@needs_native
def test_numpy_view_runs_the_quantized_matmul():
    """The fused one-row decoder's view: ``row @ w.T`` and ``embed[token]`` without float32."""
    q = make_weight(Q4_1, 24, 64, seed=4)
    view = q.detach().numpy()
    row = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    assert view.shape == (24, 64) and view.T.shape == (64, 24)
    expected = q.linear(torch.from_numpy(row)[None], None)[0].numpy()
    assert np.array_equal(row @ view.T, expected)
    assert np.array_equal(view[5], q.dequantize()[5].numpy())
    with pytest.raises(TypeError):
        row @ view  # noqa: B018 - the [out, in] view cannot be multiplied from the left

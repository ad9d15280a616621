"""Integer-activation matmuls (``--quantization gguf-int``: native/qint.c, quant/int_weights.py).

- The activations' quantization is llama.cpp's q8_0 (d = max|x| / 127, q = round(x / d)),
  checked against a NumPy rendering of that formula (a value may round the other way where
  x / d lies within float32 rounding of a half: at most one step, rarely).
- The kernel, for each variant this CPU runs (AVX512-VNNI, AVX-VNNI, AVX2 maddubs), equals the
  float64 product of the de-quantized weights and the kernel's own quantized activations to
  float32 rounding (atol 1e-5 on outputs ~1-10): the integer sums are exact, so nothing but the
  scales' float32 products differs. Row counts cross the register tiles (4 rows; AVX2 6, with
  every remainder 1-5) and the row panels (248 rows at K = 192; AVX2 246), 37 channels leave a partial 16-channel group and an odd one
  (AVX-512 tiles take two groups), 1 and 3 threads.
- The k-quants (Q4_K, Q5_K, Q6_K: random blocks, see k_quant_blocks.py, de-quantized by gguf's
  own ``gguf.quants.dequantize`` as the independent reference) likewise, to a max relative
  error of 1e-5, their float32 scales d * sc being the products that reference forms.
- Extreme weights (every nibble 15, Q8_0's +-127, Q5_K's 31, Q6_K's -32 and 31) against
  activations of 127 steps: no saturating or wrongly negated sum.
- Types it does not run are refused with an error naming them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from k_quant_blocks import K_QUANTS, random_k_quant

from kvcli.model import native
from kvcli.model.quant import QuantError
from kvcli.model.quant.int_weights import IntWeight, pack
from kvcli.model.quant.weights import (
    I8,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_0,
    QuantWeight,
    quantize_int8,
)
from kvcli.model.routes import process_routes

lib = native.load()
pytestmark = pytest.mark.skipif(lib is None or not lib.kvcli_qint_variants(),
                                reason="no C compiler or not x86: no integer kernels")


def _runs(variant: str) -> bool:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVCLI_QINT_ISA", variant)
        mp.delenv("KVCLI_NATIVE_ISA", raising=False)
        try:
            native.qint_variant(lib)
        except ValueError:
            return False
    return True


VARIANTS = [pytest.param(v, marks=pytest.mark.skipif(lib is None or not _runs(v),
                                                      reason=f"this CPU lacks {v}"))
            for v in native.QINT_VARIANTS]


def gguf_weight(kind: int, out_f: int, in_f: int, seed: int) -> tuple[QuantWeight, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((out_f, in_f)) / in_f**0.5).astype(np.float32)
    if kind in K_QUANTS:
        weight = random_k_quant(kind, out_f, in_f, seed)
        dense = dequantize(weight.data.numpy(), GGMLQuantizationType(kind))
        return weight, dense.reshape(out_f, in_f)
    if kind == I8:  # kvcli's per-channel int8 (--quantization int8)
        q = quantize_int8(torch.from_numpy(w))
        return q, (q.data.double() * q.scale.double()[:, None]).numpy()
    packed = quantize(w, GGMLQuantizationType(kind))
    dense = dequantize(packed, GGMLQuantizationType(kind)).reshape(out_f, in_f)
    return QuantWeight(kind, torch.from_numpy(packed), (out_f, in_f)), dense


def kernel_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, k = x.shape
    q = np.empty((rows, k), np.int8)
    d, s = np.empty((rows, k // 32), np.float32), np.empty((rows, k // 32), np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    lib.kvcli_qint_quantize(x.ctypes.data, q.ctypes.data, d.ctypes.data, s.ctypes.data, rows, k)
    return q, d, s


def test_activation_quantization_is_q8_0():
    x = np.random.default_rng(0).standard_normal((7, 256)).astype(np.float32) * 3
    x[2, :32] = 0.0  # an all-zero block: scale 0, no division by zero
    q, d, s = kernel_quantize(x)
    blocks = x.reshape(7, 8, 32)
    amax = np.abs(blocks).max(axis=2)
    assert np.allclose(d, amax / 127, rtol=1e-6)  # -ffast-math: times 1/127, last bit
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.nan_to_num(np.round(blocks * (127 / amax)[..., None])).reshape(7, 256)
    diff = np.abs(q.astype(np.int32) - want)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01
    assert np.array_equal(q[2, :32], np.zeros(32)) and d[2, 0] == 0
    assert np.allclose(s, d * q.reshape(7, 8, 32).sum(axis=2), rtol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", [Q4_0, Q4_1, Q8_0, I8])
@pytest.mark.parametrize("rows", [1, 3, 4, 8, 11, 70, 300])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_matmul_equals_float64_of_quantized_operands(variant, kind, rows, threads, monkeypatch):
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    out_f, in_f = 37, 192  # 37: two whole 16-channel groups and a partial one
    weight, dense = gguf_weight(kind, out_f, in_f, seed=rows)
    routes = replace(process_routes(), int_matmul=variant)
    packed = pack(weight, routes)
    x = np.random.default_rng(rows + 100).standard_normal((rows, in_f)).astype(np.float32)
    q, d, _ = kernel_quantize(x)
    xq = (q.reshape(rows, -1, 32).astype(np.float64) * d[..., None]).reshape(rows, in_f)
    for bias in (None, torch.randn(out_f)):
        expected = xq @ dense.astype(np.float64).T + (0 if bias is None else bias.double().numpy())
        got = packed.linear(torch.from_numpy(x), bias)
        assert got.shape == (rows, out_f) and got.dtype == torch.float32
        assert np.allclose(got.numpy(), expected, atol=1e-5, rtol=1e-5)
    # and close to the float product: only the activations' rounding (~0.4% of a step) differs
    full = x.astype(np.float64) @ dense.astype(np.float64).T
    assert np.abs(got.numpy() - full - (bias.numpy())).max() < 0.02 * np.abs(full).max()


def _dequantized_activations(x: np.ndarray) -> np.ndarray:
    """The kernel's own q8_0 rounding of ``x``, de-quantized in float64."""
    q, d, _ = kernel_quantize(x)
    return (q.reshape(x.shape[0], -1, 32).astype(np.float64) * d[..., None]).reshape(x.shape)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", [Q4_K, Q5_K, Q6_K])
@pytest.mark.parametrize("rows", [1, 3, 7, 16, 35])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_k_quant_matmul_equals_float64_of_quantized_operands(variant, kind, rows, threads,
                                                             monkeypatch):
    """K = 768: three superblocks (24 sub-blocks); 37 channels: a partial group."""
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    out_f, in_f = 37, 768
    weight, dense = gguf_weight(kind, out_f, in_f, seed=rows + kind)
    packed = pack(weight, replace(process_routes(), int_matmul=variant))
    x = np.random.default_rng(rows).standard_normal((rows, in_f)).astype(np.float32)
    bias = torch.randn(out_f)
    for b in (None, bias):
        expected = (_dequantized_activations(x) @ dense.astype(np.float64).T
                    + (0 if b is None else b.double().numpy()))
        got = packed.linear(torch.from_numpy(x), b).numpy()
        assert got.shape == (rows, out_f)
        assert np.abs(got - expected).max() < 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_agree_and_leading_dims_are_kept(variant):
    weight, _ = gguf_weight(Q4_1, 48, 96, seed=5)
    x = torch.randn(2, 3, 96)
    reference = pack(weight, replace(process_routes(), int_matmul="avx2")).linear(x, None)
    got = pack(weight, replace(process_routes(), int_matmul=variant)).linear(x, None)
    assert got.shape == (2, 3, 48)
    assert torch.allclose(got, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(lib is None or not _runs("amx-int8") or not _runs("avx512-vnni"),
                    reason="this CPU lacks AMX-INT8")
@pytest.mark.parametrize("kind", [Q4_0, Q4_1, Q8_0, I8, Q4_K, Q5_K, Q6_K])
@pytest.mark.parametrize("rows", [16, 17, 47, 300])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_amx_equals_vnni_bit_for_bit(kind, rows, threads, monkeypatch):
    """AMX tiles sum the same integers and fold them in the VNNI tile's order (qint_amx.h): whole
    16-row tiles on AMX, the rest of the rows on VNNI. K = 2,048 makes 300 rows three AMX panels
    (128 rows); 53 channels leave a partial group."""
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    weight, _ = gguf_weight(kind, 53, 2048, seed=rows + kind)
    x = torch.from_numpy(np.random.default_rng(rows).standard_normal((rows, 2048)).astype(np.float32))
    bias = torch.randn(53)
    vnni = pack(weight, replace(process_routes(), int_matmul="avx512-vnni")).linear(x, bias)
    amx = pack(weight, replace(process_routes(), int_matmul="amx-int8")).linear(x, bias)
    assert torch.equal(amx, vnni)


@pytest.mark.parametrize("kind", [Q8_0, Q6_K])  # Q6_K: a Q4_K_M file's output layer
def test_embedding_rows_come_from_the_gguf_bytes(kind):
    weight, dense = gguf_weight(kind, 20, 256, seed=1)
    routes = replace(process_routes(), int_matmul=native.qint_variant(lib))
    kept = pack(weight, routes, keep_source=True)
    assert isinstance(kept, IntWeight)
    assert np.array_equal(kept.dequantize(torch.tensor([3, 0])).numpy(), dense[[3, 0]])
    with pytest.raises(QuantError, match="packed form"):
        pack(weight, routes).dequantize(torch.tensor([0]))


def test_unsupported_types_and_variants_are_refused(monkeypatch):
    q5_0 = QuantWeight(6, torch.zeros(16, 22, dtype=torch.uint8), (16, 32))  # GGML Q5_0
    routes = replace(process_routes(), int_matmul=native.qint_variant(lib))
    with pytest.raises(QuantError, match="runs Q4_0, .*Q6_K weights; this model has GGML type 6 "
                                         r"\(use --quantization gguf\)"):
        pack(q5_0, routes)
    monkeypatch.setenv("KVCLI_QINT_ISA", "sse2")
    with pytest.raises(ValueError, match="expected one of amx-int8, avx512-vnni"):
        native.qint_variant(lib)
    monkeypatch.setenv("KVCLI_QINT_ISA", "avx512-vnni")
    monkeypatch.setenv("KVCLI_NATIVE_ISA", "avx2")  # the AVX2-only CPU this build stands for
    with pytest.raises(ValueError, match="cannot run it; it runs avx2"):
        native.qint_variant(lib)
    monkeypatch.delenv("KVCLI_QINT_ISA")
    assert native.qint_variant(lib) == "avx2"


FP16_AT = {Q4_0: (0,), Q4_1: (0, 2), Q8_0: (0,), **{k: at for k, (_, at) in K_QUANTS.items()}}
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34, **{k: size for k, (size, _) in K_QUANTS.items()}}


def _extreme_blocks(kind: int, rows: int, in_f: int) -> np.ndarray:
    """Every bit set (nibbles 15; Q4_K's / Q5_K's scales and minima 63, Q5_K's q 31, Q6_K's q 63,
    i.e. 31), but Q8_0's rows 127 then -127, Q6_K's last 8 rows q 0 (-32) with scales 127 then
    -128; fp16 scales 0.01."""
    per = 256 if kind in K_QUANTS else 32
    blocks = np.full((rows, in_f // per, BLOCK_BYTES[kind]), 0xFF, np.uint8)
    if kind == Q8_0:
        blocks[:8, :, 2:], blocks[8:, :, 2:] = 127, 256 - 127
    if kind == Q6_K:
        blocks[8:, :, :192] = 0
        blocks[:8, :, 192:208], blocks[8:, :, 192:208] = 127, 128
    for at in FP16_AT[kind]:
        blocks[:, :, at : at + 2] = np.full(blocks.shape[:2], 0.01, np.float16).view(
            np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", [Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K])
def test_extreme_bytes_do_not_saturate(variant, kind):
    """Weights at their largest magnitudes against activations of 127 steps: the AVX2 path's
    16-bit pair sums are at their largest and must not saturate, nor its sign trick negate a
    weight wrongly."""
    rows, in_f = 16, 256
    packed_bytes = _extreme_blocks(kind, rows, in_f)
    weight = QuantWeight(kind, torch.from_numpy(packed_bytes), (rows, in_f))
    dense = dequantize(packed_bytes, GGMLQuantizationType(kind)).reshape(rows, in_f)
    x = np.ones((3, in_f), np.float32)
    x[1] = -1.0
    got = pack(weight, replace(process_routes(), int_matmul=variant)).linear(torch.from_numpy(x),
                                                                              None)
    assert np.allclose(got.numpy(), x.astype(np.float64) @ dense.T.astype(np.float64),
                       atol=1e-4, rtol=1e-5)

"""The int8 KV cache's native kernels (native/paged_attention_int8.c, prefill_attention_int8.c)
against torch: the quantization against its formula, and every attention kernel (decode,
prefill chunks with cached context and a sliding window, shared-prefix decode) against float64
attention over the same cache de-quantized in torch, in each build (AVX-512, AVX2). Where a
build scores in integers (AVX512-VNNI, native/kv_int8.h), the reference takes the queries
rounded to int8 as the kernels round them."""

from __future__ import annotations

import random

import pytest
import torch
from native_variants import native_lib  # noqa: F401 - fixture: each build (AVX-512, AVX2)
from test_native_prefill_attention import (
    BLOCK,
    LONG_POOL,
    long_contexts,
    reference,
    shuffled_tables,
)

from kvcli.model import native
from kvcli.model.attention import LayerAttention, allocate_kv_cache, build_attention_metadata
from kvcli.model.attention.native_int8 import INT8_STORAGE, NativeInt8Backend
from kvcli.model.platform import Platform


def dequantize(kv8: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The float values the int8 rows stand for: (code - zero) * scale."""
    codes = kv8[..., :head_dim].float()
    params = kv8[..., head_dim:].contiguous().view(torch.float32)  # [..., 2]: scale, zero
    return (codes - params[..., 1:2]) * params[..., 0:1]


def quantized(lib, kv: torch.Tensor) -> torch.Tensor:
    """A [2, slots, Hkv, D] float cache written into int8 rows by the kernel."""
    _, slots, kv_heads, dim = kv.shape
    kv8 = torch.zeros(2, slots, kv_heads, dim + 8, dtype=torch.uint8)
    every = torch.arange(slots)
    for i in range(2):
        native.quantize_kv(lib, kv[i], every, kv8[i])
    return kv8


def rounded_queries(q: torch.Tensor) -> torch.Tensor:
    """Each [D] query row rounded to int8 codes and back, as kv_int8.h's quantize_query:
    scale max|q| / 127, codes round(q * 127 / max|q|) to nearest even."""
    amax = q.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return torch.round(q * inv) * (amax / 127.0)


def queries(lib, kv8: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The queries the kernels of this build score with."""
    return rounded_queries(q) if native.int_scores(lib, kv8, q.shape[-1]) else q


def test_integer_scores_where_the_cpu_has_vnni(native_lib):  # noqa: F811
    """The AVX-512 build on a VNNI CPU scores head sizes that are multiples of 64 in integers;
    the AVX2 build, other head sizes and other caches stay float32."""
    from kvcli.model.large_gemm import cpuinfo

    kv8 = torch.zeros(2, 1, 1, 72, dtype=torch.uint8)
    vnni = "avx512_vnni" in cpuinfo()[1] and native.qint_variant(native_lib) in ("avx512-vnni",
                                                                                "amx-int8")
    assert native.int_scores(native_lib, kv8, 64) == vnni
    assert native.int_scores(native_lib, kv8, 128) == vnni
    assert not native.int_scores(native_lib, kv8, 32)
    assert not native.int_scores(native_lib, torch.zeros(2, 1, 1, 64), 64)


def expected(lib, kv8, q, tables, computed, new, window, scale) -> torch.Tensor:
    """float64 attention over the codes, with the queries the kernels score with."""
    return reference(queries(lib, kv8, q), dequantize(kv8, q.shape[-1]), tables, computed, new,
                     window, scale)


def backend(lib) -> NativeInt8Backend:
    return NativeInt8Backend(Platform(torch.device("cpu"), INT8_STORAGE, lib, ""))


def test_quantize_matches_its_formula(native_lib):  # noqa: F811
    torch.manual_seed(0)
    x = torch.randn(2, 40, 3, 64) * torch.rand(1, 40, 3, 1) * 4
    x[0, 5, 1] = 0.75  # a constant row: scale 1, every code 0, exact
    kv8 = quantized(native_lib, x)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = torch.where(hi > lo, (hi - lo) / 255, torch.ones_like(lo))
    codes = torch.round((x - lo) / scale).clamp(0, 255)
    assert (kv8[..., :64].float() - codes).abs().max() <= 1  # rounding at a tie may differ
    params = kv8[..., 64:].contiguous().view(torch.float32)
    torch.testing.assert_close(params[..., 0:1], scale)
    back = dequantize(kv8, 64)
    assert ((back - x).abs() <= scale * 0.5 + 1e-5 * x.abs().amax(-1, keepdim=True) + 1e-6).all()
    assert back[0, 5, 1].eq(0.75).all()


@pytest.mark.parametrize("dim", [64, 24])  # 24: AVX-512's plain C path
def test_quantize_over_threads_equals_row_by_row(dim, native_lib, monkeypatch):  # noqa: F811
    torch.manual_seed(1)
    x = torch.randn(700, 5 * dim)[:, dim : 4 * dim].view(700, 3, dim)  # a projection's rows
    slots = torch.randperm(800)[:700]
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", "2")
    whole = torch.zeros(800, 3, dim + 8, dtype=torch.uint8)
    native.quantize_kv(native_lib, x, slots, whole)  # split over two threads
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", "1")
    rows = torch.zeros_like(whole)
    for t in range(700):
        native.quantize_kv(native_lib, x[t : t + 1], slots[t : t + 1], rows)
    assert torch.equal(whole, rows)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 1, 128), (4, 4, 32),
                                                    (6, 2, 24)])  # 24: AVX-512's plain C path
@pytest.mark.parametrize("window", [None, 21])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_decode_and_prefill_equal_float64_over_the_codes(heads, kv_heads, dim, window, threads,
                                                         native_lib, monkeypatch):  # noqa: F811
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    rng = random.Random(heads * dim + (window or 0))
    torch.manual_seed(dim)
    computed = [0, 0, 40, 7, 33, 0, 12, 50, 3]
    new = [1, 17, 16, 33, 1, 70, 5, 1, 1]  # one-token prompt, chunks, decode tokens
    tables = shuffled_tables(rng, computed, new)
    kv8 = quantized(native_lib, torch.randn(2, 64 * BLOCK, kv_heads, dim) * 3 + 0.5)
    rows = sum(new)
    q, k, v = (torch.randn(rows, h, dim) for h in (heads, kv_heads, kv_heads))
    chosen = backend(native_lib)
    meta = chosen.build_metadata(build_attention_metadata(tables, computed, new, BLOCK, "cpu"))
    assert meta.paged_decode is not None and meta.paged_prefill is not None
    scale = dim ** -0.5
    got = chosen.layer(LayerAttention(scale, window)).forward(q, k, v, kv8, meta)  # writes k, v
    want = expected(native_lib, kv8, q, tables, computed, new, window, scale)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("window", [None, 300])
def test_prefill_across_softmax_steps_over_the_codes(window, native_lib,  # noqa: F811
                                                     monkeypatch):
    """Contexts longer than one 256-key softmax step (long_contexts), over the codes."""
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", "2")
    computed, new, tables, kv, q, k, v = long_contexts(11)
    kv8 = quantized(native_lib, kv * 3 + 0.5)
    chosen = backend(native_lib)
    meta = chosen.build_metadata(build_attention_metadata(tables, computed, new, BLOCK, "cpu"))
    got = chosen.layer(LayerAttention(0.125, window)).forward(q, k, v, kv8, meta)
    want = expected(native_lib, kv8, q, tables, computed, new, window, 0.125)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("int8", [False, True])
def test_rows_of_the_fused_projection_are_read_in_place(int8, native_lib):  # noqa: F811
    """q, k, v as views of one [T, (H + 2 Hkv) D] projection (rows 960 floats apart, as the
    model hands them over) give bit for bit what their contiguous copies give: K/V written
    (int8: quantized) and every kernel read from the rows where they lie."""
    from test_native_prefill_attention import native_backend

    torch.manual_seed(3)
    heads, kv_heads, dim = 9, 3, 64
    computed, new = [0, 40, 33, 290], [17, 16, 1, 1]
    tables = shuffled_tables(random.Random(3), computed, new, pool_blocks=40)
    chosen = backend(native_lib) if int8 else native_backend(native_lib)
    meta = chosen.build_metadata(build_attention_metadata(tables, computed, new, BLOCK, "cpu"))
    qkv = torch.randn(sum(new), (heads + 2 * kv_heads) * dim)
    q, k, v = (t.view(sum(new), -1, dim) for t in qkv.split([heads * dim, kv_heads * dim,
                                                               kv_heads * dim], dim=1))
    assert not q.is_contiguous() and not k.is_contiguous()
    base = torch.randn(2, 40 * BLOCK, kv_heads, dim)
    results = []
    for views in ((q, k, v), (q.contiguous(), k.contiguous(), v.contiguous())):
        kv = quantized(native_lib, base) if int8 else base.clone()
        out = chosen.layer(LayerAttention(dim ** -0.5)).forward(*views, kv, meta)
        results.append((out, kv))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("threads", ["1", "2"])
def test_shared_prefix_decode_equals_float64_over_the_codes(threads, native_lib,  # noqa: F811
                                                            monkeypatch):
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    torch.manual_seed(5)
    heads, kv_heads, dim = 9, 3, 64
    shared_a, shared_b = list(range(5)), list(range(5, 11))
    tables, computed, new, nxt = [], [], [], 11
    for i in range(20):
        prefix = shared_a if i < 17 else shared_b
        own = 1 + i % 3
        tables.append(prefix + list(range(nxt, nxt + own)))
        nxt += own
        computed.append(len(prefix) * BLOCK + own * BLOCK - 1 - i % 5)
        new.append(1)
    tables += [[nxt, nxt + 1], [nxt + 2, nxt + 3, nxt + 4]]
    computed += [20, 10]
    new += [1, 30]
    kv8 = quantized(native_lib, torch.randn(2, (nxt + 5) * BLOCK, kv_heads, dim))
    q, k, v = (torch.randn(sum(new), h, dim) for h in (heads, kv_heads, kv_heads))
    chosen = backend(native_lib)
    meta = chosen.build_metadata(build_attention_metadata(tables, computed, new, BLOCK, "cpu"))
    assert meta.shared_decode is not None and meta.shared_decode.groups.shape[0] == 2
    got = chosen.layer(LayerAttention(dim ** -0.5)).forward(q, k, v, kv8, meta)
    want = expected(native_lib, kv8, q, tables, computed, new, None, dim ** -0.5)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


def test_int8_against_float_attention(native_lib):  # noqa: F811
    """The same step over a float32 cache and its int8 codes: close, not equal."""
    torch.manual_seed(1)
    tables, computed, new = [[3, 1, 4, 0], [2, 5]], [50, 0], [1, 30]
    kv = torch.randn(2, 6 * BLOCK, 3, 64)
    q, k, v = (torch.randn(31, h, 64) for h in (9, 3, 3))
    kv8 = quantized(native_lib, kv)
    chosen = backend(native_lib)
    meta = chosen.build_metadata(build_attention_metadata(tables, computed, new, BLOCK, "cpu"))
    got = chosen.layer(LayerAttention(0.125)).forward(q, k, v, kv8, meta)
    kv[0, meta.common.slot_mapping], kv[1, meta.common.slot_mapping] = k, v
    want = reference(q, kv, tables, computed, new, None, 0.125)
    err = (got.double() - want).abs().max().item()
    assert 0 < err < 0.05


def test_pool_rows_carry_their_parameters() -> None:
    class Spec:
        num_layers, num_kv_heads, head_dim = 2, 3, 64

    from kvcli.model.attention import kv_cache_bytes_per_block

    pool = allocate_kv_cache(Spec(), 4, BLOCK, INT8_STORAGE, "cpu")
    assert pool.shape == (2, 2, 4 * BLOCK, 3, 72) and pool.dtype == torch.uint8
    assert kv_cache_bytes_per_block(Spec(), BLOCK, INT8_STORAGE) * 4 == pool.numel()
    assert kv_cache_bytes_per_block(Spec(), BLOCK, torch.float32) == 2 * 2 * BLOCK * 3 * 64 * 4


@pytest.mark.parametrize("window", [None, 300])
def test_amx_tiles_and_vector_kernel_agree_over_the_codes(window, monkeypatch):
    """Where the many-row kernel runs on AMX tiles (native/prefill_amx.h), the vector kernel
    it stands in for gives the same attention: both within the float64 tolerance of the codes'
    attention, on prefill chunks across softmax steps and on decode tokens sharing a prefix
    (the scores are the same integers; the values' side rounds p * scale to two bfloat16s)."""
    monkeypatch.setenv("KVCLI_NATIVE_ISA", "native")
    lib = native.load()
    probe = torch.zeros(2, 1, 1, 72, dtype=INT8_STORAGE)
    if lib is None or not native.attention_amx(lib, probe):
        pytest.skip("no AMX-INT8 and AMX-BF16 here (or the OS did not grant the tiles)")
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", "2")
    computed, new, tables, kv, q, k, v = long_contexts(11)
    shared = list(range(LONG_POOL, LONG_POOL + 6))  # 18 decode tokens sharing 6 blocks
    for i in range(18):
        tables.append(shared + [LONG_POOL + 6 + i])
        computed.append(len(shared) * BLOCK + i % BLOCK)
        new.append(1)
    more = torch.randn(2, 24 * BLOCK, *kv.shape[2:])
    kv8 = quantized(lib, torch.cat([kv, more], dim=1) * 3 + 0.5)
    q, k, v = (torch.cat([t, torch.randn(18, *t.shape[1:])]) for t in (q, k, v))
    chosen = backend(lib)
    meta = chosen.build_metadata(build_attention_metadata(tables, computed, new, BLOCK, "cpu"))
    assert meta.shared_decode is not None
    outs = []
    try:
        for tiles in (1, 0):
            assert native.attention_amx(lib, probe, tiles) == bool(tiles)
            layer = chosen.layer(LayerAttention(0.125, window))
            outs.append(layer.forward(q, k, v, kv8, meta))  # writes the same k, v each time
    finally:
        native.attention_amx(lib, probe, 1)
    want = expected(lib, kv8, q, tables, computed, new, window, 0.125)
    for got in outs:
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)
    assert not torch.equal(outs[0], outs[1])  # two kernels ran
    assert native.attention_amx(lib, probe)

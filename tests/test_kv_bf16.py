"""A bfloat16 KV cache under a float32 model (--kv-cache-dtype bfloat16): the native decode,
prefill and shared-prefix decode kernels (native/paged_attention_bf16.c, prefill_attention_bf16.c)
against float64 attention over the same bfloat16 cache, in each build (AVX-512, AVX2); in the
engine, identical outputs with caching on or off and chunked, close to float32's."""

from __future__ import annotations

import pytest
import torch
from native_variants import native_lib  # noqa: F401 - fixture: each build (AVX-512, AVX2)
from test_kv_int8_engine import first_tokens_agree, run
from test_native_prefill_attention import BLOCK, reference

from kvcli.model.attention import LayerAttention, build_attention_metadata
from kvcli.model.attention.native_bf16 import NativeBF16Backend
from kvcli.model.platform import Platform


def backend(lib) -> NativeBF16Backend:
    return NativeBF16Backend(Platform(torch.device("cpu"), torch.bfloat16, lib, ""))


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "window"),
                         [(9, 3, 64, None), (4, 1, 128, 21), (4, 4, 32, None), (2, 1, 24, None)])
def test_kernels_equal_float64_over_the_bfloat16_cache(heads, kv_heads, dim, window,
                                                       native_lib):  # noqa: F811
    torch.manual_seed(dim)
    shared = list(range(5))
    tables = [shared + [5 + i] for i in range(3)] + [[8, 9, 10], [11, 12], [13, 14, 15, 16, 17]]
    computed = [5 * BLOCK + 3, 5 * BLOCK + 9, 5 * BLOCK + 1, 0, 20, 40]
    new = [1, 1, 1, 33, 1, 30]  # shared-prefix decode, a prefill, a lone decode, a chunk
    kv = torch.randn(2, 18 * BLOCK, kv_heads, dim).to(torch.bfloat16)
    q, k, v = (torch.randn(sum(new), h, dim) for h in (heads, kv_heads, kv_heads))
    chosen = backend(native_lib)
    meta = chosen.build_metadata(build_attention_metadata(tables, computed, new, BLOCK, "cpu"))
    assert meta.paged_prefill is not None and meta.paged_decode is not None
    assert meta.shared_decode is not None
    got = chosen.layer(LayerAttention(dim ** -0.5, window)).forward(q, k, v, kv, meta)
    assert kv[0, meta.common.slot_mapping].equal(k.to(torch.bfloat16))  # written, rounded
    want = reference(q, kv.float(), tables, computed, new, window, dim ** -0.5)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


def test_engine_bfloat16_cache(tiny_models):
    model = tiny_models["llama-gqa"]
    base, _ = run(model, kv_cache_dtype="bfloat16")
    assert run(model, kv_cache_dtype="bfloat16", enable_prefix_caching=False)[0] == base
    assert run(model, kv_cache_dtype="bfloat16", max_num_batched_tokens=7)[0] == base
    exact, _ = run(model)
    assert first_tokens_agree(base, exact) >= 4
    from kvcli import LLM

    llm = LLM(str(model), kv_cache_dtype="bfloat16", kv_cache_memory=1 << 20, block_size=BLOCK)
    f32 = LLM(str(model), kv_cache_memory=1 << 20, block_size=BLOCK)
    assert llm.engine.num_blocks == 2 * f32.engine.num_blocks
    assert "bfloat16" in llm.engine.model.attention_backend.decode

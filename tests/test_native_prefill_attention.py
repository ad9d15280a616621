"""The native paged prefill attention (native/prefill_attention.c) against float64.

Sequences of a step are laid out over shuffled blocks of the paged cache, with cached context
before their new queries (chunked prefill, prefix hits), query counts across the kernel's
16-position tiles and keys across its 32-key panels and 256-key softmax steps, grouped KV
heads (1, 3, 4 queries per KV head), head sizes with and without a compiled-in variant,
sliding windows, decode tokens in the same step (the decode kernel takes those), and 1 or more
threads.
"""

from __future__ import annotations

import random

import pytest
import torch
from native_variants import native_lib  # noqa: F401 - fixture: each build (AVX-512, AVX2)

from kvcli.model.attention import LayerAttention, build_attention_metadata
from kvcli.model.attention.native_cpu import NativeCPUBackend
from kvcli.model.platform import Platform

BLOCK = 16


def shuffled_tables(rng: random.Random, computed: list[int], new: list[int],
                    pool_blocks: int = 64) -> list[list[int]]:
    """Each sequence's block table over a shuffled pool: blocks out of order, as after reuse."""
    blocks = list(range(pool_blocks))
    rng.shuffle(blocks)
    tables, at = [], 0
    for c, n in zip(computed, new, strict=True):
        count = -(-(c + n) // BLOCK)
        tables.append(blocks[at:at + count])
        at += count
    return tables


def native_backend(lib) -> NativeCPUBackend:
    return NativeCPUBackend(Platform(torch.device("cpu"), torch.float32, lib, ""))


def reference(q, kv, tables, computed, new, window, scale):
    """float64 causal attention of each sequence's new queries over its whole context."""
    heads, kv_heads = q.shape[1], kv.shape[2]
    out, row = torch.empty(q.shape, dtype=torch.float64), 0
    for table, c, n in zip(tables, computed, new, strict=True):
        length = c + n
        slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(length)])
        keys, values = kv[0, slots].double(), kv[1, slots].double()  # [L, Hkv, D]
        group = heads // kv_heads
        for i in range(n):
            pos = c + i
            visible = torch.arange(length) <= pos
            if window is not None:
                visible &= torch.arange(length) > pos - window
            for h in range(heads):
                s = keys[:, h // group] @ q[row + i, h].double() * scale
                s[~visible] = float("-inf")
                out[row + i, h] = torch.softmax(s, 0) @ values[:, h // group]
        row += n
    return out


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 1, 128), (4, 4, 32)])
@pytest.mark.parametrize("window", [None, 21])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_prefill_equals_float64(heads, kv_heads, dim, window, threads, native_lib,  # noqa: F811
                                monkeypatch):
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    rng = random.Random(heads * dim + (window or 0))
    torch.manual_seed(dim)
    computed = [0, 0, 40, 7, 33, 0, 12]
    new = [1, 17, 16, 33, 1, 70, 5]  # a one-token prompt; a decode token after 33 cached
    tables = shuffled_tables(rng, computed, new)
    kv = torch.randn(2, 64 * BLOCK, kv_heads, dim)
    rows = sum(new)
    q, k, v = (torch.randn(rows, h, dim) for h in (heads, kv_heads, kv_heads))
    backend = native_backend(native_lib)
    meta = backend.build_metadata(build_attention_metadata(tables, computed, new, BLOCK, "cpu"))
    assert meta.paged_prefill is not None and 4 not in meta.paged_prefill.seq_ids
    scale = dim ** -0.5
    got = backend.layer(LayerAttention(scale, window)).forward(q, k, v, kv, meta)  # writes k, v
    want = reference(q, kv, tables, computed, new, window, scale)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


LONG_POOL = 110  # blocks of the long-context step below


def long_contexts(seed: int) -> tuple:
    """A step whose contexts are longer than one 256-key softmax step: a chunk after 300 cached
    tokens, a 540-token prompt, a decode token at 700 (9 heads over 3 KV heads of 64): its
    computed and new counts, shuffled tables, a float cache [2, slots, 3, 64], and q, k, v."""
    torch.manual_seed(seed)
    computed, new = [300, 0, 700], [40, 540, 1]
    tables = shuffled_tables(random.Random(seed), computed, new, pool_blocks=LONG_POOL)
    kv = torch.randn(2, LONG_POOL * BLOCK, 3, 64)
    q, k, v = (torch.randn(sum(new), h, 64) for h in (9, 3, 3))
    return computed, new, tables, kv, q, k, v


@pytest.mark.parametrize("window", [None, 300])
def test_prefill_across_softmax_steps_equals_float64(window, native_lib,  # noqa: F811
                                                     monkeypatch):
    """Contexts longer than one softmax step (long_contexts); a window that starts inside a
    step."""
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", "2")
    computed, new, tables, kv, q, k, v = long_contexts(7)
    backend = native_backend(native_lib)
    meta = backend.build_metadata(build_attention_metadata(tables, computed, new, BLOCK, "cpu"))
    got = backend.layer(LayerAttention(0.125, window)).forward(q, k, v, kv, meta)
    want = reference(q, kv, tables, computed, new, window, 0.125)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_shared_prefix_decode_equals_float64(threads, native_lib, monkeypatch):  # noqa: F811
    """Decode tokens of sequences sharing cached blocks read them once per group (two groups
    of different prefix lengths, more members than one tile); the others take the decode
    kernel; a prefill chunk in the same step."""
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    torch.manual_seed(5)
    heads, kv_heads, dim = 9, 3, 64
    shared_a, shared_b = list(range(5)), list(range(5, 11))  # 5 and 6 blocks
    tables, computed, new, nxt = [], [], [], 11
    for i in range(20):  # 17 share a, 3 share b
        prefix = shared_a if i < 17 else shared_b
        own = 1 + i % 3
        tables.append(prefix + list(range(nxt, nxt + own)))
        nxt += own
        computed.append(len(prefix) * BLOCK + own * BLOCK - 1 - i % 5)
        new.append(1)
    tables += [[nxt, nxt + 1], [nxt + 2, nxt + 3, nxt + 4]]  # a lone decode token; a prefill
    computed += [20, 10]
    new += [1, 30]
    kv = torch.randn(2, (nxt + 5) * BLOCK, kv_heads, dim)
    rows = sum(new)
    q, k, v = (torch.randn(rows, h, dim) for h in (heads, kv_heads, kv_heads))
    backend = native_backend(native_lib)
    meta = backend.build_metadata(build_attention_metadata(tables, computed, new, BLOCK, "cpu"))
    shared = meta.shared_decode
    assert shared is not None and shared.groups.tolist() == [[0, 17, 80], [17, 3, 96]]
    assert shared.rest is not None and shared.rest.seqs == [20]
    scale = dim ** -0.5
    got = backend.layer(LayerAttention(scale)).forward(q, k, v, kv, meta)
    want = reference(q, kv, tables, computed, new, None, scale)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


def test_shared_prefix_longer_than_a_softmax_step(native_lib, monkeypatch):  # noqa: F811
    """17 decode tokens share a 320-token prefix (two softmax steps), then their own tails."""
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", "2")
    torch.manual_seed(9)
    heads, kv_heads, dim = 9, 3, 64
    prefix, nxt = list(range(20)), 20
    tables, computed, new = [], [], []
    for i in range(17):
        own = 1 + i % 2
        tables.append(prefix + list(range(nxt, nxt + own)))
        nxt += own
        computed.append(len(prefix) * BLOCK + own * BLOCK - 1 - i % 7)
        new.append(1)
    kv = torch.randn(2, nxt * BLOCK, kv_heads, dim)
    q, k, v = (torch.randn(sum(new), h, dim) for h in (heads, kv_heads, kv_heads))
    backend = native_backend(native_lib)
    meta = backend.build_metadata(build_attention_metadata(tables, computed, new, BLOCK, "cpu"))
    assert meta.shared_decode is not None
    assert meta.shared_decode.groups.tolist() == [[0, 17, 320]]
    got = backend.layer(LayerAttention(0.125)).forward(q, k, v, kv, meta)
    want = reference(q, kv, tables, computed, new, None, 0.125)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)

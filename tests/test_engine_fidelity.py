"""The engine's greedy output equals transformers' generate() token for token.

For every model family, with prefix caching on and off, with a tiny token budget
(chunked prefill), with a tiny KV pool (preemption), and with prompts sharing long
prefixes (a prompt that is a full prefix of another, one a multiple of the block size).
"""

from __future__ import annotations

import random

import pytest
from fidelity import HFReference, compare
from native_variants import VARIANTS
from tiny_models import BASE_FAMILIES

from kvcli.engine.llm import LLM
from kvcli.sampling_params import SamplingParams

MAX_NEW = 12
BLOCK = 4  # small blocks so short prompts span many blocks and hits are exercised


def make_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)

    def rand(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    shared = rand(24)  # an exact multiple of the block size
    return [
        rand(7),
        shared,  # a full prefix of the next two prompts
        shared + rand(9),
        shared + rand(13),
        shared[:18] + rand(6),  # diverges mid-block
        rand(31),
        rand(1),
        shared + rand(9)[:5],
    ]


CONFIGS = {
    "caching": dict(enable_prefix_caching=True),
    "no-caching": dict(enable_prefix_caching=False),
    "chunked": dict(max_num_batched_tokens=5),
    "preemption": dict(num_blocks=14, max_num_batched_tokens=64),
    "cache-aware": dict(scheduling="cache-aware", max_num_seqs=3),
    "torch-attention": dict(),  # decode attention without the native kernel (batched + cascade)
    "native-avx2": dict(),  # the AVX2 build of the kernels (an AVX2-only CPU's) on AVX-512
}


@pytest.fixture(scope="module", params=BASE_FAMILIES)
def family_setup(request, tiny_models):
    model_dir = tiny_models[request.param]
    ref = HFReference(model_dir, MAX_NEW)
    return model_dir, ref


@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_equals_transformers(family_setup, config, monkeypatch):
    if config == "torch-attention":
        from kvcli.model import native

        monkeypatch.setattr(native, "load", lambda: None)
    if config == "native-avx2":
        if "avx2" not in VARIANTS:
            pytest.skip("the CPU has no AVX-512: its native build is the AVX2 one")
        monkeypatch.setenv("KVCLI_NATIVE_ISA", "avx2")
    model_dir, ref = family_setup
    llm = LLM(str(model_dir), block_size=BLOCK, **CONFIGS[config])
    if config == "native-avx2":
        assert llm.engine.runner.backend.isa == "avx2+fma"
    prompts = make_prompts(llm.engine.vocab_size)
    params = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    outs = llm.generate([list(p) for p in prompts], params)
    ties = sum(compare(ref, p, o.outputs[0].token_ids) for p, o in zip(prompts, outs, strict=True))
    assert ties <= 1, f"{ties} ties in {len(prompts)} prompts"
    stats = llm.engine.stats()
    if config == "caching":
        assert stats["cached_tokens"] > 0
        assert outs[2].num_cached_tokens == 24  # hits the whole shared prefix
    if config == "no-caching":
        assert stats["cached_tokens"] == 0
    if config == "preemption":
        assert stats["preemptions"] > 0


@pytest.mark.parametrize("kernel", ["native", "torch-cascade"])
def test_shared_prefix_cascade_equals_transformers(tiny_models, kernel, monkeypatch):
    """All decoding sequences share a cached prefix: the native kernel reads it in place; the
    torch path attends it once for all of them (cascade)."""
    if kernel == "torch-cascade":
        from kvcli.model import native

        monkeypatch.setattr(native, "load", lambda: None)
    model_dir = tiny_models["llama-gqa"]
    ref = HFReference(model_dir, MAX_NEW)
    llm = LLM(str(model_dir), block_size=BLOCK)
    rng = random.Random(7)
    shared = [rng.randrange(3, llm.engine.vocab_size) for _ in range(26)]
    prompts = [shared + [rng.randrange(3, llm.engine.vocab_size) for _ in range(n)]
               for n in (1, 3, 4, 9, 17)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
    ties = sum(compare(ref, p, o.outputs[0].token_ids) for p, o in zip(prompts, outs, strict=True))
    assert ties <= 1
    assert [o.num_cached_tokens for o in outs] == [0, 24, 24, 24, 24]


def test_reset_prefix_cache_keeps_the_pool_and_starts_cold(tiny_models):
    """The bench reuses one pool across runs: after a reset nothing hits, outputs are the same
    (stale K/V in reused slots is never read), and per-run stats start from zero."""
    llm = LLM(str(tiny_models["llama-gqa"]), block_size=BLOCK)
    engine = llm.engine
    prompts = make_prompts(engine.vocab_size)
    params = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    first = [o.outputs[0].token_ids for o in llm.generate([list(p) for p in prompts], params)]
    pool = engine.runner.kv_cache
    warm = llm.generate([list(p) for p in prompts], params)
    assert all(o.num_cached_tokens > 0 for o in warm if len(o.prompt_token_ids) > BLOCK)
    engine.reset_prefix_cache()
    assert engine.stats()["steps"] == 0
    again = llm.generate([list(p) for p in prompts[::-1]], params)
    assert engine.runner.kv_cache is pool
    assert [o.outputs[0].token_ids for o in again] == first[::-1]
    assert engine.stats()["cached_tokens"] == sum(  # only hits between this run's own prompts
        o.num_cached_tokens for o in again) and again[-1].num_cached_tokens == 0
    engine.add_request("busy", [5, 6, 7], params)
    with pytest.raises(RuntimeError, match="still running"):
        engine.reset_prefix_cache()


@pytest.mark.parametrize("kernel", ["native", "torch-cascade"])
@pytest.mark.parametrize("family", ["llama-gqa", "qwen3"])
def test_prefill_cascade_equals_transformers(tiny_models, family, kernel, monkeypatch):
    """Prefill chunks of requests admitted after a shared prefix was cached: the torch route
    attends the prefix once for all (prefill_cascade), the native kernel reads it in place for
    each (paged prefill); outputs still equal transformers'."""
    from kvcli.model import native
    from kvcli.model.attention import torch_sdpa

    calls = []
    if kernel == "torch-cascade":
        monkeypatch.setattr(native, "load", lambda: None)
        real = torch_sdpa.prefill_cascade
        monkeypatch.setattr(torch_sdpa, "prefill_cascade",
                            lambda *a: calls.append(len(a[2].seqs)) or real(*a))
    else:
        if native.load() is None:
            pytest.skip("no C compiler: the torch path is used")
        real = native.paged_prefill_attention
        monkeypatch.setattr(native, "paged_prefill_attention",
                            lambda *a: calls.append(a[4].shape[0]) or real(*a))
    model_dir = tiny_models[family]
    ref = HFReference(model_dir, MAX_NEW)
    llm = LLM(str(model_dir), block_size=BLOCK)
    rng = random.Random(11)
    shared = [rng.randrange(3, llm.engine.vocab_size) for _ in range(30)]
    params = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    llm.generate([shared + [5]], SamplingParams(max_tokens=1, ignore_eos=True))  # cache it
    prompts = [shared + [rng.randrange(3, llm.engine.vocab_size) for _ in range(n)]
               for n in (2, 3, 7, 12, 20)]
    outs = llm.generate(prompts, params)
    ties = sum(compare(ref, p, o.outputs[0].token_ids) for p, o in zip(prompts, outs, strict=True))
    assert ties <= 1
    assert calls and max(calls) == len(prompts)  # one group: all five chunks
    assert [o.num_cached_tokens for o in outs] == [28] * 5

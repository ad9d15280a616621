"""``kv_cache_dtype="int8"`` in the engine: outputs close to float32's (agreement measured, not
equality), identical with prefix caching on or off and with chunked prefill within int8, a pool
of ~3.6x the blocks for the same memory, disk-cache blocks never shared with a float32 run, and
clear refusals where no kernel reads the cache."""

from __future__ import annotations

import pytest

from kvcli import LLM, SamplingParams

BLOCK = 4
SYSTEM = ("Caching the keys and values of a shared prompt prefix saves a great deal of work "
          "when many requests begin with the same system prompt. ")
PROMPTS = [SYSTEM + q for q in ("The fox went", "What is the weather", "Numbers like 12 appear",
                                "Once upon a")]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def run(model_dir, **engine) -> tuple[list[list[int]], dict]:
    llm = LLM(str(model_dir), block_size=BLOCK, **engine)
    outs = llm.generate(PROMPTS, GREEDY)
    stats = llm.engine.stats()
    llm.engine.close()
    return [o.outputs[0].token_ids for o in outs], stats


def first_tokens_agree(a: list[list[int]], b: list[list[int]]) -> int:
    """Leading tokens two runs share, summed over requests (greedy diverges for good after)."""
    total = 0
    for x, y in zip(a, b, strict=True):
        while x and y and x[0] == y[0]:
            x, y, total = x[1:], y[1:], total + 1
    return total


@pytest.mark.parametrize("family", ["llama", "llama-gqa", "mistral"])
def test_int8_is_identical_with_caching_and_chunking_and_close_to_float32(tiny_models, family):
    model = tiny_models[family]
    base, _ = run(model, kv_cache_dtype="int8")
    no_cache, _ = run(model, kv_cache_dtype="int8", enable_prefix_caching=False)
    chunked, stats = run(model, kv_cache_dtype="int8", max_num_batched_tokens=7)
    assert base == no_cache == chunked
    assert stats["cached_tokens"] > 0  # the shared prompt was served from cached int8 blocks
    exact, _ = run(model)
    assert first_tokens_agree(base, exact) >= len(PROMPTS)  # every first token at least


def test_stories_greedy_mostly_agrees(stories_dir):
    """A trained model: int8 KV greedy keeps float32's tokens for most of each reply."""
    int8, _ = run(stories_dir, kv_cache_dtype="int8")
    exact, _ = run(stories_dir, kv_cache_dtype="float32")
    assert first_tokens_agree(int8, exact) >= 0.5 * sum(map(len, exact))


def test_the_same_memory_holds_more_blocks(tiny_models):
    model = tiny_models["llama"]  # head_dim 16: a row is 16 codes + 8 bytes, not 64 bytes
    f32 = LLM(str(model), block_size=BLOCK, kv_cache_memory=1 << 20)
    i8 = LLM(str(model), block_size=BLOCK, kv_cache_memory=1 << 20, kv_cache_dtype="int8")
    assert i8.engine.num_blocks == pytest.approx(f32.engine.num_blocks * 64 / 24, rel=0.01)
    assert i8.engine.runner.kv_cache.nbytes <= 1 << 20
    assert "int8" in i8.engine.model.attention_backend.decode


def test_disk_cache_never_serves_another_kv_dtype(tiny_models, kvcli_home, tmp_path):
    model, cache = tiny_models["llama"], str(tmp_path / "kv")
    f32_base, _ = run(model)
    i8_base, _ = run(model, kv_cache_dtype="int8")
    _, f32_cold = run(model, kv_cache_dir=cache)
    assert f32_cold["disk_cache"]["written_blocks"] > 0
    i8_cold, stats = run(model, kv_cache_dir=cache, kv_cache_dtype="int8")
    assert stats["disk_cache"]["hit_tokens"] == 0 and i8_cold == i8_base  # float32 blocks unseen
    i8_warm, stats = run(model, kv_cache_dir=cache, kv_cache_dtype="int8")
    assert stats["disk_cache"]["hit_tokens"] > 0 and i8_warm == i8_base  # its own codes + scales
    f32_warm, stats = run(model, kv_cache_dir=cache, kv_cache_dtype="float32")
    assert stats["disk_cache"]["hit_tokens"] > 0 and f32_warm == f32_base  # "auto" = float32's


def test_refusals(tiny_models, monkeypatch):
    model = str(tiny_models["llama"])
    with pytest.raises(ValueError, match="float16 cache under a float32 model"):
        LLM(model, kv_cache_dtype="float16")
    with pytest.raises(ValueError, match="kv_cache_dtype: expected"):
        LLM(model, kv_cache_dtype="fp8")
    monkeypatch.setenv("KVCLI_NATIVE", "0")
    from kvcli.model import native

    native.load_variant.cache_clear()
    try:
        with pytest.raises(ValueError, match="int8: needs the native CPU kernels"):
            LLM(model, kv_cache_dtype="int8")
    finally:
        native.load_variant.cache_clear()


def test_generate_flag_reaches_the_engine(tiny_models, tmp_path):
    import json

    from click.testing import CliRunner

    from kvcli.cli import main

    stats = tmp_path / "stats.json"
    res = CliRunner().invoke(main, ["generate", "-", "--model", str(tiny_models["llama"]),
                                    "--kv-cache-dtype", "int8", "--max-tokens", "4",
                                    "--stats", str(stats)],
                             input='{"prompt": "The fox went"}\n', catch_exceptions=False)
    assert res.exit_code == 0, res.output
    backend = json.loads(stats.read_text())["backend"]
    assert backend["kv_cache_dtype"] == "int8" and "int8" in backend["decode_attention"]
    refused = CliRunner().invoke(main, ["generate", "-", "--model", str(tiny_models["llama"]),
                                        "--kv-cache-dtype", "float16"],
                                 input='{"prompt": "The fox went"}\n')
    assert refused.exit_code == 2 and "float16 cache under a float32 model" in refused.output


def test_batch1_numpy_decode_reads_the_int8_cache_as_the_batched_path(tiny_models):
    """One sequence decoding takes the fused NumPy path, whose attention is the int8 kernel:
    the same tokens and close logprobs as the batched route over the same codes."""
    llm = LLM(str(tiny_models["llama"]), block_size=BLOCK, kv_cache_dtype="int8")
    model = llm.engine.model
    assert model._numpy_decoder is not None and model._numpy_decoder.int8_lib is not None
    params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=0)
    fused = llm.generate([PROMPTS[0]], params)[0].outputs[0]
    model._numpy_decoder = None
    llm.engine.reset_prefix_cache()
    batched = llm.generate([PROMPTS[0]], params)[0].outputs[0]
    assert fused.token_ids == batched.token_ids
    for a, b, token in zip(fused.logprobs, batched.logprobs, fused.token_ids, strict=True):
        assert abs(a[token] - b[token]) < 1e-3

"""The disk tier in the engine: a second engine (as a second run would) reuses the first's
prefixes from disk with byte-identical outputs, and computes only what no run computed."""

from __future__ import annotations

import pytest
from tiny_models import FAMILIES

from kvcli import LLM, SamplingParams
from kvcli.engine.outputs import RequestOutput

BLOCK = 4
SYSTEM = ("Caching the keys and values of a shared prompt prefix saves a great deal of work "
          "when many requests begin with the same system prompt. ")
QUESTIONS = ["The fox went", "What is the weather", "Numbers like 12 appear", "Once upon a"]
GREEDY = SamplingParams(max_tokens=9, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=7, temperature=0.8, n=2, ignore_eos=True)


def run(model_dir, prompts, params, **engine) -> tuple[list[RequestOutput], dict]:
    llm = LLM(str(model_dir), block_size=BLOCK, **engine)
    outs = llm.generate(prompts, params)
    stats = llm.engine.stats()
    llm.engine.close()
    return outs, stats


def texts(outs: list[RequestOutput]) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outs]


def expected_tail(llm_prompts: list[list[int]], children: int = 1) -> int:
    """Prefill tokens a fully warm run computes: each prompt's last, partly full block."""
    return children * sum(len(p) - (len(p) - 1) // BLOCK * BLOCK for p in llm_prompts)


@pytest.fixture
def prompts() -> list[str]:
    return [SYSTEM + q for q in QUESTIONS]


@pytest.mark.parametrize("family", FAMILIES)
def test_cold_and_warm_runs_equal_a_run_without_the_cache(tiny_models, kvcli_home, tmp_path,
                                                          prompts, family):
    model = tiny_models[family]
    base, _ = run(model, prompts, GREEDY)
    cold, cold_stats = run(model, prompts, GREEDY, kv_cache_dir=str(tmp_path / "kv"))
    warm, warm_stats = run(model, prompts, GREEDY, kv_cache_dir=str(tmp_path / "kv"))
    assert texts(cold) == texts(base) == texts(warm)
    disk = cold_stats["disk_cache"]
    assert disk["hit_tokens"] == 0 and disk["written_blocks"] > 0 and disk["bytes_written"] > 0
    # Cold: the first request computes the shared system prompt, the others hit memory.
    assert [o.num_disk_cached_tokens for o in cold] == [0] * 4
    assert all(o.num_cached_tokens > 0 for o in cold[1:])
    # Warm: the first request loads the system prompt and its own question from disk.
    assert warm[0].num_disk_cached_tokens == warm[0].num_cached_tokens > 0
    assert all(o.num_cached_tokens == (len(o.prompt_token_ids) - 1) // BLOCK * BLOCK
               for o in warm)
    ids = [o.prompt_token_ids for o in warm]
    assert warm_stats["prefill_tokens_computed"] == expected_tail(ids)
    assert warm_stats["disk_cache"]["hit_blocks"] * BLOCK == warm_stats["disk_cache"]["hit_tokens"]
    assert warm_stats["disk_cache"]["written_blocks"] <= 4 * 3  # only the new decode blocks
    assert all(b.num_disk_cached_tokens is None for b in base)


@pytest.mark.parametrize("engine", [
    {"max_num_batched_tokens": 7},  # chunked prefill, loads between chunks of other requests
    {"num_blocks": 24, "max_num_seqs": 4},  # a pool small enough to preempt
    {"max_num_seqs": 1},
], ids=["chunked", "preempting", "one-at-a-time"])
def test_outputs_stay_identical_whatever_the_schedule(tiny_models, kvcli_home, tmp_path, prompts,
                                                      engine):
    model = tiny_models["llama"]
    params = [GREEDY, SAMPLED] * 2
    base, _ = run(model, prompts, params, **engine)
    for _ in ("cold", "warm"):
        outs, stats = run(model, prompts, params, kv_cache_dir=str(tmp_path / "kv"), **engine)
        assert texts(outs) == texts(base)
    assert stats["disk_cache"]["hit_tokens"] > 0
    if "num_blocks" in engine:
        assert stats["preemptions"] > 0


def test_a_new_suffix_computes_only_the_new_part(tiny_models, kvcli_home, tmp_path):
    model = tiny_models["llama"]
    kv = str(tmp_path / "kv")
    first, _ = run(model, [SYSTEM + "The fox went"], GREEDY, kv_cache_dir=kv)
    outs, stats = run(model, [SYSTEM + "What is the weather like today"], GREEDY, kv_cache_dir=kv)
    shared = next(i for i, (a, b) in enumerate(zip(first[0].prompt_token_ids,
                                                   outs[0].prompt_token_ids, strict=False))
                  if a != b) // BLOCK * BLOCK
    assert outs[0].num_disk_cached_tokens == outs[0].num_cached_tokens == shared > 0
    assert stats["prefill_tokens_computed"] == len(outs[0].prompt_token_ids) - shared


def test_other_settings_never_hit(tiny_models, kvcli_home, tmp_path, prompts):
    kv = str(tmp_path / "kv")
    run(tiny_models["llama"], prompts, GREEDY, kv_cache_dir=kv)
    _, other_model = run(tiny_models["mistral"], prompts, GREEDY, kv_cache_dir=kv)
    _, salted = run(tiny_models["llama"], [{"prompt": p, "cache_salt": "t1"} for p in prompts],
                    GREEDY, kv_cache_dir=kv)
    quantized, int8 = run(tiny_models["llama"], prompts, GREEDY, kv_cache_dir=kv,
                          quantization="int8")
    assert other_model["disk_cache"]["hit_tokens"] == salted["disk_cache"]["hit_tokens"] == 0
    assert int8["disk_cache"]["hit_tokens"] == 0
    assert texts(quantized) == texts(run(tiny_models["llama"], prompts, GREEDY,
                                         quantization="int8")[0])


def test_the_disk_cache_needs_prefix_caching(tiny_models, kvcli_home, tmp_path):
    with pytest.raises(ValueError, match="needs prefix caching"):
        LLM(str(tiny_models["llama"]), kv_cache_dir=str(tmp_path), enable_prefix_caching=False)


def test_the_loaded_kv_is_what_attention_reads(tiny_models, kvcli_home, tmp_path, prompts):
    """Not a recomputation in disguise: blocks rewritten with other (checksummed) K/V change
    the outputs, so the run really attends what it loaded."""
    from kvcli.kvstore.directory import iter_block_files
    from kvcli.kvstore.format import HEADER_SIZE, BlockKey, encode_header

    kv = tmp_path / "kv"
    base, _ = run(tiny_models["llama"], prompts, GREEDY, kv_cache_dir=str(kv))
    for f in iter_block_files(kv):
        data = f.path.read_bytes()
        payload = bytes(len(data) - HEADER_SIZE)  # zeros
        key = BlockKey(bytes.fromhex(f.fingerprint), bytes.fromhex(f.path.name))
        f.path.write_bytes(encode_header(key, payload) + payload)
    poisoned, stats = run(tiny_models["llama"], prompts, GREEDY, kv_cache_dir=str(kv))
    assert stats["disk_cache"]["hit_tokens"] > 0 and stats["disk_cache"]["corrupt_blocks"] == 0
    assert texts(poisoned) != texts(base)


def test_generated_blocks_are_kept_too(tiny_models, kvcli_home, tmp_path):
    """A conversation continued in a later run hits the blocks its previous answer filled."""
    model, kv = tiny_models["llama"], str(tmp_path / "kv")
    params = SamplingParams(max_tokens=13, ignore_eos=True)
    [first], _ = run(model, [SYSTEM + "The fox went"], params, kv_cache_dir=kv)
    turn = first.prompt_token_ids + first.outputs[0].token_ids + [5, 6, 7]
    [second], _ = run(model, [turn], GREEDY, kv_cache_dir=kv)
    answered = len(first.prompt_token_ids) + len(first.outputs[0].token_ids) - 1
    assert second.num_disk_cached_tokens == second.num_cached_tokens
    assert second.num_cached_tokens >= answered // BLOCK * BLOCK > len(first.prompt_token_ids)

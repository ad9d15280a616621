"""The capacity curve (one pass, every size) against the engine's own pool replayed per size;
--cache-size units; the capacity section in text, JSON and HTML."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from test_audit_support import SAMPLES, audit_json, run

from kvcli.audit.bounded import BoundedReplay
from kvcli.audit.capacity import SizeError, bytes_per_token, parse_size
from kvcli.audit.curve import StackModel
from kvcli.audit.prefix_index import PrefixIndex, token_bytes

BS = 4


def _prompts(rng: random.Random, n: int) -> list[list[int]]:
    """Conversations growing append-only over a shared system prefix; some of a whole number of
    blocks (the engine's last-block rule), some sharing only the prefix."""
    system = [rng.randrange(500) for _ in range(rng.randrange(8, 40))]
    conversations: list[list[int]] = []
    out = []
    for _ in range(n):
        if conversations and rng.random() < 0.6:
            ids = rng.choice(conversations)
            ids.extend(rng.randrange(500) for _ in range(rng.randrange(1, 30)))
        else:
            ids = system + [rng.randrange(500) for _ in range(rng.randrange(1, 30))]
            conversations.append(ids)
        out.append(list(ids))
    return out


def _replay_all(prompts: list[list[int]]) -> tuple[StackModel, list[list[bytes]]]:
    index, model, chains = PrefixIndex(BS), StackModel(BS), []
    for i, ids in enumerate(prompts):
        raw = token_bytes(ids)
        match = index.match(ids, raw, None)
        model.observe(index.insert(i, raw, None, match), match.blocks, len(ids), 0)
        chains.append(match.hashes)
    return model, chains


@pytest.mark.parametrize("seed", range(12))
def test_curve_equals_the_engine_pool_at_every_size(seed: int) -> None:
    prompts = _prompts(random.Random(seed), 80)
    model, chains = _replay_all(prompts)
    sizes = [s for s in model.sizes if s.blocks >= model.largest_prompt]
    assert any(s.evicted for s in sizes) and not sizes[-1].evicted
    for size in sizes:
        replay = BoundedReplay(size.blocks, BS)
        for ids, hashes in zip(prompts, chains, strict=True):
            replay.step(hashes, len(ids))
        assert replay.cached_tokens == size.cached_tokens, size.blocks
    hits = [s.cached_tokens for s in sizes]
    assert hits == sorted(hits) and hits[0] < hits[-1]  # more room never hurts LRU here


def test_running_prompts_pin_their_blocks() -> None:
    prompts = _prompts(random.Random(3), 80)
    _, chains = _replay_all(prompts)
    size = max(-(-len(p) // BS) for p in prompts) * 3
    rates = []
    for concurrency in (1, 4):
        replay = BoundedReplay(size, BS, concurrency)
        for ids, hashes in zip(prompts, chains, strict=True):
            replay.step(hashes, len(ids))
        rates.append(replay.cached_tokens)
    assert rates[1] < rates[0]


def test_sizes_in_tokens_blocks_and_bytes() -> None:
    assert parse_size("8192", 16, None) == 512
    assert parse_size("8200 tokens", 16, None) == 512  # whole blocks only
    assert parse_size("300blocks", 16, None) == 300
    assert parse_size("1GiB", 16, 46080) == (1 << 30) // (46080 * 16)
    assert parse_size("1.5MB", 16, 1000) == 93
    with pytest.raises(SizeError, match="needs --model"):
        parse_size("1GiB", 16, None)
    with pytest.raises(SizeError, match="unknown unit 'parsecs'"):
        parse_size("3parsecs", 16, None)
    with pytest.raises(SizeError, match="less than one block"):
        parse_size("15", 16, None)


def test_bytes_per_token_follow_the_kv_layout(tiny_models) -> None:
    directory = Path(tiny_models["llama"])
    raw = json.loads((directory / "config.json").read_text())
    kv_heads = raw.get("num_key_value_heads", raw["num_attention_heads"])
    head_dim = raw.get("head_dim", raw["hidden_size"] // raw["num_attention_heads"])
    assert bytes_per_token(directory) == raw["num_hidden_layers"] * 2 * kv_heads * head_dim * 4
    assert bytes_per_token(directory, "bfloat16") * 2 == bytes_per_token(directory)


def test_capacity_in_json_text_and_html(tmp_path: Path) -> None:
    clean = SAMPLES / "clean.jsonl"
    rows = [json.loads(line) for line in clean.read_text().splitlines()]
    doc = audit_json(tmp_path, rows, "--cache-size", "70blocks")
    cap = doc["capacity"]
    assert cap["bounded"]["blocks"] == 70 and cap["bounded"]["concurrency"] == 1
    assert cap["unbounded_hit_rate"] == pytest.approx(doc["summary"]["hit_rate"])
    assert cap["curve"][-1]["cached_tokens"] == doc["summary"]["cached_tokens"]
    assert cap["elbow"]["hit_rate"] >= 0.9 * cap["unbounded_hit_rate"]
    assert all("bounded_cached_tokens" in p for p in doc["prompts"])
    text = run([str(clean), "--cache-size", "1120"]).stdout
    assert "at --cache-size 70 blocks (1,120 tokens), concurrency 1" in text and "elbow:" in text
    html = tmp_path / "a.html"
    assert run([str(clean), "--cache-size", "70blocks", "--html", str(html)]).exit_code == 0
    page = html.read_text()
    assert '<svg class="curve"' in page and "<polyline" in page and "<script" not in page


@pytest.mark.parametrize(("args", "message"), [
    (["--cache-size", "1GiB"], "needs --model"),
    (["--concurrency", "2"], "give --cache-size too"),
    (["--cache-size", "64blocks", "--profile", "anthropic"], "reads at breakpoints"),
])  # fmt: skip
def test_cache_size_usage_errors(args: list[str], message: str) -> None:
    result = run([str(SAMPLES / "clean.jsonl"), *args])
    assert result.exit_code == 2 and message in result.output


def test_engine_pool_constants_are_the_engine_s() -> None:
    from kvcli.audit.capacity import ENGINE_KV_MEMORY, ENGINE_MAX_BLOCKS, engine_pool_blocks
    from kvcli.engine import config

    assert (ENGINE_KV_MEMORY, ENGINE_MAX_BLOCKS) == (config.DEFAULT_KV_CACHE_MEMORY, config.MAX_DEFAULT_BLOCKS)
    assert engine_pool_blocks(46080, 16) == (1 << 30) // (46080 * 16)  # SmolLM2-135M: 1,456 blocks
    assert engine_pool_blocks(64, 16) == ENGINE_MAX_BLOCKS


def test_with_a_model_the_default_pool_is_reported(tmp_path: Path, tiny_models) -> None:
    from kvcli.audit.capacity import engine_pool_blocks

    rows = [json.loads(line) for line in (SAMPLES / "clean.jsonl").read_text().splitlines()]
    doc = audit_json(tmp_path, rows, "--model", str(tiny_models["llama"]))
    pool = doc["capacity"]["engine_pool"]
    assert pool["blocks"] == engine_pool_blocks(doc["capacity"]["kv_bytes_per_token"], 16)
    assert pool["bytes"] == pool["blocks"] * 16 * doc["capacity"]["kv_bytes_per_token"]


def test_the_bounded_replay_never_imports_torch(tmp_path: Path, tiny_models) -> None:
    """--model sizes (config.json) and --concurrency (the engine's KVCacheManager) stay torch-free."""
    from test_audit_tokenizers import _imported_modules

    args = [str(SAMPLES / "clean.jsonl"), "--model", str(tiny_models["llama"]), "--cache-size", "1MiB",
            "--concurrency", "2", "--format", "json", "--fail-on", "never"]
    code = ("import sys; from kvcli.cli import main\n"
            f"sys.argv = ['kvcli', 'audit', *{args!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n")
    modules = _imported_modules(code)
    assert {"kvcli.audit.bounded", "kvcli.engine.kv_cache", "kvcli.checkpoint.config"} <= modules
    assert not {m for m in modules if m.split(".")[0] in ("torch", "transformers")}

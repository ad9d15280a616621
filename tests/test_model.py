"""kvcli's own model implementations against transformers (float32), through the paged KV cache."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

from kvcli.model.attention import allocate_kv_cache, build_attention_metadata
from kvcli.model.loader import load_model

TOL = 1e-4
BLOCK = 4
NUM_BLOCKS = 24
COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,  # small, so all three frequency bands occur
}
FAMILIES: dict[str, PretrainedConfig] = {
    "llama-tied-mha": LlamaConfig(**{**COMMON, "num_key_value_heads": 4}, tie_word_embeddings=True),
    "llama-gqa-llama3": LlamaConfig(
        **COMMON, tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE
    ),
    "llama-linear-legacy": LlamaConfig(
        **COMMON, mlp_bias=True, attention_bias=True
    ),  # see _legacy_rope
    "mistral-window": MistralConfig(**COMMON, sliding_window=8),
    "qwen2-bias-window": Qwen2Config(
        **COMMON,
        use_sliding_window=True,
        sliding_window=6,
        max_window_layers=1,
        tie_word_embeddings=True,
    ),
    "qwen3-qknorm": Qwen3Config(**COMMON, head_dim=32, attention_bias=True),
}


def _randomise(model: torch.nn.Module) -> None:
    """Default init zeroes biases and sets norms to one, which would hide bugs in both."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            base = 1.0 if "norm" in name else 0.0
            param.copy_(base + noise * (0.1 if param.dim() == 1 else 0.08))


def _legacy_rope(model_dir: Path) -> None:
    """Rewrite config.json in the pre-5.x spelling (top-level rope_theta + rope_scaling)."""
    path = model_dir / "config.json"
    raw = json.loads(path.read_text())
    raw.pop("rope_parameters", None)
    raw["rope_theta"] = 5000.0
    raw["rope_scaling"] = {"type": "linear", "factor": 2.0}
    path.write_text(json.dumps(raw))


@dataclass
class Pair:
    ours: torch.nn.Module
    hf: torch.nn.Module
    model_dir: Path


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory) -> Pair:
    torch.manual_seed(0)
    model_dir = tmp_path_factory.mktemp(request.param)
    hf = AutoModelForCausalLM.from_config(FAMILIES[request.param], dtype=torch.float32)
    _randomise(hf)
    hf.save_pretrained(model_dir)
    if request.param == "llama-linear-legacy":
        _legacy_rope(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return Pair(load_model(model_dir), hf, model_dir)


def _hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


@dataclass
class Seq:
    tokens: list[int]
    blocks: list[int]
    computed: int = 0


def _step(model, kv: torch.Tensor, batch: list[tuple[Seq, int]]) -> list[torch.Tensor]:
    """One packed forward over (sequence, number of new tokens) pairs; logits of every new row."""
    meta = build_attention_metadata(
        [s.blocks for s, _ in batch],
        [s.computed for s, _ in batch],
        [n for _, n in batch],
        BLOCK,
        "cpu",
    )
    ids = torch.tensor([t for s, n in batch for t in s.tokens[s.computed : s.computed + n]])
    positions = torch.cat([torch.arange(s.computed, s.computed + n) for s, n in batch])
    logits = model.compute_logits(model(ids, positions, meta, kv))
    for s, n in batch:
        s.computed += n
    return list(logits.split([n for _, n in batch]))


def _nan_cache(model) -> torch.Tensor:
    # Any read of a slot that this sequence has not written (or that is masked out) shows up as NaN.
    return allocate_kv_cache(model, NUM_BLOCKS, BLOCK, torch.float32, "cpu").fill_(float("nan"))


def _shuffled_blocks(seed: int, count: int) -> list[int]:
    return torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(seed))[
        :count
    ].tolist()


def _greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    kv = _nan_cache(model)
    blocks_needed = -(-(len(prompt) + new_tokens) // BLOCK)
    seq = Seq(list(prompt), _shuffled_blocks(7, blocks_needed))
    logits = _step(model, kv, [(seq, len(prompt))])[0]
    out: list[int] = []
    while len(out) < new_tokens:
        out.append(int(logits[-1].argmax()))
        seq.tokens.append(out[-1])
        if len(out) < new_tokens:
            logits = _step(model, kv, [(seq, 1)])[0]
    return out


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_prefill_matches_hf(pair: Pair) -> None:
    ids = _ids(0, 20)
    kv = _nan_cache(pair.ours)
    ours = _step(pair.ours, kv, [(Seq(ids, _shuffled_blocks(0, 5)), len(ids))])[0]
    assert (ours - _hf_logits(pair.hf, ids)).abs().max() < TOL


def test_chunked_prefill_and_decode_match_hf(pair: Pair) -> None:
    ids = _ids(1, 30)
    ref = _hf_logits(pair.hf, ids)
    kv = _nan_cache(pair.ours)
    seq = Seq(ids, _shuffled_blocks(1, 8))
    rows = [_step(pair.ours, kv, [(seq, n)])[0] for n in (5, 7, 6)]
    rows += [_step(pair.ours, kv, [(seq, 1)])[0] for _ in range(len(ids) - 18)]
    assert (torch.cat(rows) - ref).abs().max() < TOL


def test_packed_batch_matches_separate_runs(pair: Pair) -> None:
    """Step 1 packs two prefills; step 2 packs a prefill chunk, a decode token and a new prompt."""
    tokens = (_ids(2, 13), _ids(3, 10), _ids(4, 5))
    tables = _shuffled_blocks(2, 9)
    tables = (tables[:4], tables[4:7], tables[7:9])
    schedule = ((6, 7), (9, 1), (0, 5))  # new tokens of each sequence in step 1 and step 2
    alone = []
    for seq_tokens, table, chunks in zip(tokens, tables, schedule, strict=True):
        seq, kv = Seq(seq_tokens, table), _nan_cache(pair.ours)
        alone.append(torch.cat([_step(pair.ours, kv, [(seq, n)])[0] for n in chunks if n]))
    seqs, kv = [Seq(t, b) for t, b in zip(tokens, tables, strict=True)], _nan_cache(pair.ours)
    first = _step(pair.ours, kv, [(seqs[0], 6), (seqs[1], 9)])
    second = _step(
        pair.ours, kv, [(seq, chunks[1]) for seq, chunks in zip(seqs, schedule, strict=True)]
    )
    packed = [torch.cat([first[0], second[0]]), torch.cat([first[1], second[1]]), second[2]]
    for got, want, seq_tokens in zip(packed, alone, tokens, strict=True):
        assert (got - want).abs().max() < TOL
        assert (got - _hf_logits(pair.hf, seq_tokens)).abs().max() < TOL


def test_greedy_matches_hf_generate(pair: Pair) -> None:
    prompt = _ids(5, 7)
    pair.hf.generation_config.eos_token_id = None  # our loop does not stop at EOS either
    with torch.no_grad():
        hf_out = pair.hf.generate(
            torch.tensor([prompt]), max_new_tokens=20, do_sample=False, pad_token_id=0
        )[0, len(prompt) :].tolist()
    assert _greedy(pair.ours, prompt, 20) == hf_out


def test_model_properties(pair: Pair) -> None:
    cfg = pair.hf.config
    ours = pair.ours
    assert (ours.num_layers, ours.num_kv_heads, ours.vocab_size) == (
        2,
        cfg.num_key_value_heads,
        300,
    )
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert ours.head_dim == head_dim and ours.max_position_embeddings == 128


STORIES = Path(__file__).resolve().parents[2] / "shared/models/stories260K"


@pytest.mark.skipif(not (STORIES / "golden.json").is_file(), reason="stories260K not present")
def test_stories260k_golden_greedy() -> None:
    model = load_model(STORIES)
    for case in json.loads((STORIES / "golden.json").read_text())["cases"]:
        want = case["output_ids"][:64]
        assert _greedy(model, case["prompt_ids"], len(want)) == want, case["prompt"]
        kv = _nan_cache(model)
        prompt = case["prompt_ids"]
        last = _step(
            model, kv, [(Seq(prompt, list(range(len(prompt) // BLOCK + 1))), len(prompt))]
        )[0][-1]
        for token, value in case["last_logits_top5"]:
            assert abs(float(last[token]) - value) < 1e-4

"""Loading rules: config parsing, architecture registry, checkpoint formats, weight-name checks,
attention metadata and KV-cache sizing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mapped_pages import SMAPS, resident_kb
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from kvcli.checkpoint.config import ModelConfigError
from kvcli.model.attention import (
    allocate_kv_cache,
    build_attention_metadata,
    kv_cache_bytes_per_block,
)
from kvcli.model.loader import (
    ModelLoadError,
    checkpoint_tensors,
    load_model,
    read_eos_token_ids,
    read_model_config,
)
from kvcli.model.registry import supported_architectures


def _save_tiny_llama(model_dir: Path, tied: bool = True, **save_kwargs) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    hf = LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(model_dir, **save_kwargs)
    return hf


def _logits(model, ids: list[int]) -> torch.Tensor:
    kv = allocate_kv_cache(model, 8, 4, torch.float32, "cpu")
    meta = build_attention_metadata([list(range(8))], [0], [len(ids)], 4, "cpu")
    return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), meta, kv))


def _edit_config(model_dir: Path, **changes) -> None:
    path = model_dir / "config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw, indent=2))


def test_unsupported_architecture_lists_supported(tmp_path: Path) -> None:
    _save_tiny_llama(tmp_path)
    _edit_config(tmp_path, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ModelConfigError) as err:
        load_model(tmp_path)
    message = str(err.value)
    assert "config.json" in message and "GPT2LMHeadModel is not supported" in message
    assert all(name in message for name in supported_architectures())
    assert "Qwen3ForCausalLM" in supported_architectures()


def test_remote_code_config_refused(tmp_path: Path) -> None:
    _save_tiny_llama(tmp_path)
    _edit_config(tmp_path, auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    with pytest.raises(ModelLoadError, match="auto_map.*trust_remote_code"):
        load_model(tmp_path)


def test_pickle_checkpoint_needs_allow_pickle(tmp_path: Path) -> None:
    hf = _save_tiny_llama(tmp_path)
    reference = _logits(load_model(tmp_path), [1, 5, 9, 3])
    state = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"pytorch_model\.bin: pickle checkpoints"):
        load_model(tmp_path)
    model = load_model(tmp_path, allow_pickle=True)
    assert torch.equal(_logits(model, [1, 5, 9, 3]), reference)
    assert hf.config.tie_word_embeddings


def test_sharded_safetensors_and_untied_head(tmp_path: Path) -> None:
    hf = _save_tiny_llama(tmp_path, tied=False, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    model = load_model(tmp_path)
    with torch.no_grad():
        want = hf(torch.tensor([[1, 5, 9, 3]])).logits[0]
    assert (_logits(model, [1, 5, 9, 3]) - want).abs().max() < 1e-5
    assert model.lm_head is not None


def test_tied_head_shares_embedding_and_ignores_stored_copy(tmp_path: Path) -> None:
    _save_tiny_llama(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in state
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, tmp_path / "model.safetensors")
    model = load_model(tmp_path)
    assert model.lm_head is None
    assert not any("lm_head" in name for name, _ in model.named_parameters())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda s: s.pop("model.layers.1.self_attn.k_proj.weight"),
            r"missing.*layers\.1\.self_attn\.qkv_proj\.weight\[shard 1\]",
        ),
        (lambda s: s.pop("model.norm.weight"), r"missing.*model\.norm\.weight"),
        (
            lambda s: s.update({"model.extra.weight": torch.zeros(2)}),
            r"unexpected.*model\.safetensors:model\.extra\.weight",
        ),
        (
            lambda s: s.update({"model.norm.weight": torch.zeros(3)}),
            r"'model\.norm\.weight': shape \(3,\) does not match",
        ),
    ],
)
def test_weight_name_and_shape_errors(tmp_path: Path, edit, message: str) -> None:
    _save_tiny_llama(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    edit(state)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=message):
        load_model(tmp_path)


def test_no_weights_at_all(tmp_path: Path) -> None:
    _save_tiny_llama(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no weights found"):
        load_model(tmp_path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": "64"}, "field 'hidden_size': expected int"),
        ({"num_key_value_heads": 3}, "field 'num_key_value_heads': 3 does not divide"),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
            "rope type 'yarn' is not supported",
        ),
        ({"rope_parameters": None, "rope_scaling": {"type": "linear"}}, "field 'factor': required"),
        ({"max_position_embeddings": None}, "field 'max_position_embeddings': required"),
        ({"architectures": "LlamaForCausalLM"}, "field 'architectures': expected a non-empty list"),
        ({"hidden_act": "gelu"}, "field 'hidden_act': 'gelu' is not supported"),
    ],
)
def test_config_errors_name_file_and_field(tmp_path: Path, changes: dict, message: str) -> None:
    _save_tiny_llama(tmp_path)
    _edit_config(tmp_path, **changes)
    with pytest.raises(ModelConfigError, match=message) as err:
        load_model(tmp_path)
    assert str(tmp_path / "config.json") in str(err.value)


def test_invalid_json_names_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{\n  "hidden_size": 64,\n  oops\n}')
    with pytest.raises(ModelConfigError, match=r"config\.json: line 3: invalid JSON"):
        read_model_config(tmp_path)


def test_read_eos_token_ids(tmp_path: Path) -> None:
    _save_tiny_llama(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert read_eos_token_ids(tmp_path) == (2, 7)
    (tmp_path / "generation_config.json").unlink()
    assert read_eos_token_ids(tmp_path) == (2,)  # config.json's
    _edit_config(tmp_path, eos_token_id=None)
    assert read_eos_token_ids(tmp_path) == ()


def test_attention_metadata_slots() -> None:
    meta = build_attention_metadata([[5, 2, 9], [0]], [6, 0], [3, 2], block_size=4, device="cpu")
    assert meta.query_start_loc == [0, 3, 5] and meta.seq_lens == [9, 2]
    assert meta.context_slots[0].tolist() == [20, 21, 22, 23, 8, 9, 10, 11, 36]
    assert meta.slot_mapping.tolist() == [10, 11, 36, 0, 1]
    with pytest.raises(ValueError, match="needs 3 blocks, block table has 2"):
        build_attention_metadata([[5, 2]], [6], [3], block_size=4, device="cpu")


def test_kv_cache_sizing(tmp_path: Path) -> None:
    _save_tiny_llama(tmp_path)
    model = load_model(tmp_path)
    cache = allocate_kv_cache(model, 10, 16, torch.float32, "cpu")
    assert cache.shape == (2, 2, 160, 2, 8)
    per_block = kv_cache_bytes_per_block(model, 16, torch.float32)
    assert per_block * 10 == cache.numel() * cache.element_size() == 2 * 2 * 16 * 2 * 8 * 4 * 10


@pytest.mark.skipif(not SMAPS.exists(), reason="reads /proc/self/smaps")
def test_safetensors_are_read_without_holding_the_file(tmp_path: Path) -> None:
    """Each tensor comes from a mapping of its own, closed before the next: one mapping of the
    whole file kept every page it had read resident beside the model's copy (the float32
    default model's load peaked at twice its weights)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    file = (tmp_path / "model.safetensors").resolve()
    seen, sizes = [], []
    for _, _, tensor in checkpoint_tensors(tmp_path):
        seen.append(resident_kb(file))
        # kB, and the kernel's fault-around (a file's pages are mapped 64 kB at a time) at each end
        sizes.append(tensor.numel() * tensor.element_size() // 1024 + 128)
    assert len(seen) > 3 and sum(sizes) > 2 * max(sizes)  # holding them all would show
    assert max(seen) <= max(sizes), (seen, sizes)

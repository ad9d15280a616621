"""Tiny random-weight Hugging Face models, built offline, for fast tests.

Every family is a real transformers architecture saved with save_pretrained
(float32 safetensors) next to a real byte-level BPE tokenizer with a ChatML
chat template, so the engine, the tokenizer wrapper and transformers can all
load the same directory. Weights use a large init range, and norm weights and
biases are randomised too, so a loader that drops any tensor changes the
logits, and greedy top-2 logits are rarely near-ties.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from tiny_families import NEW_FAMILIES, family_config

BASE_FAMILIES: tuple[str, ...] = ("llama", "llama-gqa", "mistral", "qwen2", "qwen3")
FAMILIES: tuple[str, ...] = BASE_FAMILIES + NEW_FAMILIES
SEED = 1234
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOKENIZER_VOCAB_SIZE = 448

# A ChatML template with a tools section (the shape Qwen2.5 uses), written for
# these fixtures; `tojson` of tools exercises transformers' non-escaping filter.
CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role != 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CORPUS = """\
Once upon a time there was a little fox who lived at the edge of a quiet forest.
Every morning the fox walked to the river to drink and to watch the fish jump.
The capital of France is Paris, and the capital of Italy is Rome. Berlin is the
capital of Germany. Many people travel between these cities by train each day.
A language model reads text as tokens and predicts the next token, one at a time.
Caching the keys and values of a shared prompt prefix saves a great deal of work
when many requests begin with the same system prompt and the same instructions.
The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.
Numbers like 12, 345 and 6789 appear in tables; dates such as 2024-05-17 do too.
What is the weather like today? It is sunny and warm, with a light breeze.
def add(a, b):
    return a + b
"""


@cache  # ~2 s to train, and every fixture uses the same one (read-only: saved, not changed)
def train_tokenizer() -> Any:
    """A byte-level BPE (GPT-2 style) trained on CORPUS, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS.splitlines(keepends=True) * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
        model_max_length=512,
    )


def _config(family: str, vocab_size: int, token_ids: dict[str, int]) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        initializer_range=0.2,
        rms_norm_eps=1e-5,
        bos_token_id=token_ids["<|endoftext|>"],
        eos_token_id=token_ids["<|im_end|>"],
        pad_token_id=token_ids["<|endoftext|>"],
        tie_word_embeddings=False,
    )
    if family == "llama":
        return LlamaConfig(**{**common, "num_key_value_heads": 4, "tie_word_embeddings": True})
    if family == "llama-gqa":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        }
        return LlamaConfig(**common, rope_parameters=rope)
    if family == "mistral":
        return MistralConfig(**common, sliding_window=None)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "qwen3":
        return Qwen3Config(**common)
    if family in NEW_FAMILIES:
        return family_config(family, common)
    raise ValueError(f"family: expected one of {', '.join(FAMILIES)}, got {family!r}")


def _randomise_constant_inits(model: Any) -> None:
    """Norm weights init to 1 and biases to 0: make them random so they matter."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.2 * torch.randn_like(param))


def make_tiny_model(family: str, path: Path) -> Path:
    """Build the tiny `family` model with its tokenizer into `path`; return `path`."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = train_tokenizer()
    token_ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    config = _config(family, len(tokenizer), token_ids)
    torch.manual_seed(SEED + FAMILIES.index(family))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomise_constant_inits(model)
    model.generation_config = GenerationConfig(
        bos_token_id=token_ids["<|endoftext|>"],
        eos_token_id=[token_ids["<|im_end|>"], token_ids["<|endoftext|>"]],
        pad_token_id=token_ids["<|endoftext|>"],
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "kvcli_fixture.json").write_text(json.dumps({"family": family, "seed": SEED}))
    return path


def _permute_for_gguf(weight: Any, n_head: int) -> Any:
    """llama.cpp's convert_hf_to_gguf reorders q/k rows for its rope layout."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _gguf_tensors(model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The HF checkpoint's tensors under llama.cpp's names, as float32 numpy arrays."""
    from safetensors.numpy import load_file

    hf = load_file(str(model_dir / "model.safetensors"))
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    out = {
        "token_embd.weight": hf["model.embed_tokens.weight"],
        "output_norm.weight": hf["model.norm.weight"],
    }
    if "lm_head.weight" in hf and not config.get("tie_word_embeddings"):
        out["output.weight"] = hf["lm_head.weight"]
    names = {
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    }  # fmt: skip
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        out[f"blk.{layer}.attn_q.weight"] = _permute_for_gguf(
            hf[prefix + "self_attn.q_proj.weight"], n_head
        )
        out[f"blk.{layer}.attn_k.weight"] = _permute_for_gguf(
            hf[prefix + "self_attn.k_proj.weight"], n_kv
        )
        for hf_name, gguf_name in names.items():
            out[f"blk.{layer}.{gguf_name}.weight"] = hf[prefix + hf_name + ".weight"]
    return out


def make_tiny_gguf(model_dir: Path, path: Path) -> Path:
    """Write a llama-architecture float32 GGUF of the tiny model in `model_dir` to `path`.

    Works for the fixture families without biases, q/k norms or rope scaling
    ("llama", "mistral"); the tokenizer goes in as a "gpt2" byte-level vocabulary.
    """
    import gguf

    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda item: item[1])
    specials = {added["content"] for added in tokenizer["added_tokens"] if added["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    template = (model_dir / "chat_template.jinja").read_text()

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"tiny {config['model_type']}")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([3 if token in specials else 1 for token, _ in vocab])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_chat_template(template)
    for name, array in _gguf_tensors(model_dir, config).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

"""transformers configs of the tiny fixtures for the families beyond Llama/Qwen (issue 22).

Each config switches on its family's special features at sizes where they matter inside a
short test: multipliers far from 1 (Granite), LongRoPE with an original context the test's
generations cross, partial rotary and a window on every layer (Phi-3), soft-capping caps the
random logits reach (Gemma 2), sliding windows shorter than the prompts and different
local/global RoPE bases (Gemma 2/3), more experts than top-k with uneven routing, normalised
and not, a dense layer and a shared expert (MoE).
"""

from __future__ import annotations

from typing import Any

NEW_FAMILIES: tuple[str, ...] = ("granite", "olmo2", "phi3", "gemma2", "gemma3", "mixtral",
                                  "qwen3-moe", "qwen2-moe")

#: Phi-3's original (pre-extension) context: every test prompt fits in it (see
#: docs/ARCHITECTURE.md on LongRoPE) and the longer ones' generations cross it.
PHI3_ORIGINAL_CONTEXT = 60


def family_config(family: str, common: dict[str, Any]) -> Any:
    import transformers as tf

    if family == "granite":
        return tf.GraniteConfig(**common, embedding_multiplier=3.0, residual_multiplier=0.6,
                                attention_multiplier=0.11, logits_scaling=2.5)
    if family == "olmo2":
        return tf.Olmo2Config(**common)
    if family == "phi3":
        half_rotary = 6  # partial_rotary_factor 0.75 of head_dim 16: 12 rotated dims
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                "short_factor": [1.0 + 0.1 * i for i in range(half_rotary)],
                "long_factor": [1.5 + 0.9 * i for i in range(half_rotary)],
                "original_max_position_embeddings": PHI3_ORIGINAL_CONTEXT}
        return tf.Phi3Config(**common, rope_parameters=rope,
                             original_max_position_embeddings=PHI3_ORIGINAL_CONTEXT,
                             partial_rotary_factor=0.75, sliding_window=25)
    gemma = dict(common, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                 sliding_window=11, tie_word_embeddings=True)
    if family == "gemma2":
        return tf.Gemma2Config(**gemma, final_logit_softcapping=3.0, attn_logit_softcapping=2.0,
                               layer_types=["sliding_attention", "full_attention"])
    if family == "gemma3":
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50000.0}}
        return tf.Gemma3TextConfig(**{**gemma, "num_hidden_layers": 3}, rope_parameters=rope,
                                   layer_types=["sliding_attention", "full_attention",
                                                "sliding_attention"])
    if family == "mixtral":  # six experts, two per token, normalised; a window on every layer
        return tf.MixtralConfig(**common, num_local_experts=6, num_experts_per_tok=2,
                                sliding_window=20)
    if family == "qwen3-moe":  # eight experts, three per token, unnormalised; layer 1 dense
        return tf.Qwen3MoeConfig(**{**common, "num_hidden_layers": 3}, num_experts=8,
                                 num_experts_per_tok=3, moe_intermediate_size=48,
                                 norm_topk_prob=False, mlp_only_layers=[1])
    if family == "qwen2-moe":  # shared expert, normalised top-2 of six, windowed first layer
        return tf.Qwen2MoeConfig(**common, num_experts=6, num_experts_per_tok=2,
                                 moe_intermediate_size=48, shared_expert_intermediate_size=80,
                                 norm_topk_prob=True, use_sliding_window=True, sliding_window=20,
                                 max_window_layers=2)
    raise ValueError(f"family: expected one of {', '.join(NEW_FAMILIES)}, got {family!r}")

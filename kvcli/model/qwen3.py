"""Qwen3 (dense): Qwen2's layout with an RMSNorm over each q/k head before RoPE, an explicit
``head_dim`` and ``attention_bias`` (default off) on all four attention projections."""

from __future__ import annotations

from kvcli.checkpoint.config import ModelConfig
from kvcli.model.qwen2 import Qwen2ForCausalLM


class Qwen3ForCausalLM(Qwen2ForCausalLM):
    def qkv_bias(self, cfg: ModelConfig) -> bool:
        return cfg.attention_bias

    def o_bias(self, cfg: ModelConfig) -> bool:
        return cfg.attention_bias

    def qk_norm(self, cfg: ModelConfig) -> str | None:
        return "head"

"""Granite 3 (``GraniteForCausalLM``): the Llama decoder with four scalar multipliers.

``embedding_multiplier`` scales the embeddings, ``residual_multiplier`` each attention and MLP
output before it is added back, ``attention_multiplier`` replaces 1/sqrt(head_dim) as the
attention scale, and the logits are divided by ``logits_scaling`` (all as GraniteConfig, whose
defaults are 1).
"""

from __future__ import annotations

from dataclasses import replace

from kvcli.checkpoint.config import ModelConfig
from kvcli.model.decoder import AttentionSpec, LayerSpec
from kvcli.model.llama import LlamaForCausalLM


class GraniteForCausalLM(LlamaForCausalLM):
    numpy_decode_equivalent = False  # the fused NumPy decode knows no multipliers

    def attention_spec(self, cfg: ModelConfig, layer: int, window: int | None) -> AttentionSpec:
        spec = super().attention_spec(cfg, layer, window)
        return replace(spec, scale=cfg.field("attention_multiplier", float, 1.0))

    def layer_spec(self, cfg: ModelConfig) -> LayerSpec:
        return LayerSpec(residual_multiplier=cfg.field("residual_multiplier", float, 1.0))

    def embedding_multiplier(self, cfg: ModelConfig) -> float | None:
        return cfg.field("embedding_multiplier", float, 1.0)

    def logits_divisor(self, cfg: ModelConfig) -> float | None:
        return cfg.field("logits_scaling", float, 1.0)

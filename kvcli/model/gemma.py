"""Gemma 2 and Gemma 3 text models (``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``).

On the Llama decoder: embeddings scaled by sqrt(hidden_size), every RMSNorm multiplying by
``1 + weight``, norms before and after both attention and MLP (``sandwich``), GeGLU
(``gelu_pytorch_tanh``), attention scale ``query_pre_attn_scalar ** -0.5``, tied embeddings by
default, and local (sliding-window) and global layers per ``layer_types``. Gemma 2 soft-caps the
attention logits and the final logits; Gemma 3 normalises each q/k head and gives local layers
their own RoPE base (``rope_local_base_freq`` / ``rope_parameters["sliding_attention"]``).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from kvcli.checkpoint.config import ModelConfig, ModelConfigError, RopeConfig, parse_rope
from kvcli.model.decoder import AttentionSpec, LayerSpec
from kvcli.model.layers import RMSNorm, RotaryEmbedding
from kvcli.model.llama import Device, LlamaForCausalLM


class OffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: ``normalise(x) * (1 + weight)`` (the checkpoint stores weight - 1)."""

    def scale(self) -> torch.Tensor:
        return 1.0 + self.weight.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return super().forward(x)
        return F.rms_norm(x.float(), (x.shape[-1],), self.scale(), self.eps).type_as(x)


class Gemma2ForCausalLM(LlamaForCausalLM):
    numpy_decode_equivalent = False
    sliding_window_pattern = 2  # Gemma2Config: every other layer local, starting with the first

    def sliding_windows(self, cfg: ModelConfig) -> list[int | None]:
        if cfg.field("use_bidirectional_attention", bool, False):
            raise ModelConfigError(f"{cfg.path}: field 'use_bidirectional_attention': "
                                   "bidirectional attention is not supported")
        window = cfg.field("sliding_window", int, None)
        pattern = cfg.field("sliding_window_pattern", int, self.sliding_window_pattern)
        kinds = cfg.field("layer_types", list, None) or [
            "sliding_attention" if (i + 1) % pattern else "full_attention"
            for i in range(cfg.num_layers)]
        if len(kinds) != cfg.num_layers:
            raise ModelConfigError(f"{cfg.path}: field 'layer_types': {len(kinds)} entries for "
                                   f"{cfg.num_layers} layers")
        return [window if kind == "sliding_attention" else None for kind in kinds]

    def attention_spec(self, cfg: ModelConfig, layer: int, window: int | None) -> AttentionSpec:
        scale = cfg.field("query_pre_attn_scalar", float, 256.0) ** -0.5
        return replace(super().attention_spec(cfg, layer, window), scale=scale,
                       softcap=cfg.field("attn_logit_softcapping", float, None))

    def layer_spec(self, cfg: ModelConfig) -> LayerSpec:
        return LayerSpec(norm_layout="sandwich", norm=OffsetRMSNorm)

    def activation(self, cfg: ModelConfig) -> str:
        return cfg.field("hidden_activation", str, None) or cfg.hidden_act

    def mlp_bias(self, cfg: ModelConfig) -> bool:
        return False

    def tie_word_embeddings(self, cfg: ModelConfig) -> bool:
        return cfg.field("tie_word_embeddings", bool, True)  # Gemma configs' default

    def embedding_multiplier(self, cfg: ModelConfig) -> float | None:
        return cfg.hidden_size**0.5

    def final_logit_softcap(self, cfg: ModelConfig) -> float | None:
        return cfg.field("final_logit_softcapping", float, None)


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    sliding_window_pattern = 6  # Gemma3TextConfig: five local layers, then one global

    def qk_norm(self, cfg: ModelConfig) -> str | None:
        return "head"

    def attention_spec(self, cfg: ModelConfig, layer: int, window: int | None) -> AttentionSpec:
        # Global layers use table 0, local (sliding) layers table 1 (rotary_embeddings).
        return replace(super().attention_spec(cfg, layer, window),
                       rope_slot=0 if window is None else 1)

    def ropes(self, cfg: ModelConfig) -> tuple[RopeConfig, RopeConfig]:
        """(global, local) RoPE: transformers 5's per-layer-type ``rope_parameters``, or the
        older top-level ``rope_theta`` / ``rope_scaling`` plus ``rope_local_base_freq``."""
        params = cfg.raw.get("rope_parameters")
        max_pos = cfg.max_position_embeddings
        if isinstance(params, dict) and "full_attention" in params:
            return tuple(parse_rope({"rope_parameters": params.get(kind) or {}}, cfg.path, max_pos)
                         for kind in ("full_attention", "sliding_attention"))  # type: ignore[return-value]
        local = cfg.field("rope_local_base_freq", float, 10000.0)
        return cfg.rope, RopeConfig("default", local)

    def rotary_embeddings(self, cfg: ModelConfig, dtype: torch.dtype, device: Device
                          ) -> list[nn.Module]:
        return [RotaryEmbedding(cfg.head_dim, rope, cfg.max_position_embeddings, dtype, device)
                for rope in self.ropes(cfg)]

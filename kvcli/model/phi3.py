"""Phi-3 / Phi-3.5 / Phi-4-mini (``Phi3ForCausalLM``): the Llama decoder whose checkpoint stores
q/k/v as one ``qkv_proj`` and gate/up as one ``gate_up_proj`` (loaded as single tensors), with
partial rotary (``partial_rotary_factor``: RoPE on the first dims of each head) and LongRoPE.

LongRoPE, per position: positions below ``original_max_position_embeddings`` use the short
factors, later ones the long factors, both scaled by the attention factor. transformers' forward
chooses per call (long for the whole call once its last position passes the original context):
the same for every prompt that fits in the original context and each decode step after it.
Two differences remain, both where a sequence passes the original context: transformers'
``generate()`` then drops its cache and re-prefills the whole sequence with long factors, and a
longer prompt is prefilled with long factors throughout; here the earlier positions keep
short-factor K/V. A per-position rule is what stays correct under prefix caching, chunked
prefill and preemption (a cached block's K/V never depends on what follows it); matching
``generate()`` would need a sequence's blocks re-hashed and recomputed at the crossing.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from kvcli.checkpoint.config import ModelConfig
from kvcli.model.decoder import AttentionSpec, GatedMLP
from kvcli.model.layers import RotaryEmbedding, rope_inv_freq
from kvcli.model.llama import Device, LlamaForCausalLM


class PartialLongRope(RotaryEmbedding):
    """cos/sin tables of ``rotary_dim`` = head_dim * partial_rotary_factor dims per position."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        nn.Module.__init__(self)
        rope = cfg.rope
        dim = int(cfg.head_dim * rope.partial_rotary_factor)
        positions = torch.arange(cfg.max_position_embeddings, dtype=torch.int64).float()[:, None]
        scale = 1.0
        if rope.rope_type == "longrope":  # as transformers' _compute_longrope_parameters
            exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
            short, long = (1.0 / (torch.tensor(f, dtype=torch.float32) * rope.theta**exponent)
                           for f in (rope.short_factor, rope.long_factor))
            inv_freq = torch.where(positions >= rope.original_max_position_embeddings, long, short)
            scale = rope.attention_factor
        else:
            inv_freq = rope_inv_freq(dim, rope)[None, :]
        freqs = positions * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", (emb.cos() * scale).to(dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("sin", (emb.sin() * scale).to(dtype=dtype, device=device),
                             persistent=False)


class Phi3ForCausalLM(LlamaForCausalLM):
    packed_modules: dict[str, tuple[str, ...]] = {}  # already fused in the checkpoint
    numpy_decode_equivalent = False

    def attention_spec(self, cfg: ModelConfig, layer: int, window: int | None) -> AttentionSpec:
        rotary_dim = int(cfg.head_dim * cfg.rope.partial_rotary_factor)
        return replace(super().attention_spec(cfg, layer, window), rotary_dim=rotary_dim,
                       fused_checkpoint=True)

    def sliding_windows(self, cfg: ModelConfig) -> list[int | None]:
        # Phi3Attention passes config.sliding_window to every layer (Phi-3-mini-4k: 2047).
        return [cfg.field("sliding_window", int, None)] * cfg.num_layers

    def make_mlp(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, device: Device
                 ) -> nn.Module:
        return GatedMLP(cfg, False, self.activation(cfg), dtype, device, fused_checkpoint=True)

    def rotary_embeddings(self, cfg: ModelConfig, dtype: torch.dtype, device: Device
                          ) -> list[nn.Module]:
        return [PartialLongRope(cfg, dtype, device)]

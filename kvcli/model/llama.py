"""The Llama decoder (Llama 2/3, SmolLM, Mistral) and the hooks its relatives (Qwen2, Qwen3) override.

Weight names mirror transformers' modules so the loader maps checkpoint names one to one, except
for the fused projections listed in ``packed_modules``.
"""

from __future__ import annotations

import torch
from torch import nn

from kvcli.model import native
from kvcli.model.attention import Attention, AttentionMetadata, TorchSDPAAttention
from kvcli.model.config import ModelConfig
from kvcli.model.layers import (
    Embedding,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    apply_rotary,
    gated_activation,
    linear,
)
from kvcli.model.numpy_decode import NumpyDecoder

Device = torch.device | str


class DecoderAttention(nn.Module):
    """Fused QKV projection, optional per-head q/k RMSNorm (Qwen3), RoPE, paged attention, output."""

    def __init__(
        self,
        cfg: ModelConfig,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm: bool,
        sliding_window: int | None,
        dtype: torch.dtype,
        device: Device,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split_sizes = (q_size, kv_size, kv_size)
        self.qkv_proj = Linear(cfg.hidden_size, self.split_sizes, qkv_bias, dtype, device)
        self.o_proj = Linear(q_size, (cfg.hidden_size,), o_bias, dtype, device)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, dtype, device) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, dtype, device) if qk_norm else None
        self.attn: Attention = TorchSDPAAttention(self.head_dim**-0.5, sliding_window)

    def forward(
        self,
        hidden: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        q_size, kv_size, _ = self.split_sizes
        v = qkv[:, q_size + kv_size :].view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qkv[:, :q_size], qkv[:, q_size : q_size + kv_size]
            q = self.q_norm(q.view(tokens, self.num_heads, self.head_dim))
            k = self.k_norm(k.view(tokens, self.num_kv_heads, self.head_dim))
            q, k = apply_rotary(q, *cos_sin), apply_rotary(k, *cos_sin)
        else:  # RoPE on q and k heads together: half the element-wise ops per layer
            heads = self.num_heads + self.num_kv_heads
            qk = qkv[:, : q_size + kv_size].view(tokens, heads, self.head_dim)
            lib = native.for_tensor(qkv)
            if lib is not None:  # in place in the projection's output (qk is a view of it)
                cos, sin = cos_sin
                native.rope_(lib, qkv, cos.squeeze(1), sin.squeeze(1), heads, self.head_dim)
            else:
                qk = apply_rotary(qk, *cos_sin)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        out = self.attn.forward(q, k, v, kv_layer, meta)
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, cfg: ModelConfig, bias: bool, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, (size, size), bias, dtype, device)
        self.down_proj = Linear(size, (cfg.hidden_size,), bias, dtype, device)
        self.act_and_mul = gated_activation(cfg.hidden_act, cfg.path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(
        self,
        self_attn: DecoderAttention,
        mlp: GatedMLP,
        cfg: ModelConfig,
        dtype: torch.dtype,
        device: Device,
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)

    def forward(
        self,
        hidden: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        # Same order of additions as transformers, so float32 results agree to rounding.
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos_sin, kv_layer, meta)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DecoderModel(nn.Module):
    """transformers' ``model.*`` submodule: embeddings, layers, final norm."""

    def __init__(
        self, layers: list[DecoderLayer], cfg: ModelConfig, dtype: torch.dtype, device: Device
    ) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype, device)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.rotary = RotaryEmbedding(
            cfg.head_dim, cfg.rope, cfg.max_position_embeddings, dtype, device
        )


class LlamaForCausalLM(nn.Module):
    """Llama-style causal LM over a paged KV cache.

    forward(input_ids [T], positions [T], attn_metadata, kv_cache) -> hidden [T, hidden] after the
    final norm; compute_logits(hidden [R, hidden]) -> float32 [R, vocab] for the rows that sample.
    """

    # Fused parameter -> the checkpoint projections stacked into it, in row order.
    packed_modules: dict[str, tuple[str, ...]] = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "gate_up_proj": ("gate_proj", "up_proj"),
    }

    # --- hooks for the relatives (Qwen2, Qwen3, Mistral) --------------------------------------
    def qkv_bias(self, cfg: ModelConfig) -> bool:
        return cfg.attention_bias

    def o_bias(self, cfg: ModelConfig) -> bool:
        return cfg.attention_bias

    def mlp_bias(self, cfg: ModelConfig) -> bool:
        return cfg.mlp_bias

    def qk_norm(self, cfg: ModelConfig) -> bool:
        return False

    def sliding_windows(self, cfg: ModelConfig) -> list[int | None]:
        return [None] * cfg.num_layers

    # -------------------------------------------------------------------------------------------
    def __init__(
        self, cfg: ModelConfig, dtype: torch.dtype = torch.float32, device: Device = "cpu"
    ) -> None:
        super().__init__()
        self.config = cfg
        windows = self.sliding_windows(cfg)
        layers = [
            DecoderLayer(
                DecoderAttention(
                    cfg,
                    self.qkv_bias(cfg),
                    self.o_bias(cfg),
                    self.qk_norm(cfg),
                    windows[i],
                    dtype,
                    device,
                ),
                GatedMLP(cfg, self.mlp_bias(cfg), dtype, device),
                cfg,
                dtype,
                device,
            )
            for i in range(cfg.num_layers)
        ]
        self.model = DecoderModel(layers, cfg, dtype, device)
        # Tied: the output layer *is* the embedding tensor (no lm_head parameter, no copy).
        tied = cfg.tie_word_embeddings
        self.lm_head = (
            None if tied else Linear(cfg.hidden_size, (cfg.vocab_size,), False, dtype, device)
        )

    num_layers = property(lambda self: self.config.num_layers)
    num_kv_heads = property(lambda self: self.config.num_kv_heads)
    head_dim = property(lambda self: self.config.head_dim)
    vocab_size = property(lambda self: self.config.vocab_size)
    max_position_embeddings = property(lambda self: self.config.max_position_embeddings)

    _numpy_decoder: NumpyDecoder | None = None

    def enable_fast_decode(self) -> None:
        """Use the fused NumPy path for single-token steps where it is equivalent (CPU fp32)."""
        self._numpy_decoder = NumpyDecoder(self) if NumpyDecoder.supports(self) else None

    @property
    def ignored_checkpoint_suffixes(self) -> tuple[str, ...]:
        # Old checkpoints store RoPE buffers; tied ones may also store a redundant lm_head copy.
        tied = ("lm_head.weight",) if self.lm_head is None else ()
        return ("rotary_emb.inv_freq", *tied)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        if input_ids.shape[0] == 1 and self._numpy_decoder is not None:
            context = attn_metadata.context_slots[0]
            if context.shape[0] > 1:  # a decode token (the very first token has no context)
                hidden = self._numpy_decoder(
                    int(input_ids[0]), int(positions[0]), int(attn_metadata.slot_mapping[0]),
                    context.numpy(), kv_cache.numpy(),
                )
                return torch.from_numpy(hidden)
        hidden = self.model.embed_tokens(input_ids)
        cos_sin = self.model.rotary.cos_sin(positions)
        for index, layer in enumerate(self.model.layers):
            hidden = layer(hidden, cos_sin, kv_cache[index], attn_metadata)
        return self.model.norm(hidden)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return linear(hidden, weight).float()


class MistralForCausalLM(LlamaForCausalLM):
    """Llama plus an optional sliding window on every layer."""

    def sliding_windows(self, cfg: ModelConfig) -> list[int | None]:
        return [cfg.field("sliding_window", int, None)] * cfg.num_layers

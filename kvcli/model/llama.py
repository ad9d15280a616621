"""The Llama decoder (Llama 2/3, SmolLM, Mistral) and the hooks its relatives (Qwen2, Qwen3) override.

Weight names mirror transformers' modules so the loader maps checkpoint names one to one, except
for the fused projections listed in ``packed_modules``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from kvcli.checkpoint.config import ModelConfig, ModelConfigError
from kvcli.model.attention import AttentionBackend, CommonAttentionMetadata
from kvcli.model.attention.selector import select_attention_backend
from kvcli.model.decoder import (
    AttentionSpec,
    DecoderAttention,
    DecoderLayer,
    DecoderModel,
    GatedMLP,
    LayerSpec,
)
from kvcli.model.layers import Linear, RotaryEmbedding, install_routes
from kvcli.model.numpy_decode import NumpyDecoder
from kvcli.model.platform import compute_dtype, detect_platform
from kvcli.model.registry import is_headless
from kvcli.model.routes import KernelRoutes, select_routes

Device = torch.device | str


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

    #: Whether the fused NumPy batch-1 decode (numpy_decode.py, which knows only the Llama
    #: layer) may be used.
    numpy_decode_equivalent = True

    # --- hooks for the relatives (Qwen2, Qwen3, Mistral and the families in this package) ------
    def qkv_bias(self, cfg: ModelConfig) -> bool:
        return cfg.attention_bias

    def o_bias(self, cfg: ModelConfig) -> bool:
        return cfg.attention_bias

    def mlp_bias(self, cfg: ModelConfig) -> bool:
        return cfg.mlp_bias

    def qk_norm(self, cfg: ModelConfig) -> str | None:
        return None

    def sliding_windows(self, cfg: ModelConfig) -> list[int | None]:
        return [None] * cfg.num_layers

    def attention_spec(self, cfg: ModelConfig, layer: int, window: int | None) -> AttentionSpec:
        return AttentionSpec(self.qkv_bias(cfg), self.o_bias(cfg), self.qk_norm(cfg), window,
                             cfg.head_dim**-0.5)

    def layer_spec(self, cfg: ModelConfig) -> LayerSpec:
        return LayerSpec()

    def activation(self, cfg: ModelConfig) -> str:
        return cfg.hidden_act

    def make_mlp(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, device: Device
                 ) -> nn.Module:
        return GatedMLP(cfg, self.mlp_bias(cfg), self.activation(cfg), dtype, device)

    def rotary_embeddings(self, cfg: ModelConfig, dtype: torch.dtype, device: Device
                          ) -> list[nn.Module]:
        """The RoPE tables, indexed by ``AttentionSpec.rope_slot``."""
        if cfg.rope.partial_rotary_factor != 1.0:
            raise ModelConfigError(f"{cfg.path}: field 'partial_rotary_factor': "
                                   f"{cfg.rope.partial_rotary_factor!r} is not supported for "
                                   f"{cfg.architecture}")
        return [RotaryEmbedding(cfg.head_dim, cfg.rope, cfg.max_position_embeddings, dtype,
                                device)]

    def tie_word_embeddings(self, cfg: ModelConfig) -> bool:
        return cfg.tie_word_embeddings

    def embedding_multiplier(self, cfg: ModelConfig) -> float | None:
        return None

    def logits_divisor(self, cfg: ModelConfig) -> float | None:
        return None

    def final_logit_softcap(self, cfg: ModelConfig) -> float | None:
        return None

    # -------------------------------------------------------------------------------------------
    def __init__(
        self, cfg: ModelConfig, dtype: torch.dtype = torch.float32, device: Device = "cpu"
    ) -> None:
        super().__init__()
        self.config = cfg
        windows = self.sliding_windows(cfg)
        layer_spec = self.layer_spec(cfg)
        specs = [self.attention_spec(cfg, i, windows[i]) for i in range(cfg.num_layers)]
        # Chosen once for the model (the KV cache takes the dtype it computes in): which
        # attention backend every layer runs, and which kernels its matmuls, norms and RoPE
        # take. On the CPU only the loader's matmul weights take a narrower ``dtype``.
        self.platform = detect_platform(device, compute_dtype(device, dtype), weights=dtype)
        dtype = self.platform.kv_dtype
        self.compute_dtype = dtype  # the cache's too unless set_kv_cache_dtype changes it
        self.routes: KernelRoutes = select_routes(self.platform)
        self._attention_specs = [spec.attention for spec in specs]
        self.attention_backend: AttentionBackend = select_attention_backend(
            self.platform, self._attention_specs)
        layers = []
        for i, spec in enumerate(specs):
            attn = DecoderAttention(cfg, spec, self.attention_backend.layer(spec.attention),
                                    layer_spec.norm, dtype, device)
            layers.append(DecoderLayer(attn, self.make_mlp(cfg, i, dtype, device), cfg, dtype,
                                       device, layer_spec))
        rotaries = self.rotary_embeddings(cfg, dtype, device)
        self.model = DecoderModel(layers, rotaries, cfg, layer_spec.norm, dtype, device)
        # Tied: the output layer *is* the embedding tensor (no lm_head parameter, no copy).
        # Headless (an embedding model's ``Qwen2Model``): no output layer at all.
        self.headless = is_headless(cfg.architecture)
        tied = self.tie_word_embeddings(cfg)
        self.lm_head = (
            None if tied or self.headless
            else Linear(cfg.hidden_size, (cfg.vocab_size,), False, dtype, device)
        )
        self.embed_multiplier = self.embedding_multiplier(cfg)
        self.logits_div = self.logits_divisor(cfg)
        self.logit_softcap = self.final_logit_softcap(cfg)
        install_routes(self, self.routes)

    num_layers = property(lambda self: self.config.num_layers)
    num_kv_heads = property(lambda self: self.config.num_kv_heads)
    head_dim = property(lambda self: self.config.head_dim)
    vocab_size = property(lambda self: self.config.vocab_size)
    max_position_embeddings = property(lambda self: self.config.max_position_embeddings)

    @property
    def common_sliding_window(self) -> int | None:
        """The window every layer keeps within (the largest where they differ), for the KV-cache
        manager to free blocks all layers have left behind (kvcli/engine/sliding_window.py);
        None when any layer is global (Gemma 2/3's mix) or no layer has a window."""
        windows = [layer.self_attn.attn.sliding_window for layer in self.model.layers]
        return None if None in windows else max(windows)

    _numpy_decoder: NumpyDecoder | None = None
    logits_weight: object | None = None  # model/packed.py's PackedWeight of a tied embedding

    def enable_fast_decode(self) -> None:
        """Use the fused NumPy path for single-token steps where it is equivalent (CPU fp32)."""
        kv = self.platform.kv_dtype  # it reads a float32 cache, or int8 through the kernels
        fits = (self.numpy_decode_equivalent and NumpyDecoder.supports(self)
                and (kv == torch.float32 or (kv == torch.uint8 and self.platform.native)))
        self._numpy_decoder = NumpyDecoder(self) if fits else None

    def set_kv_cache_dtype(self, kv_dtype: torch.dtype) -> None:
        """Attend a ``kv_dtype`` pool (the engine's --kv-cache-dtype; torch.uint8: int8 rows)
        instead of one in the model's dtype: the platform's KV dtype changes, so the selector
        picks the backend again and every layer takes its implementation (ValueError: no
        backend reads that cache here). The kernel routes do not depend on it."""
        if kv_dtype == self.platform.kv_dtype:
            return
        platform = replace(self.platform, kv_dtype=kv_dtype)
        backend = select_attention_backend(platform, self._attention_specs, self.compute_dtype)
        self.platform, self.attention_backend = platform, backend
        for layer, spec in zip(self.model.layers, self._attention_specs, strict=True):
            layer.self_attn.attn = backend.layer(spec)
        if self._numpy_decoder is not None:  # rebuilt for the new cache (or dropped)
            self.enable_fast_decode()

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
        attn_metadata: CommonAttentionMetadata,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        """``attn_metadata``: the step's common fields; the backend builds its own from them."""
        if input_ids.shape[0] == 1 and self._numpy_decoder is not None:
            context = attn_metadata.context_slots[0]
            if context.shape[0] > 1:  # a decode token (the very first token has no context)
                hidden = self._numpy_decoder(
                    int(input_ids[0]), int(positions[0]), int(attn_metadata.slot_mapping[0]),
                    context.numpy(), kv_cache.numpy(),
                )
                return torch.from_numpy(hidden)
        with self.routes.forward_threads():
            return self._forward(input_ids, positions, attn_metadata, kv_cache)

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 attn_metadata: CommonAttentionMetadata, kv_cache: torch.Tensor) -> torch.Tensor:
        """The batched forward: a decode step in one native call, or the layers in turn."""
        meta = self.attention_backend.build_metadata(attn_metadata)  # once per step, for every layer
        step = None if self._numpy_decoder is None else self._numpy_decoder.native_step
        if step is not None and input_ids.shape[0] > 1:  # a batched decode step in one call
            fused = step.rows(self, input_ids, positions, meta, kv_cache)
            if fused is not None:
                return fused
        hidden = self.model.embed_tokens(input_ids)
        if self.embed_multiplier is not None:  # Granite's multiplier, Gemma's sqrt(hidden)
            hidden = hidden * self.embed_multiplier
        cos_sins = self.model.cos_sins(positions)
        pending = None  # a layer's product left for the next one's norm (DecoderLayer.carry)
        for index, layer in enumerate(self.model.layers):
            hidden, pending = layer.carry(hidden, pending, cos_sins[layer.self_attn.rope_slot],
                                          kv_cache[index], meta)
        if pending is None:
            return self.model.norm(hidden)
        return self.model.norm.add_and_norm(hidden, pending)[1]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.headless:  # the engine refuses such requests first (add_request)
            raise RuntimeError(f"{self.config.architecture} has no language-model head")
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if self.logits_weight is not None:  # a packed copy of a tied embedding (packed.py)
            weight = self.logits_weight
        logits = self.routes.linear(hidden, weight)
        if self.logits_div is not None:  # Granite's logits_scaling
            logits = logits / self.logits_div
        if self.logit_softcap is not None:  # Gemma: cap * tanh(logits / cap), as transformers
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits.float()


class MistralForCausalLM(LlamaForCausalLM):
    """Llama plus an optional sliding window on every layer."""

    def sliding_windows(self, cfg: ModelConfig) -> list[int | None]:
        return [cfg.field("sliding_window", int, None)] * cfg.num_layers

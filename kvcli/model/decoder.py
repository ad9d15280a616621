"""The decoder-layer skeleton every family shares: attention, gated MLP, layer, model body.

A family changes what differs through :class:`AttentionSpec` / :class:`LayerSpec` (built by the
hooks of :class:`kvcli.model.llama.LlamaForCausalLM`), never by copying these classes. Module
names mirror transformers' so the loader maps checkpoint names one to one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kvcli.checkpoint.config import ModelConfig
from kvcli.model.attention import AttentionImpl, LayerAttention
from kvcli.model.layers import Embedding, Linear, RMSNorm, Routed, apply_rotary, gated_activation

Device = torch.device | str
CosSin = tuple[torch.Tensor, torch.Tensor]


@dataclass(slots=True, frozen=True)
class AttentionSpec:
    qkv_bias: bool
    o_bias: bool
    qk_norm: str | None  # None, "head" (one norm per q/k head: Qwen3, Gemma 3) or "full" (OLMo 2)
    sliding_window: int | None
    scale: float
    softcap: float | None = None  # Gemma 2's attention-logit soft-capping
    rotary_dim: int = 0  # 0: the whole head; fewer (Phi-3's partial rotary): the first dims only
    fused_checkpoint: bool = False  # q/k/v stored as one qkv_proj tensor (Phi-3)
    rope_slot: int = 0  # which of the model's rotary tables this layer uses (Gemma 3 local/global)

    @property
    def attention(self) -> LayerAttention:
        """What the layer asks of the attention backend."""
        return LayerAttention(self.scale, self.sliding_window, self.softcap)


#: Where a layer's norms sit, and their checkpoint names: (attn in, attn out, mlp in, mlp out).
NORM_LAYOUTS: dict[str, tuple[str | None, str | None, str | None, str | None]] = {
    "pre": ("input_layernorm", None, "post_attention_layernorm", None),  # Llama
    "post": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),  # OLMo 2
    "sandwich": ("input_layernorm", "post_attention_layernorm",  # Gemma 2 / 3
                 "pre_feedforward_layernorm", "post_feedforward_layernorm"),
}


@dataclass(slots=True, frozen=True)
class LayerSpec:
    norm_layout: str = "pre"
    norm: type[RMSNorm] = RMSNorm
    residual_multiplier: float | None = None  # Granite scales each branch before adding it
    mlp_name: str = "mlp"  # the MLP's checkpoint name (Mixtral: "block_sparse_moe")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first ``cos.shape[-1]`` dims of each head, the rest passed through (partial
    rotary, as transformers' Phi-3 ``apply_rotary_pos_emb``)."""
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return apply_rotary(x, cos, sin)
    return torch.cat((apply_rotary(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)


class DecoderAttention(Routed):
    """Fused QKV projection, optional q/k RMSNorm, RoPE, paged attention, output projection."""

    def __init__(self, cfg: ModelConfig, spec: AttentionSpec, attn: AttentionImpl,
                 norm: type[RMSNorm], dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split_sizes = (q_size, kv_size, kv_size)
        shards = (sum(self.split_sizes),) if spec.fused_checkpoint else self.split_sizes
        self.qkv_proj = Linear(cfg.hidden_size, shards, spec.qkv_bias, dtype, device)
        self.o_proj = Linear(q_size, (cfg.hidden_size,), spec.o_bias, dtype, device)
        self.qk_norm = spec.qk_norm
        q_dim, k_dim = (q_size, kv_size) if spec.qk_norm == "full" else (self.head_dim,) * 2
        self.q_norm = norm(q_dim, cfg.rms_norm_eps, dtype, device) if spec.qk_norm else None
        self.k_norm = norm(k_dim, cfg.rms_norm_eps, dtype, device) if spec.qk_norm else None
        self.rope_slot = spec.rope_slot
        # The native RoPE rotates whole heads of un-normed q/k in place: the fast path.
        self.in_place_rope = spec.qk_norm is None and spec.rotary_dim in (0, self.head_dim)
        self.attn = attn  # the model's attention backend's implementation for this layer

    def forward(self, hidden: torch.Tensor, cos_sin: CosSin, kv_layer: torch.Tensor,
                meta: Any, narrow: bool = False) -> torch.Tensor:
        """``narrow``: the output projection's product may stay bfloat16 (Linear.narrow)."""
        tokens = hidden.shape[0]
        qkv, rotated = self._project(hidden, cos_sin, narrow)
        q_size, kv_size, _ = self.split_sizes
        v = qkv[:, q_size + kv_size :].view(tokens, self.num_kv_heads, self.head_dim)
        if not self.in_place_rope:
            q, k = qkv[:, :q_size], qkv[:, q_size : q_size + kv_size]
            if self.q_norm is not None and self.k_norm is not None and self.qk_norm == "full":
                q, k = self.q_norm(q), self.k_norm(k)  # over the whole projection (OLMo 2)
            q = q.reshape(tokens, self.num_heads, self.head_dim)
            k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
            if self.q_norm is not None and self.k_norm is not None and self.qk_norm == "head":
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = rotate(q, *cos_sin), rotate(k, *cos_sin)
        else:  # RoPE on q and k heads together: half the element-wise ops per layer
            heads = self.num_heads + self.num_kv_heads
            qk = qkv[:, : q_size + kv_size].view(tokens, heads, self.head_dim)
            # In place in the projection's output (qk is a view of it), where the kernel runs.
            if not rotated and not self.routes.rope_in_place(qkv, cos_sin, heads, self.head_dim):
                qk = apply_rotary(qk, *cos_sin)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        out = self.attn.forward(q, k, v, kv_layer, meta).reshape(tokens, -1)
        return self.o_proj.narrow(out) if narrow else self.o_proj(out)

    def _project(self, hidden: torch.Tensor, cos_sin: CosSin, narrow: bool
                 ) -> tuple[torch.Tensor, bool]:
        """The q/k/v projection in float32, and whether q and k are rotated already: where
        fast's bfloat16 copy leaves the product narrow (``narrow``, the whole-head rotation),
        the native kernel widens it and rotates in one pass (routes.widen_rope), the numbers
        of widening and then rotating."""
        if not (narrow and self.in_place_rope):
            return self.qkv_proj(hidden), False
        qkv = self.qkv_proj.narrow(hidden)
        if qkv.dtype == torch.float32:
            return qkv, False
        heads = self.num_heads + self.num_kv_heads
        wide = self.routes.widen_rope(qkv, cos_sin, heads, self.head_dim)
        return (qkv.float(), False) if wide is None else (wide, True)


class GatedMLP(Routed):
    """down(act(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, cfg: ModelConfig, bias: bool, activation: str, dtype: torch.dtype,
                 device: Device, intermediate_size: int | None = None,
                 fused_checkpoint: bool = False) -> None:
        super().__init__()
        size = intermediate_size or cfg.intermediate_size
        shards = (2 * size,) if fused_checkpoint else (size, size)  # Phi-3 stores gate_up fused
        self.gate_up_proj = Linear(cfg.hidden_size, shards, bias, dtype, device)
        self.down_proj = Linear(size, (cfg.hidden_size,), bias, dtype, device)
        self.act_and_mul = gated_activation(activation, cfg.path)

    # fast on AMX-BF16 (quant/apply.py): the whole MLP in bfloat16 for many rows (packed.SwiGLU)
    wide: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.wide is not None and self.routes.runs_bf16_copy(x):
            return self.wide(x)
        return self.down_proj(self.act_and_mul(self.routes, self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(
        self,
        self_attn: DecoderAttention,
        mlp: nn.Module,
        cfg: ModelConfig,
        dtype: torch.dtype,
        device: Device,
        spec: LayerSpec = LayerSpec(),  # noqa: B008 - frozen, shared safely
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        setattr(self, spec.mlp_name, mlp)
        self.mlp_name = spec.mlp_name
        norms: list[RMSNorm | None] = []
        for name in NORM_LAYOUTS[spec.norm_layout]:
            norm = None if name is None else spec.norm(cfg.hidden_size, cfg.rms_norm_eps, dtype,
                                                       device)
            if name is not None:
                setattr(self, name, norm)  # registered under its checkpoint name
            norms.append(norm)
        self.attn_in, self.attn_out, self.mlp_in, self.mlp_out = norms
        self.pre_norm_only = spec.norm_layout == "pre" and spec.residual_multiplier is None
        self.multiplier = spec.residual_multiplier

    def forward(self, hidden: torch.Tensor, cos_sin: CosSin, kv_layer: torch.Tensor,
                meta: Any) -> torch.Tensor:
        hidden, pending = self.carry(hidden, None, cos_sin, kv_layer, meta)
        return hidden if pending is None else hidden.add_(pending)

    def carry(self, hidden: torch.Tensor, pending: torch.Tensor | None, cos_sin: CosSin,
              kv_layer: torch.Tensor, meta: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer on the residual ``hidden`` plus ``pending``, a product the layer before
        left unadded (:meth:`_narrow`): this layer's first norm adds it in its own pass
        (RMSNorm.add_and_norm), the numbers of adding it first. Returns the new residual and
        the product left for the next layer, or None."""
        if self.pre_norm_only:  # Llama and its relatives: the fewest ops
            if pending is None:
                x = self.attn_in(hidden)
            else:
                hidden, x = self.attn_in.add_and_norm(hidden, pending)
            if x.dtype == torch.bfloat16:  # fast's bfloat16 prefill copy reads these rows
                return self._narrow(hidden, x, cos_sin, kv_layer, meta)
            # Same order of additions as transformers, so float32 results agree to rounding;
            # each add in its norm's pass, the MLP's left to the next layer's first norm.
            hidden, x = self.mlp_in.add_and_norm(hidden, self.self_attn(x, cos_sin, kv_layer, meta))
            return hidden, getattr(self, self.mlp_name)(x)
        if pending is not None:  # only pre-norm layers leave one; added as forward would
            hidden = hidden + pending
        hidden = self._branch(hidden, self.self_attn(self._norm(self.attn_in, hidden), cos_sin,
                                                     kv_layer, meta), self.attn_out)
        mlp = getattr(self, self.mlp_name)
        return self._branch(hidden, mlp(self._norm(self.mlp_in, hidden)), self.mlp_out), None

    def _narrow(self, hidden: torch.Tensor, x: torch.Tensor, cos_sin: CosSin,
                kv_layer: torch.Tensor, meta: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The pre-norm layer where fast's bfloat16 copy runs its rows (quant/apply.py): the
        attention's and the MLP's products stay as oneDNN leaves them, the first added into a
        new float32 residual in the MLP norm's pass, the second left to the next layer's first
        norm (:meth:`carry`; torch widens as it adds where no norm follows): the numbers of the
        float32 path's widen-then-add, four passes fewer."""
        delta = self.self_attn(x, cos_sin, kv_layer, meta, narrow=True)
        hidden, x = self.mlp_in.add_and_norm(hidden, delta)
        mlp = getattr(self, self.mlp_name)
        wide = getattr(mlp, "wide", None)
        out = wide(x, narrow=True) if wide is not None and x.dtype == torch.bfloat16 else mlp(x)
        return hidden, out

    @staticmethod
    def _norm(norm: RMSNorm | None, x: torch.Tensor) -> torch.Tensor:
        return x if norm is None else norm(x)

    def _branch(self, residual: torch.Tensor, out: torch.Tensor, norm: RMSNorm | None
                ) -> torch.Tensor:
        out = self._norm(norm, out)
        return residual + (out if self.multiplier is None else out * self.multiplier)


class DecoderModel(nn.Module):
    """transformers' ``model.*`` submodule: embeddings, layers, final norm, rotary tables."""

    def __init__(self, layers: list[DecoderLayer], rotaries: list[nn.Module], cfg: ModelConfig,
                 norm: type[RMSNorm], dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype, device)
        self.layers = nn.ModuleList(layers)
        self.norm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.rotary = rotaries[0]
        # Further tables (Gemma 3's local layers) hold only non-persistent buffers.
        self.extra_rotaries = nn.ModuleList(rotaries[1:])

    def cos_sins(self, positions: torch.Tensor) -> list[CosSin]:
        """Looked up once per forward for all layers."""
        return [self.rotary.cos_sin(positions), *(r.cos_sin(positions) for r in self.extra_rotaries)]

"""Mixture-of-experts decoders: Mixtral (``MixtralForCausalLM``), Qwen3-MoE
(``Qwen3MoeForCausalLM``) and Qwen2-MoE (``Qwen2MoeForCausalLM``, with its shared expert).

Routing is transformers' own: float32 softmax over the router logits, ``torch.topk`` (so equal
probabilities pick the same experts in the same order), the top-k weights renormalised (always
for Mixtral, with ``norm_topk_prob`` for Qwen3-MoE). The step's rows are then grouped by expert
(one stable sort), so each expert that any row chose runs one gate/up and one down matmul over
exactly its rows, and the weighted outputs are added back expert by expert in ascending order,
as transformers' ``index_add_`` loop does (float32 sums in the same order).
"""

from __future__ import annotations

import torch
from torch import nn

from kvcli.checkpoint.config import ModelConfig
from kvcli.model.decoder import GatedMLP, LayerSpec
from kvcli.model.layers import Linear, Routed, gated_activation
from kvcli.model.llama import Device, MistralForCausalLM
from kvcli.model.qwen2 import Qwen2ForCausalLM, qwen_sliding_windows
from kvcli.model.qwen3 import Qwen3ForCausalLM


class Expert(Routed):
    """One expert's act(gate(x)) * up(x) -> down, gate and up fused into one matmul; the down
    projection keeps its checkpoint name (Mixtral's ``w2``, Qwen3-MoE's ``down_proj``)."""

    def __init__(self, cfg: ModelConfig, size: int, down_name: str, dtype: torch.dtype,
                 device: Device) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, (size, size), False, dtype, device)
        setattr(self, down_name, Linear(size, (cfg.hidden_size,), False, dtype, device))
        self.down_name = down_name
        self.act_and_mul = gated_activation(cfg.hidden_act, cfg.path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.down_name)(self.act_and_mul(self.routes, self.gate_up_proj(x)))


class SparseMoE(nn.Module):
    """Router ``gate`` [experts, hidden] and ``experts``; forward(x [T, hidden]) -> [T, hidden]."""

    def __init__(self, cfg: ModelConfig, num_experts: int, top_k: int, size: int,
                 normalize: bool, down_name: str, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.top_k, self.normalize = top_k, normalize
        self.gate = Linear(cfg.hidden_size, (num_experts,), False, dtype, device)
        self.experts = nn.ModuleList(Expert(cfg, size, down_name, dtype, device)
                                     for _ in range(num_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts), both [T, top_k], as transformers' TopKRouter."""
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.route(x)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (row, choice) pairs grouped by expert
        rows, row_weights = order // self.top_k, weights.reshape(-1)[order, None]
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        out = torch.zeros_like(x)
        start = 0
        for expert, count in zip(self.experts, counts, strict=True):
            if count:
                chosen = rows[start : start + count]
                y = expert(x.index_select(0, chosen)) * row_weights[start : start + count]
                out.index_add_(0, chosen, y)
            start += count
        return out


class SharedExpertMoE(SparseMoE):
    """Qwen2-MoE: the routed experts plus a dense ``shared_expert`` every row runs, scaled by
    sigmoid(``shared_expert_gate``(x)) and added after the routed sum (transformers' order)."""

    def __init__(self, cfg: ModelConfig, num_experts: int, top_k: int, size: int,
                 normalize: bool, shared_size: int, dtype: torch.dtype, device: Device) -> None:
        super().__init__(cfg, num_experts, top_k, size, normalize, "down_proj", dtype, device)
        self.shared_expert = GatedMLP(cfg, False, cfg.hidden_act, dtype, device, shared_size)
        self.shared_expert_gate = Linear(cfg.hidden_size, (1,), False, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return super().forward(x) + shared


def qwen_moe_layer(cfg: ModelConfig, layer: int, dtype: torch.dtype, device: Device,
                   shared: bool) -> nn.Module:
    """Dense for ``mlp_only_layers`` and off the ``decoder_sparse_step``, else the MoE block."""
    experts = num_experts(cfg)
    dense = cfg.field("mlp_only_layers", list, [])
    step = cfg.field("decoder_sparse_step", int, 1)
    if layer in dense or experts == 0 or (layer + 1) % step:
        return GatedMLP(cfg, False, cfg.hidden_act, dtype, device)
    args = (cfg, experts, cfg.field("num_experts_per_tok", int),
            cfg.field("moe_intermediate_size", int), cfg.field("norm_topk_prob", bool, False))
    if shared:
        return SharedExpertMoE(*args, cfg.field("shared_expert_intermediate_size", int), dtype,
                               device)
    return SparseMoE(*args, "down_proj", dtype, device)


def num_experts(cfg: ModelConfig) -> int:
    # Hub configs say num_experts (Qwen3-MoE) or num_local_experts; transformers 5 saves the latter.
    return cfg.field("num_local_experts", int, None) or cfg.field("num_experts", int)


class MixtralForCausalLM(MistralForCausalLM):
    packed_modules: dict[str, tuple[str, ...]] = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "gate_up_proj": ("w1", "w3"),  # each expert's gate (w1) and up (w3)
    }
    numpy_decode_equivalent = False

    def layer_spec(self, cfg: ModelConfig) -> LayerSpec:
        return LayerSpec(mlp_name="block_sparse_moe")

    def make_mlp(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, device: Device
                 ) -> nn.Module:
        return SparseMoE(cfg, num_experts(cfg), cfg.field("num_experts_per_tok", int),
                         cfg.intermediate_size, True, "w2", dtype, device)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    numpy_decode_equivalent = False

    def sliding_windows(self, cfg: ModelConfig) -> list[int | None]:
        # Qwen3MoeAttention passes config.sliding_window to every layer.
        return [cfg.field("sliding_window", int, None)] * cfg.num_layers

    def make_mlp(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, device: Device
                 ) -> nn.Module:
        return qwen_moe_layer(cfg, layer, dtype, device, shared=False)


class Qwen2MoeForCausalLM(Qwen2ForCausalLM):
    numpy_decode_equivalent = False

    def qkv_bias(self, cfg: ModelConfig) -> bool:
        return cfg.field("qkv_bias", bool, True)

    def sliding_windows(self, cfg: ModelConfig) -> list[int | None]:
        if cfg.field("layer_types", list, None) is None and cfg.field("use_sliding_window", bool,
                                                                     False):
            # Qwen2MoeConfig's own derivation: every other layer below max_window_layers.
            window, below = cfg.field("sliding_window", int), cfg.field("max_window_layers", int, 28)
            return [window if (i + 1) % 2 and i < below else None for i in range(cfg.num_layers)]
        return qwen_sliding_windows(cfg)

    def make_mlp(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, device: Device
                 ) -> nn.Module:
        return qwen_moe_layer(cfg, layer, dtype, device, shared=True)

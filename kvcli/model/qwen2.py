"""Qwen2 / Qwen2.5: the Llama decoder with biased q/k/v projections (never o) and optional
sliding-window layers (``use_sliding_window`` with ``layer_types`` or ``max_window_layers``)."""

from __future__ import annotations

from kvcli.checkpoint.config import ModelConfig, ModelConfigError
from kvcli.model.llama import LlamaForCausalLM


def qwen_sliding_windows(cfg: ModelConfig) -> list[int | None]:
    """Per-layer windows exactly as Qwen2Config/Qwen3Config derive them."""
    window = (
        cfg.field("sliding_window", int, None)
        if cfg.field("use_sliding_window", bool, False)
        else None
    )
    layer_types = cfg.field("layer_types", list, None)
    if layer_types is None:
        first_sliding = cfg.field("max_window_layers", int, 28)  # the config classes' default
        layer_types = [
            "sliding_attention" if window is not None and i >= first_sliding else "full_attention"
            for i in range(cfg.num_layers)
        ]
    if len(layer_types) != cfg.num_layers:
        raise ModelConfigError(
            f"{cfg.path}: field 'layer_types': {len(layer_types)} entries for {cfg.num_layers} layers"
        )
    return [window if kind == "sliding_attention" else None for kind in layer_types]


class Qwen2ForCausalLM(LlamaForCausalLM):
    def qkv_bias(self, cfg: ModelConfig) -> bool:
        return True

    def o_bias(self, cfg: ModelConfig) -> bool:
        return False

    def mlp_bias(self, cfg: ModelConfig) -> bool:
        return False

    def sliding_windows(self, cfg: ModelConfig) -> list[int | None]:
        return qwen_sliding_windows(cfg)

"""OLMo 2 (``Olmo2ForCausalLM``): the Llama decoder with an RMSNorm over the whole q and k
projections (not per head) before RoPE, and norms after attention and after the MLP (on the
branch output, before the residual add) instead of before them."""

from __future__ import annotations

from kvcli.checkpoint.config import ModelConfig
from kvcli.model.decoder import LayerSpec
from kvcli.model.llama import LlamaForCausalLM


class Olmo2ForCausalLM(LlamaForCausalLM):
    numpy_decode_equivalent = False

    def qk_norm(self, cfg: ModelConfig) -> str | None:
        return "full"

    def mlp_bias(self, cfg: ModelConfig) -> bool:
        return False  # Olmo2MLP's projections have no bias whatever the config says

    def layer_spec(self, cfg: ModelConfig) -> LayerSpec:
        return LayerSpec(norm_layout="post")

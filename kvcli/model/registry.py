"""Hugging Face ``architectures`` names -> kvcli model classes (imported lazily: this module is torch-free)."""

from __future__ import annotations

import importlib
from typing import Any

from kvcli.checkpoint.config import ModelConfigError

# SmolLM / SmolLM2, TinyLlama, Llama 2/3/3.x all ship as LlamaForCausalLM.
_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("kvcli.model.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("kvcli.model.llama", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("kvcli.model.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("kvcli.model.qwen3", "Qwen3ForCausalLM"),
    "GraniteForCausalLM": ("kvcli.model.granite", "GraniteForCausalLM"),
    "Olmo2ForCausalLM": ("kvcli.model.olmo2", "Olmo2ForCausalLM"),
    "Phi3ForCausalLM": ("kvcli.model.phi3", "Phi3ForCausalLM"),
    "Gemma2ForCausalLM": ("kvcli.model.gemma", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("kvcli.model.gemma", "Gemma3ForCausalLM"),
    "MixtralForCausalLM": ("kvcli.model.moe", "MixtralForCausalLM"),
    "Qwen3MoeForCausalLM": ("kvcli.model.moe", "Qwen3MoeForCausalLM"),
    "Qwen2MoeForCausalLM": ("kvcli.model.moe", "Qwen2MoeForCausalLM"),
}
# Headless checkpoints (transformers' ``*Model``: weights without the ``model.`` prefix, no
# lm_head), as embedding models ship (gte-Qwen2, e5-mistral): the same family class, built
# without an output layer. Gemma 3's text-only body is ``Gemma3TextModel``.
HEADLESS: dict[str, str] = {name.replace("ForCausalLM", "Model"): name for name in _ARCHITECTURES
                            if name != "Gemma3ForCausalLM"}
HEADLESS["Gemma3TextModel"] = "Gemma3ForCausalLM"


def is_headless(architecture: str) -> bool:
    return architecture in HEADLESS


def supported_architectures() -> list[str]:
    return sorted((*_ARCHITECTURES, *HEADLESS))


def choose_architecture(raw: dict[str, Any], path: str) -> str:
    """The first supported name in config.json's ``architectures`` list."""
    names = raw.get("architectures")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ModelConfigError(
            f"{path}: field 'architectures': expected a non-empty list of class names, got {names!r}"
        )
    for name in names:
        if name in _ARCHITECTURES or name in HEADLESS:
            return name
    raise ModelConfigError(
        f"{path}: field 'architectures': {', '.join(names)} is not supported; "
        f"supported architectures: {', '.join(supported_architectures())}"
    )


def model_class(architecture: str) -> type:
    try:
        module_name, class_name = _ARCHITECTURES[HEADLESS.get(architecture, architecture)]
    except KeyError:
        raise ModelConfigError(
            f"architecture {architecture!r} is not supported; "
            f"supported architectures: {', '.join(supported_architectures())}"
        ) from None
    return getattr(importlib.import_module(module_name), class_name)

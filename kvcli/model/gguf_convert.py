"""The one torch step of a GGUF conversion: de-quantize the tensors and save a HF checkpoint.

kvcli/checkpoint/convert.py does the rest of a conversion (staging, chat template, checksums)
torch-free and calls this through its ``write_tensors`` argument; the callers that may convert
(the engine, ``kvcli models convert``, ``kvcli audit --model``, the bench) pass this function,
or use :func:`resolve_model`, which does. torch and transformers load only when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvcli.checkpoint import resolve as _resolve
from kvcli.checkpoint.convert import ModelResolveError


def resolve_model(spec: str | None = None, **options: Any) -> Path:
    """:func:`kvcli.checkpoint.resolve.resolve_model`, converting a GGUF on first use."""
    return _resolve.resolve_model(spec, write_tensors=write_hf_checkpoint, **options)


def write_hf_checkpoint(gguf_path: Path, out: Path) -> None:
    """Write ``gguf_path`` de-quantized into ``out``: config, float32 safetensors, tokenizer."""
    # Not AutoModelForCausalLM.from_pretrained(gguf_file=...): transformers 5 demands
    # `accelerate` for it and marks the loaded model non-serializable (its GGUF
    # quantizer). Its own GGUF reader, fed a meta-device model for the tensor
    # names, gives the identical dequantized float32 weights.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError) as err:
        raise ModelResolveError(
            f"{gguf_path}: cannot read this GGUF as a transformers model: {err}"
        ) from err
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(
        str(gguf_path), return_tensors=True, model_to_load=model, torch_dtype=torch.float32
    )
    loaded = model.load_state_dict(parsed["tensors"], strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = sorted(set(loaded.missing_keys) - tied)
    if missing:
        raise ModelResolveError(f"{gguf_path}: the GGUF lacks tensors for {', '.join(missing[:5])}")
    model.tie_weights()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)

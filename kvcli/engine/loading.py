"""What an engine is loaded from: the model's weights, tokenizer and precision, and the dtype
of its KV pool (the "auto" choices made concrete once, before the engine is built)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from kvcli.engine.config import EngineConfig


@dataclass(frozen=True, slots=True)
class EngineParts:
    model: torch.nn.Module
    tokenizer: Any
    config: EngineConfig  # with --quantization auto resolved to the mode that runs
    eos_token_ids: tuple[int, ...]
    model_dir: Path


def computed_dtype(model: torch.nn.Module, config: EngineConfig) -> torch.dtype:
    """What the model computes in (float32 on the CPU whatever --dtype stores the weights in:
    model/platform.py compute_dtype): the KV cache's dtype for --kv-cache-dtype auto."""
    computed = getattr(model, "compute_dtype", None)
    if computed is not None:
        return computed
    platform = getattr(model, "platform", None)
    if platform is not None:
        return platform.kv_dtype
    return torch.float32 if config.dtype in (None, "auto") else getattr(torch, config.dtype)


def kv_dtype(model: torch.nn.Module, config: EngineConfig) -> torch.dtype:
    """The pool's element type: --kv-cache-dtype (ValueError: one no kernel reads under this
    model), auto = what the model computes in."""
    from kvcli.model.attention import kv_storage_dtype

    return kv_storage_dtype(config.kv_cache_dtype, computed_dtype(model, config))


def checkpoint_dtype(model_dir: Path) -> str | None:
    """config.json's ``torch_dtype`` (or transformers' newer ``dtype``), for --dtype auto."""
    from kvcli.checkpoint.config import load_config_json

    raw = load_config_json(Path(model_dir) / "config.json")
    value = raw.get("torch_dtype", raw.get("dtype"))
    return value if isinstance(value, str) else None


def _preset_kv_cache(model: torch.nn.Module, config: EngineConfig,
                     wanted: str | None) -> EngineConfig:
    """``config`` with --kv-cache-dtype auto made the preset's cache (fast: int8) where this
    model's attention reads one (a softcapped model's does not: it keeps its own dtype)."""
    setter = getattr(model, "set_kv_cache_dtype", None)
    if config.kv_cache_dtype != "auto" or wanted is None or setter is None:
        return config
    candidate = replace(config, kv_cache_dtype=wanted)
    try:
        setter(kv_dtype(model, candidate))
    except ValueError:  # no attention route reads that cache under this model
        return config
    return candidate


def load_parts(config: EngineConfig) -> EngineParts:
    """Resolve ``config``'s model ("auto" modes made concrete) and load its weights and
    tokenizer, at the precision the preset and the CPU decide."""
    from kvcli.checkpoint.quant_modes import resolve_mode
    from kvcli.model.gguf_convert import resolve_model
    from kvcli.model.loader import load_model, read_eos_token_ids
    from kvcli.model.native import build
    from kvcli.model.precision import resolve_precision
    from kvcli.tokenizer import Tokenizer

    if torch.device(config.device).type == "cpu":  # compiles (first use) while the model loads
        build.start()
    # "auto" becomes the mode that runs (gguf for a GGUF model, else None: float), so the
    # disk tier's fingerprint and every report name the weights actually loaded.
    requested = config.quantization
    config = replace(config, quantization=resolve_mode(config.model, config.quantization,
                                                       config.device, config.dtype,
                                                       config.precision))
    precision = resolve_precision(config.precision, config.dtype, config.device,
                                  quantization=config.quantization,
                                  may_quantize=requested == "auto")  # none: float weights
    config = replace(config, quantization=precision.quantization)  # fast may choose int8
    model_dir = Path(resolve_model(config.model, allow_pickle=config.allow_pickle,
                                   quiet=config.quiet, quantization=config.quantization))
    if config.dtype == "auto":  # the checkpoint's dtype, where it is fast here
        precision = resolve_precision(config.precision, "auto", config.device,
                                      checkpoint_dtype(model_dir), config.quantization)
    dtype = getattr(torch, precision.weights)
    # Tokenizer first: its allocations then reuse heap the loader has not yet fragmented,
    # and the loader's trim returns its scratch (RSS after load 27 MiB lower than the other
    # order; the peak of `kvcli generate` 10 MiB lower).
    tokenizer = Tokenizer.from_dir(model_dir)
    if config.chat_template is not None:
        tokenizer.set_chat_template(config.chat_template)
    if config.quantization:
        from kvcli.model.quant.load import load_quantized

        model = load_quantized(model_dir, config.quantization, dtype, config.device,
                               config.allow_pickle, precision.prefill, precision.few_rows)
    else:
        model = load_model(model_dir, dtype=dtype, device=config.device,
                           allow_pickle=config.allow_pickle)
    model.precision = precision  # what --precision / --dtype chose, for Backend.describe()
    config = _preset_kv_cache(model, config, precision.kv_cache)
    eos = read_eos_token_ids(model_dir) or tuple(tokenizer.eos_token_ids)
    return EngineParts(model, tokenizer, config, eos, model_dir)

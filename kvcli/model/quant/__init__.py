"""Quantized weights on CPU (issue 21): ``--quantization int8`` and ``--quantization gguf``.

- ``int8``: a safetensors (or converted) model is loaded in float32 and each matrix quantized
  at load, symmetric per output channel; the embedding too (it is the tied output layer).
- ``gguf``: a model that came from a GGUF file (the default model, a ``.gguf`` spec) runs the
  file's own tensors, memory-mapped, in their own types (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K;
  F16/F32 as float32); no float32 conversion is made or read: config and tokenizer come from
  the GGUF (gguf_meta.py).

Quality is measured, not asserted (docs/BENCHMARKS.md); float32 stays the default.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # this module stays torch-free: `kvcli models` imports it
    import torch
    from torch import nn

MODES = ("int8", "gguf")

__all__ = ["MODES", "QuantError", "available_modes", "gguf_source", "load_quantized"]


class QuantError(ValueError):
    """A weight that cannot be quantized or run in the requested mode."""


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file behind a model directory (a gguf-mode one, or a conversion), if it still
    exists."""
    from kvcli.model.convert import read_record
    from kvcli.model.quant.gguf_meta import linked_gguf

    linked = linked_gguf(Path(model_dir))
    if linked is not None:
        return linked
    record = read_record(Path(model_dir))
    source = Path(record.source) if record is not None else None
    return source if source is not None and source.is_file() else None


def available_modes(model_dir: Path | None, gguf_file: Path | None = None) -> list[str]:
    """What ``--quantization`` accepts for a model: int8 for any loadable model, gguf where a
    GGUF file is behind it."""
    has_gguf = gguf_file is not None or (model_dir is not None and gguf_source(model_dir))
    return ["int8", "gguf"] if has_gguf else ["int8"]


def load_quantized(model_dir: Path, mode: str, dtype: torch.dtype | None = None,
                   device: str = "cpu", allow_pickle: bool = False) -> nn.Module:
    """The model of ``model_dir`` with ``mode``'s quantized weights (CPU, float32 activations)."""
    import torch

    from kvcli.model.loader import build_model, load_model, read_model_config, release_free_heap
    from kvcli.model.quant.apply import load_gguf_model, quantize_int8_model

    if mode not in MODES:
        raise QuantError(f"--quantization: expected one of {', '.join(MODES)}, got {mode!r}")
    dtype = torch.float32 if dtype is None else dtype
    if torch.device(device).type != "cpu" or dtype != torch.float32:
        raise QuantError(f"--quantization {mode}: runs on CPU with float32 activations "
                         f"(--device cpu --dtype float32), got {device} / {dtype}")
    if mode == "int8":
        model = quantize_int8_model(load_model(model_dir, dtype, device, allow_pickle))
    else:
        source = gguf_source(model_dir)
        if source is None:
            raise QuantError(f"--quantization gguf: {model_dir} was not converted from a GGUF "
                             "file (use --model FILE.gguf or the default model, or --quantization "
                             "int8)")
        model = load_gguf_model(build_model(read_model_config(model_dir), dtype, device), source)
    release_free_heap()  # the float32 matrices (int8) or the unstacked q/k rows (gguf)
    return model.eval()

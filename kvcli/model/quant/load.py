"""Load a model with quantized weights: int8 quantized at load, or a GGUF's own tensors."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from kvcli.checkpoint.quant_modes import MODES, gguf_source
from kvcli.model.loader import build_model, load_model, read_model_config, release_free_heap
from kvcli.model.quant import QuantError
from kvcli.model.quant.apply import load_gguf_model, quantize_int8_model


def load_quantized(model_dir: Path, mode: str, dtype: torch.dtype | None = None,
                   device: str = "cpu", allow_pickle: bool = False,
                   prefill: str | None = None, few_rows: str | None = None) -> nn.Module:
    """The model of ``model_dir`` with ``mode``'s quantized weights (CPU, float32 activations);
    ``prefill`` and ``few_rows`` (Precision's): the copies the integer kernels' weights keep for
    their many-row and their batched decode matmuls."""
    if mode not in MODES:
        raise QuantError(f"--quantization: expected one of {', '.join(MODES)}, got {mode!r}")
    dtype = torch.float32 if dtype is None else dtype
    if torch.device(device).type != "cpu" or dtype != torch.float32:
        raise QuantError(f"--quantization {mode}: runs on CPU with float32 activations "
                         f"(--device cpu --dtype float32), got {device} / {dtype}")
    if mode == "int8":
        model = quantize_int8_model(load_model(model_dir, dtype, device, allow_pickle), prefill,
                                    few_rows)
    else:
        source = gguf_source(model_dir)
        if source is None:
            raise QuantError(f"--quantization {mode}: {model_dir} was not converted from a GGUF "
                             "file (use --model FILE.gguf or the default model, or --quantization "
                             "int8)")
        model = load_gguf_model(build_model(read_model_config(model_dir), dtype, device), source,
                                integer=mode == "gguf-int", prefill=prefill, few_rows=few_rows)
    release_free_heap()  # the float32 matrices (int8) or the unstacked q/k rows (gguf)
    return model.eval()

"""Where a model runs, detected once per engine: the device, the KV dtype and the CPU's kernels.

Both selectors read it: the attention backend's (kvcli/model/attention/selector.py) and the
kernel routes' (kvcli/model/routes.py), so the native kernels are looked up in one place.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

from kvcli.model import native


@dataclass(frozen=True, slots=True)
class Platform:
    device: torch.device
    # what the layers compute in (compute_dtype) and the pool holds, unless --kv-cache-dtype
    # set another (llama.py set_kv_cache_dtype; torch.uint8: the int8 cache, native_int8.py)
    kv_dtype: torch.dtype
    native: Any  # the compiled CPU kernels (ctypes.CDLL), or None: the torch routes
    isa: str  # what they were built for ("avx512", "avx2+fma"; KVCLI_NATIVE_ISA), "" without
    weights: torch.dtype = torch.float32  # the matmul weights' (--dtype; model/precision.py)

    @property
    def cpu(self) -> bool:
        return self.device.type == "cpu"


def detect_platform(device: torch.device | str, kv_dtype: torch.dtype,
                    weights: torch.dtype | None = None) -> Platform:
    """The platform of a model on ``device`` with a ``kv_dtype`` cache and ``weights``
    (default: kv_dtype). The native kernels (float32 only) are loaded for a CPU float32 model;
    KVCLI_NATIVE=0, KVCLI_NATIVE_ISA and a missing compiler are honoured by ``native.load()``."""
    device = torch.device(device)
    lib = native.load() if device.type == "cpu" and kv_dtype == torch.float32 else None
    return Platform(device, kv_dtype, lib, kernel_isa(lib) if lib is not None else "",
                    kv_dtype if weights is None else weights)


def compute_dtype(device: torch.device | str, dtype: torch.dtype) -> torch.dtype:
    """What a model whose weights are ``dtype`` computes in: float32 on the CPU, where only the
    matmuls take bfloat16/float16 weights (with float32 sums; routes.py), so norms, RoPE,
    attention, sampling and the KV cache keep float32 and the native kernels; ``dtype``
    elsewhere (a CUDA model runs wholly in it)."""
    return torch.float32 if torch.device(device).type == "cpu" else dtype


def kernel_isa(lib: ctypes.CDLL) -> str:
    """The instruction set the loaded kernels were compiled for (pool.c's ``kvcli_isa``)."""
    fn = lib.kvcli_isa
    fn.restype = ctypes.c_char_p
    return fn().decode()

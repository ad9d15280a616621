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
    kv_dtype: torch.dtype  # the pool's element type; torch.uint8: the int8 cache (native_int8.py)
    native: Any  # the compiled CPU kernels (ctypes.CDLL), or None: the torch routes
    isa: str  # what they were built for ("avx512", "avx2+fma"; KVCLI_NATIVE_ISA), "" without

    @property
    def cpu(self) -> bool:
        return self.device.type == "cpu"


def detect_platform(device: torch.device | str, dtype: torch.dtype,
                    kv_dtype: torch.dtype | None = None) -> Platform:
    """The platform of a ``dtype`` model on ``device`` with a ``kv_dtype`` cache (default: the
    model's dtype). The native kernels (float32 math only) are loaded for a CPU float32 model;
    KVCLI_NATIVE=0, KVCLI_NATIVE_ISA and a missing compiler are honoured by ``native.load()``."""
    device = torch.device(device)
    lib = native.load() if device.type == "cpu" and dtype == torch.float32 else None
    return Platform(device, dtype if kv_dtype is None else kv_dtype, lib,
                    kernel_isa(lib) if lib is not None else "")


def kernel_isa(lib: ctypes.CDLL) -> str:
    """The instruction set the loaded kernels were compiled for (pool.c's ``kvcli_isa``)."""
    fn = lib.kvcli_isa
    fn.restype = ctypes.c_char_p
    return fn().decode()

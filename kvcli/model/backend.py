"""The execution backend of a model: chosen once, by the model runner, and reported.

A forward can take several routes (native C kernels, torch ops, the fused NumPy batch-1 path),
and before this module each place chose for itself. :func:`select_backend` makes the choice
once per engine from the device, the KV dtype and whether the native kernels could be built,
and :class:`Backend` names what runs in each phase so ``kvcli generate --stats`` and the bench
JSON say which code produced a number (the CPU kind of a machine varies between sessions, see
docs/BENCHMARKS.md). The routes themselves are unchanged: the attention and matmul code reads
``Backend.native``, the one handle of the compiled kernels (``native.load()`` is cached).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

from kvcli.model import native


@dataclass(frozen=True, slots=True)
class Backend:
    name: str  # "native-cpu" | "torch-cpu" | "cuda" | another torch device type
    native: ctypes.CDLL | None  # the compiled kernels; None: the torch routes
    isa: str  # what the native kernels were built for ("avx512", "avx2+fma"; KVCLI_NATIVE_ISA)
    decode_attention: str
    prefill_attention: str
    batch1_decode: str
    matmul: str
    elementwise: str

    def describe(self) -> dict[str, str]:
        """What runs where, for ``--stats`` and the bench JSON."""
        return {"name": self.name, "isa": self.isa, "decode_attention": self.decode_attention,
                "prefill_attention": self.prefill_attention, "batch1_decode": self.batch1_decode,
                "matmul": self.matmul, "elementwise": self.elementwise}


def select_backend(model: Any, kv_cache: torch.Tensor, device: torch.device) -> Backend:
    """The backend for ``model`` over ``kv_cache`` on ``device`` (made once per engine)."""
    cpu = device.type == "cpu"
    lib = native.load() if cpu and kv_cache.dtype == torch.float32 else None
    decoder = getattr(model, "_numpy_decoder", None)
    batch1 = "as batched" if decoder is None else "numpy fused" + (
        ", OpenBLAS threads adapt to load" if decoder.threads is not None else "")
    if not cpu:
        return Backend(device.type, None, "", "torch batched + cascade",
                       "torch SDPA per sequence", "torch", "torch", "torch")
    from kvcli.model import large_gemm
    from kvcli.model.layers import NATIVE_GEMM_MAX_ROWS, NUMPY_MAX_ROWS

    numpy_rows = f"<= {NUMPY_MAX_ROWS} rows numpy (OpenBLAS)" if NUMPY_MAX_ROWS else ""
    few = (f"{NUMPY_MAX_ROWS + 1}-{NATIVE_GEMM_MAX_ROWS} native gemm"
           if lib is not None and NATIVE_GEMM_MAX_ROWS > NUMPY_MAX_ROWS else "")
    larger = "more torch " + {"mkl": "MKL", "onednn": "oneDNN"}[large_gemm.library()]
    matmul = ", ".join(p for p in (numpy_rows, few, larger) if p)
    return Backend(
        name="native-cpu" if lib is not None else "torch-cpu",
        native=lib,
        isa=kernel_isa(lib) if lib is not None else "",
        decode_attention="native paged" if lib is not None else "torch batched + cascade",
        prefill_attention="native paged" if lib is not None
        else "torch SDPA per sequence + prefix cascade",
        batch1_decode=batch1,
        matmul=matmul,
        elementwise="native" if lib is not None else "torch",
    )


def kernel_isa(lib: ctypes.CDLL) -> str:
    """The instruction set the loaded kernels were compiled for (pool.c's ``kvcli_isa``)."""
    fn = lib.kvcli_isa
    fn.restype = ctypes.c_char_p
    return fn().decode()

"""fast's int8 copy of a matrix for matmuls of a few rows on AMX (native/w8a8.c): int8 weights
per output channel, activations rounded to int8 per 64 values, products on AMX-INT8 tiles.

Under ``--precision fast`` on a CPU with AMX a batched decode step's matmuls (``W8A8_ROWS`` rows
up to the bfloat16 copy's ``BF16_PREFILL_ROWS``) run this copy instead of the GGUF's own blocks:
one scale per channel leaves a quarter of the integer kernel's float work per product
(native/w8a8.c). Fewer rows keep the GGUF blocks (half the bytes, which decide there), many-row
calls the bfloat16 copy (oneDNN). ``KVCLI_W8A8=0`` leaves the copy out (benchmarks, tests).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache

import torch

from kvcli.model import native

# Fewest rows that run the copy: where its twice the bytes stop costing more than the blocks'
# folding saves. Measured on a Xeon with AMX (2 threads, SmolLM2-135M's 120 matmuls of a step
# from Python after a 256 MB flush; ms, copy vs the GGUF's Q4_1 blocks): 2 rows 11.9-12.1 vs
# 8.2-8.6; 4 rows 11.7-12.2 vs 9.3-9.8; 8 rows 12.2-12.8 vs 10.9-13.2; 12 rows 12.1 vs
# 12.1-12.7; 16 rows 12.7-13.1 vs 14.9-15.1; 32 rows 13.9-14.2 vs 18.7-19.9
# (docs/BENCHMARKS.md, 2026-12-07).
W8A8_ROWS = 12
_P, _I64 = ctypes.c_void_p, ctypes.c_int64


@cache
def _lib() -> ctypes.CDLL | None:
    """The kernels with w8a8.c's entry points typed, where the CPU and the build run them."""
    lib = native.load()
    if not native.w8a8_available(lib):
        return None
    lib.kvcli_w8a8_bytes.argtypes, lib.kvcli_w8a8_bytes.restype = [_I64, _I64], _I64
    lib.kvcli_w8a8_pack.argtypes, lib.kvcli_w8a8_pack.restype = [_P, _P, _P, _I64, _I64], None
    lib.kvcli_w8a8_gemm.argtypes = [_P, _P, _P, _P, _P, *[_I64] * 4]
    lib.kvcli_w8a8_gemm.restype = ctypes.c_int
    return lib


@dataclass(eq=False)
class W8Weight:
    """An ``[out, in]`` matrix as native/w8a8.c's packed int8 tiles and channel scales."""

    packed: torch.Tensor  # int8, kvcli_w8a8_bytes(out, in)
    scales: torch.Tensor  # float32 [out]
    shape: tuple[int, int]

    @classmethod
    def of(cls, weight: torch.Tensor) -> W8Weight:
        """``weight``'s values (any float dtype) rounded to 8 bits per channel."""
        lib = _lib()
        if lib is None:
            raise RuntimeError("int8 matmul copy: this CPU or build has no AMX-INT8 kernel")
        out_features, in_features = (int(n) for n in weight.shape)
        plain = weight.detach().float().contiguous()
        packed = torch.empty(lib.kvcli_w8a8_bytes(out_features, in_features), dtype=torch.int8)
        scales = torch.empty(out_features, dtype=torch.float32)
        lib.kvcli_w8a8_pack(plain.data_ptr(), packed.data_ptr(), scales.data_ptr(),
                            out_features, in_features)
        return cls(packed, scales, (out_features, in_features))

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + 4 * self.scales.numel()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W^T (+ bias)`` in float32 for ``x`` ``[..., in]``."""
        lead, (out_features, in_features) = x.shape[:-1], self.shape
        x2 = x.reshape(-1, in_features).float().contiguous()
        y = x2.new_empty((x2.shape[0], out_features))
        b = None if bias is None else bias.float().contiguous()
        status = _lib().kvcli_w8a8_gemm(x2.data_ptr(), self.packed.data_ptr(),
                                        self.scales.data_ptr(), None if b is None else b.data_ptr(),
                                        y.data_ptr(), x2.shape[0], out_features, in_features,
                                        native.num_threads())
        if status:
            raise MemoryError("int8 matmul copy: out of memory for the quantized activations")
        return y.reshape(*lead, out_features)

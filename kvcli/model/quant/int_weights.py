"""Integer-activation matmuls (qint.c): ``--quantization gguf-int``'s GGUF weights and
``--quantization int8``'s per-channel int8 ones, repacked for them.

Each Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K / Q6_K / int8 matrix is repacked once at load into the
kernel's interleaved layout (16 output channels per 32-value tile, a k-quant's sub-block with
float32 scales; native/qint_pack.c); every matmul, whatever its row count (decode-1, batched
decode, prefill), quantizes its activations to int8 per 32 values and sums in integer arithmetic
with the instruction-set variant the model's routes chose (``KernelRoutes.int_matmul``). Only
the embedding keeps its GGUF bytes too, for its row look-ups; the other source matrices are
dropped (they are views of the memory-mapped file, so nothing is copied for them).

Under ``--precision fast`` on a CPU with AMX-BF16 each Linear's matrix also keeps a bfloat16
copy of its own values (model/packed.py, oneDNN's layout), which its matmuls of
``BF16_PREFILL_ROWS`` rows or more run instead: AMX-BF16 tiles sum over the whole K with no
per-block folding, where AMX-INT8's sums must be scaled and added per 32-value block. Where
the CPU has AMX-INT8 it also keeps an int8 copy per output channel (quant/w8a8.py), which its
matmuls of ``w8a8_rows`` rows up to that (batched decode steps) run. On AVX512-VNNI without
AMX, a GGUF's matrices keep an int8 copy per output channel for their matmuls of
``I8_PREFILL_ROWS`` rows or more, on these same kernels: its fold is one multiply-add a block
where Q4_1's is three, and the copy's twice the bytes only pay where rows are many.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvcli.model import native
from kvcli.model.packed import PREFILL_ROWS_HINT, PackedWeight
from kvcli.model.quant import QuantError
from kvcli.model.quant.w8a8 import W8Weight
from kvcli.model.quant.weights import (
    I8,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_0,
    QuantWeight,
    _AsArray,
    quantize_int8,
)
from kvcli.model.routes import KernelRoutes

# Row count from which fast's bfloat16 copy runs (Xeon with AMX, one SmolLM2-135M layer's four
# matmuls, 2 threads, ms integer vs bf16: 64 rows 0.71 vs 0.84; 80 rows 1.01 vs 0.74; 128 rows
# 1.9-2.1 vs 1.0-1.3; 1,024 rows 11.3-12.9 vs 6.9-7.5; docs/BENCHMARKS.md, 2026-12-06 late
# night).
BF16_PREFILL_ROWS = 80
# Row count from which fast's int8 prefill copy runs (Zen 4, all 30 SmolLM2-135M layers' matmuls
# in turn, Q4_1 blocks' time / the copy's: 1 row 0.84, 8 0.94, 32 0.76, 64 1.05, 128 1.06, 512
# 1.11; docs/BENCHMARKS.md, 2026-12-07 tenth session): above every batched decode step.
I8_PREFILL_ROWS = 80
INT_TYPES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K",
             I8: "int8"}


@dataclass(eq=False)
class IntWeight(_AsArray):
    """``[out, in]`` weights in qint.c's packed layout (uint8, padded to 16 channels)."""

    kind: int
    packed: torch.Tensor
    shape: tuple[int, int]
    variant: int  # qint.c's index of the routes' variant (native.QINT_VARIANTS)
    source: QuantWeight | None = None  # kept for row look-ups (the embedding) only
    routes: KernelRoutes | None = field(default=None, repr=False)
    wide: PackedWeight | None = field(default=None, repr=False)  # fast's bf16 copy (AMX)
    few: W8Weight | None = field(default=None, repr=False)  # fast's int8 copy (AMX-INT8)
    i8: IntWeight | None = field(default=None, repr=False)  # fast's int8 prefill copy (VNNI)

    dtype = torch.float32
    device = torch.device("cpu")

    @property
    def nbytes(self) -> int:
        wide = 0 if self.wide is None else 2 * self.shape[0] * self.shape[1]
        few = 0 if self.few is None else self.few.nbytes
        source = 0 if self.source is None else self.source.nbytes
        i8 = 0 if self.i8 is None else self.i8.nbytes
        return self.packed.numel() + wide + few + source + i8

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None,
               routes: KernelRoutes | None = None) -> torch.Tensor:
        """``x @ W^T (+ bias)`` for float32 ``x`` of shape ``[..., in]``, every row count."""
        routes = routes or self.routes
        lead, (out_features, in_features) = x.shape[:-1], self.shape
        rows = x.numel() // max(1, in_features)
        if self.wide is not None and routes.bf16_copy_rows(rows):
            return self.wide.linear(x, bias)
        if self.few is not None and routes.w8a8_copy_rows(rows):
            return self.few.linear(x, bias)
        if self.i8 is not None and routes.i8_copy_rows(rows):
            return self.i8.linear(x, bias, routes)
        lib = routes.native  # type: ignore[union-attr]
        x2 = x.reshape(-1, in_features).float().contiguous()
        y = x2.new_empty((x2.shape[0], out_features))
        b = None if bias is None else bias.float().contiguous()
        status = lib.kvcli_qint_gemm(self.variant, self.kind, x2.data_ptr(), self.packed.data_ptr(),
                                     None if b is None else b.data_ptr(), y.data_ptr(),
                                     x2.shape[0], out_features, in_features, native.num_threads())
        if status == -2:
            raise MemoryError("integer matmul: out of memory for the quantized activations")
        if status:
            raise QuantError(f"integer matmul: kernel refused {INT_TYPES[self.kind]} {self.shape}")
        return y.reshape(*lead, out_features)

    def dequantize(self, rows: torch.Tensor | None = None,
                   routes: KernelRoutes | None = None) -> torch.Tensor:
        """Rows of the de-quantized matrix (the embedding's look-ups), from the GGUF bytes."""
        if self.source is None:
            raise QuantError("gguf-int: this matrix keeps only its packed form")
        return self.source.dequantize(rows, routes or self.routes)


def pack(weight: QuantWeight, routes: KernelRoutes, keep_source: bool = False,
         wide: torch.Tensor | None = None, few: torch.Tensor | None = None) -> IntWeight:
    """``weight`` repacked for the integer kernel of ``routes`` (its ``int_matmul`` variant);
    ``wide`` / ``few``: its float values (the float checkpoint's, or de-quantized), kept as a
    copy for ``routes``' many-row calls (bfloat16, or int8 per channel on these kernels where
    ``routes.i8_prefill_rows``) / an int8 one for its few-row calls."""
    if weight.kind not in INT_TYPES:
        runs = ", ".join(name for kind, name in INT_TYPES.items() if kind != I8)
        raise QuantError(f"--quantization gguf-int runs {runs} weights; this model has GGML "
                         f"type {weight.kind} (use --quantization gguf)")
    lib = routes.native
    if lib is None or not routes.int_matmul:
        raise QuantError("--quantization gguf-int needs the native kernels (a C compiler, "
                         "KVCLI_NATIVE not 0) on an x86 CPU with AVX2")
    out_features, in_features = weight.shape
    size = lib.kvcli_qint_packed_bytes(weight.kind, out_features, in_features)
    packed = torch.empty(size, dtype=torch.uint8)
    scale = None if weight.scale is None else weight.scale.float().contiguous()
    if lib.kvcli_qint_pack(weight.kind, weight.data.data_ptr(),
                           None if scale is None else scale.data_ptr(), packed.data_ptr(),
                           out_features, in_features):
        raise QuantError(f"gguf-int: cannot repack {INT_TYPES[weight.kind]} {weight.shape}")
    variant = native.QINT_VARIANTS[routes.int_matmul][0]
    copy = None
    if wide is not None and routes.bf16_prefill_rows:
        copy = PackedWeight.of(wide.to(torch.bfloat16), PREFILL_ROWS_HINT)
    few_copy = W8Weight.of(few) if few is not None and routes.w8a8_rows else None
    i8 = None
    if wide is not None and routes.i8_prefill_rows and weight.kind != I8:
        i8 = pack(quantize_int8(wide), routes)
    return IntWeight(weight.kind, packed, weight.shape, variant,
                     weight if keep_source else None, routes, copy, few_copy, i8)

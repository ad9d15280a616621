"""bfloat16/float16 matmul weights laid out once at load for the kernel that multiplies them
(--dtype on CPU): :func:`pack_narrow_weights` turns each Linear's weight into a
:class:`PackedWeight` (the plain matrix is freed: one copy of the weights), and a tied output
layer gets a packed copy of the embedding (the embedding itself stays plain for the lookup).

Two kernels, chosen by precision.bf16_kernel from the CPU's flags:

* ``avx512-bf16`` (bfloat16 weights where /proc/cpuinfo has ``avx512_bf16`` and the kernels
  are built: native/bf16_gemm.c): ``vdpbf16ps`` on weights in pairs of k, every row count.
  On AMD Zen 4 (AVX512_BF16, no AMX) oneDNN's bf16 GEMM costs ~100-400 us per call whatever
  its size, which is most of a decode step's 121 matmuls (docs/BENCHMARKS.md).
* ``onednn``: oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``); given a
  plain ``[out, in]`` matrix oneDNN re-lays it out on every call. Float16, CPUs with AMX-BF16
  but not AVX512_BF16's kernel built, and ``KVCLI_BF16_GEMM=onednn``. Measured on a Xeon with
  AMX-BF16, one thread, CPU time of SmolLM2-135M's 121 matmuls of one step: 1 row 33 ms
  packed vs 47 plain vs 57 float32; 32 rows 50-53 vs 57 vs 119; 1,024 rows equal within noise.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import torch
from torch import nn

from kvcli.model import native
from kvcli.model.layers import Linear
from kvcli.model.precision import bf16_kernel

ROWS_HINT = 32  # the row count oneDNN chooses the blocked layout for (1 and 1,024 within 10%)
# The layout of a copy only prefill runs (fast's, quant/int_weights.py). Measured on a Xeon with
# AMX (2 threads, SmolLM2-135M's shapes): the layout oneDNN picks for 1 row multiplies 1,024 rows
# of the QKV projection in 0.57 ms vs 0.98-1.13 for 32's or 1,024's, the down projection in
# 1.02-1.05 vs 1.71-1.79 (512 rows: 0.55 vs 0.84), and every other shape within noise; 1,024's
# left a core idle (a prefill: cores busy 84% vs 95%).
PREFILL_ROWS_HINT = 1
_P = ctypes.c_void_p


@cache
def _lib() -> ctypes.CDLL | None:
    """The kernels with bf16_gemm.c's entry points typed, where the build has them."""
    lib = native.load()
    if lib is None or not lib.kvcli_bf16_gemm_available():
        return None
    lib.kvcli_bf16_gemm.argtypes = [_P, _P, _P, _P, *[ctypes.c_int64] * 4]
    lib.kvcli_bf16_gemm.restype = ctypes.c_int
    lib.kvcli_bf16_pack.argtypes = [_P, _P, *[ctypes.c_int64] * 2]
    lib.kvcli_bf16_pack.restype = None
    return lib


@dataclass(eq=False)
class PackedWeight:
    """An ``[out, in]`` weight in a kernel's layout; computes in float32 out."""

    packed: torch.Tensor  # avx512-bf16: int16 [N / 16 * K / 2 * 32]; onednn: an opaque tensor
    shape: tuple[int, int]
    dtype: torch.dtype  # bfloat16 or float16: what x is rounded to
    kernel: str = "onednn"

    device = torch.device("cpu")

    @classmethod
    def of(cls, weight: torch.Tensor, rows_hint: int = ROWS_HINT) -> PackedWeight:
        """``weight`` laid out for its kernel; ``rows_hint``: the row count oneDNN's layout is
        chosen for (a prefill-only copy: PREFILL_ROWS_HINT)."""
        out_features, in_features = (int(n) for n in weight.shape)
        if weight.dtype == torch.bfloat16 and bf16_kernel() == "avx512-bf16":
            size = (out_features + 15) // 16 * ((in_features + 1) // 2) * 32
            packed, plain = torch.empty(size, dtype=torch.int16), weight.contiguous()
            _lib().kvcli_bf16_pack(plain.data_ptr(), packed.data_ptr(), out_features,
                                   in_features)  # plain held: a copy where weight is a view
            return cls(packed, (out_features, in_features), weight.dtype, "avx512-bf16")
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), rows_hint)
        return cls(packed, (out_features, in_features), weight.dtype)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None, routes: object = None
               ) -> torch.Tensor:
        """``x @ W^T (+ bias)`` in float32 for a float32 ``x`` ``[..., in]`` (routes.py's
        contract for weights that are not tensors; the routes are not needed here)."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.shape[1])
        if self.kernel == "avx512-bf16":
            y = self._native(x2.float().contiguous(), bias)
        else:
            y = self._onednn(x2, bias)
        return y.reshape(*lead, self.shape[0])

    def narrow_linear(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W^T`` left in the weights' dtype where oneDNN computes it (its own rounding of
        the float32 sums), for a caller that adds it into float32 rows itself; else float32."""
        if self.kernel != "onednn":
            return self.linear(x, None)
        lead = x.shape[:-1]
        return self._onednn_narrow(x.reshape(-1, self.shape[1])).reshape(*lead, self.shape[0])

    def _onednn_narrow(self, x: torch.Tensor) -> torch.Tensor:
        # torch's conversions at oneDNN's ends: native ones (AVX512_BF16) were 4-33% slower
        # for one layer's matmuls on a Xeon with AMX, handing off between thread pools.
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed, None, "none", [],
                                                  "")

    def _onednn(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = self._onednn_narrow(x).float()
        return y if bias is None else y.add_(bias)

    def _native(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = x.new_empty((x.shape[0], self.shape[0]))
        bias = None if bias is None else bias.float().contiguous()
        status = _lib().kvcli_bf16_gemm(x.data_ptr(), self.packed.data_ptr(),
                                        None if bias is None else bias.data_ptr(), y.data_ptr(),
                                        x.shape[0], *self.shape, native.num_threads())
        if status:
            raise MemoryError("bf16 gemm: out of memory for the rounded rows")
        return y

    def dense(self) -> torch.Tensor:
        """The plain ``[out, in]`` matrix (tests, inspection)."""
        if self.kernel == "onednn":
            return self.packed.to_dense()
        out_features, in_features = self.shape
        pairs = (in_features + 1) // 2
        blocks = self.packed.numpy().reshape(-1, pairs, 16, 2).transpose(0, 2, 1, 3)
        plain = np.ascontiguousarray(blocks).reshape(-1, 2 * pairs)[:out_features, :in_features]
        return torch.from_numpy(np.ascontiguousarray(plain)).view(torch.bfloat16)


@dataclass(eq=False)
class SwiGLU:
    """down(silu(gate(x)) * up(x)) for many float32 rows in bfloat16 (fast's prefill on AMX-BF16).
    Where native.swiglu_amx_available, gate, up and SiLU run as one native pass on the tiles
    (swiglu_amx.c: one SmolLM2-135M MLP front, 1,024 rows, 2 threads, docs/BENCHMARKS.md);
    else as two oneDNN calls whose silu and product run as post-ops on the float32 sums (1,024
    rows 6.7 ms vs 8.5 for the fused gate/up projection widened to float32, the native
    silu-and-mul and the down projection; 128 rows 0.9 vs 1.25). The down projection is oneDNN's."""

    gate: torch.Tensor  # [intermediate, hidden] bfloat16: oneDNN-packed, or swiglu_amx.c's tiles
    up: torch.Tensor
    down: torch.Tensor  # oneDNN-packed [hidden, intermediate]
    hidden: int
    size: int = 0  # the intermediate size
    tiles: bool = False  # gate and up laid out for swiglu_amx.c
    lib: ctypes.CDLL | None = field(default=None, repr=False)  # the kernels (tiles)

    @classmethod
    def of(cls, gate_up: torch.Tensor, down: torch.Tensor) -> SwiGLU:
        """From the float ``[2 * intermediate, hidden]`` fused projection and ``down``."""
        size, hidden = gate_up.shape[0] // 2, gate_up.shape[1]
        lib = native.load()
        tiles = hidden % 32 == 0 and native.swiglu_amx_available(lib)

        def packed(w: torch.Tensor, tiled: bool = False) -> torch.Tensor:
            w = w.to(torch.bfloat16).contiguous()
            if not tiled:
                return torch.ops.mkldnn._reorder_linear_weight(w, PREFILL_ROWS_HINT)
            out = torch.empty(lib.kvcli_swiglu_packed_size(*w.shape), dtype=torch.int16)
            lib.kvcli_swiglu_pack(w.data_ptr(), out.data_ptr(), *w.shape)
            return out

        return cls(packed(gate_up[:size], tiles), packed(gate_up[size:], tiles), packed(down),
                   hidden, size, tiles, lib if tiles else None)

    def __call__(self, x: torch.Tensor, narrow: bool = False) -> torch.Tensor:
        """The MLP's output in float32, or as oneDNN leaves it (bfloat16) with ``narrow``."""
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.hidden).to(torch.bfloat16)
        if self.tiles:
            both = self._front(rows.contiguous())
        else:
            gate = torch.ops.mkldnn._linear_pointwise(rows, self.gate, None, "swish", [], "")
            both = torch.ops.mkldnn._linear_pointwise.binary(rows, gate, self.up, None, "mul")
        y = torch.ops.mkldnn._linear_pointwise(both, self.down, None, "none", [], "")
        return (y if narrow else y.float()).reshape(*lead, self.hidden)

    def _front(self, rows: torch.Tensor) -> torch.Tensor:
        """silu(gate(rows)) * up(rows) in bfloat16 from swiglu_amx.c."""
        out = rows.new_empty((rows.shape[0], self.size))
        status = self.lib.kvcli_swiglu_bf16(rows.data_ptr(), self.gate.data_ptr(),
                                                 self.up.data_ptr(), out.data_ptr(),
                                                 rows.shape[0], self.size, self.hidden,
                                                 native.num_threads())
        if status:
            raise MemoryError("swiglu: out of memory for the padded rows")
        return out


def can_pack(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` weights are packed for a kernel on this CPU."""
    if dtype == torch.bfloat16 and bf16_kernel() == "avx512-bf16":
        return True
    return (dtype in (torch.bfloat16, torch.float16) and torch.backends.mkldnn.is_available()
            and (dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()))


@torch.no_grad()
def pack_narrow_weights(model: nn.Module) -> None:
    """Every bfloat16/float16 Linear weight of a loaded CPU ``model`` to a PackedWeight, and a
    packed output layer for a tied embedding (``model.logits_weight``)."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, Linear) and isinstance(weight, torch.Tensor) and can_pack(weight.dtype):
            del module.weight  # the plain matrix is freed with its Parameter
            module.weight = PackedWeight.of(weight)
    embed = model.model.embed_tokens.weight
    if getattr(model, "lm_head", None) is None and can_pack(embed.dtype):
        model.logits_weight = PackedWeight.of(embed)

"""The kernel routes of a model: which code runs each matmul, norm, activation and RoPE.

Chosen once per model (:func:`select_routes`, from the platform and the environment) into one
:class:`KernelRoutes` that the layers hold and call directly; ``--stats`` and the bench print
its :meth:`KernelRoutes.describe`. Per call only what depends on the call is left: a matmul's
row count, and whether the tensor is one the kernels take (CPU, float32, contiguous).

CPU float32 matmuls route by row count: up to ``numpy_max_rows`` through NumPy's OpenBLAS, up to
``native_gemm_max_rows`` through kvcli's own kernels (native/gemm.c on an ``[in, out]`` buffer,
native/gemm_nt.c on an ``[out, in]`` one: a tied embedding as the LM head), the rest through the
large GEMM library (large_gemm.py: MKL or oneDNN). Measured in place (whole decode steps of
SmolLM2-135M, 2 cores, Xeon with AVX-512; ms per step, docs/BENCHMARKS.md): 2 rows 52.7 native /
67.6 torch / 107.7 OpenBLAS; 4 rows 57 / 80 / 107-114; 32 rows 116-124 / 129-136 (torch). One
row: 20 ms OpenBLAS vs 34 torch on an AMD EPYC; 1,024 rows 723 torch vs 772 OpenBLAS. The pools
coexist because OpenMP threads sleep when idle, OpenBLAS threads stop spinning after ~0.3 ms
(kvcli/__init__.py) and kvcli's after at most 0.3 ms (native/pool.c).
Environment overrides (read at selection): KVCLI_NUMPY_MAX_ROWS, KVCLI_GEMM_MAX_ROWS,
KVCLI_QGEMM_MAX_ROWS, KVCLI_LARGE_GEMM; KVCLI_NATIVE=0 / KVCLI_NATIVE_ISA via native.load().
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from kvcli.model import large_gemm, native, precision
from kvcli.model.platform import Platform, detect_platform

Activation = Callable[[torch.Tensor], torch.Tensor]


def _takes(x: torch.Tensor) -> bool:
    """Whether the native kernels can work on ``x``: contiguous CPU float32."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous()


NARROW = (torch.bfloat16, torch.float16)  # weight dtypes --dtype stores (model/precision.py)
_NARROW_KERNELS = {"avx512-bf16": "the native AVX512_BF16 kernel", "onednn": "torch's oneDNN"}


def narrow_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
    """A float32 ``x`` times plain bfloat16/float16 weights, in float32: ``x`` rounded to the
    weights' dtype and multiplied by oneDNN (AMX or AVX512_BF16 tiles, float32 sums), the
    product returned in float32 plus a float32 bias. A loaded model's weights are pre-packed
    instead (model/packed.py); this serves weights that are not (a model built directly)."""
    y = F.linear(x.to(weight.dtype), weight).float()
    if bias is not None:
        y += bias
    return y


@dataclass(frozen=True, slots=True)
class KernelRoutes:
    native: ctypes.CDLL | None  # the compiled kernels; None: the torch routes
    numpy_max_rows: int
    native_gemm_max_rows: int
    qgemm_max_rows: int  # quantized matmuls up to this many rows run in registers (qgemm.c)
    large_gemm: str  # "mkl" | "onednn": float32 matmuls past the native kernel's rows
    weights: torch.dtype = torch.float32  # the model's matmul weights (Platform.weights)
    # --quantization gguf-int / int8: the integer matmul variant its weights run
    # (native.qint_variant, chosen once per model when they are packed); "" for other models.
    int_matmul: str = ""
    # fast on AMX-BF16 (Precision.prefill): integer-kernel matmuls of at least this many rows
    # run their weights' bfloat16 copy through oneDNN (quant/int_weights.py); 0: never.
    bf16_prefill_rows: int = 0
    # fast on AMX-INT8 (Precision.few_rows): integer-kernel matmuls of at least this many rows
    # (and below bf16_prefill_rows) run their weights' int8 copy (quant/w8a8.py); 0: never.
    w8a8_rows: int = 0
    # fast on AVX512-VNNI without AMX (Precision.prefill "int8"): integer-kernel matmuls of at
    # least this many rows run an int8-per-channel copy of their GGUF blocks on the same
    # kernels (one multiply-add a block where Q4_1 folds three; quant/int_weights.py); 0: never.
    i8_prefill_rows: int = 0
    # Every matmul of the model runs the native kernels (quant/apply.py): its forwards run on
    # kvcli's own pool, torch's ops on one thread (native.own_pool).
    own_pool: bool = False

    def forward_threads(self) -> AbstractContextManager[None]:
        """The threads a forward of the model runs on (``with routes.forward_threads():``):
        native.own_pool where :attr:`own_pool`, else torch's team as set."""
        return native.own_pool(self.native) if self.own_pool and self.native else nullcontext()

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
               ) -> torch.Tensor:
        """Every matmul of every model: ``x @ weight^T (+ bias)``, ``weight`` ``[out, in]``
        (often a transposed view of an ``[in, out]`` buffer, which OpenBLAS and the native
        kernel stream fastest; layers.use_input_major_layout)."""
        if not isinstance(weight, torch.Tensor):  # a quantized weight (kvcli/model/quant)
            return weight.linear(x, bias, self)
        if not (x.device.type == "cpu" and x.dtype == torch.float32
                and weight.dtype == torch.float32):
            if x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype in NARROW:
                return narrow_linear(x, weight, bias)
            return F.linear(x, weight, bias)
        rows = x.shape[0] if x.dim() == 2 else self.native_gemm_max_rows + 1
        if rows <= self.numpy_max_rows:
            y = torch.from_numpy(np.matmul(x.numpy(), weight.numpy().T))
            if bias is not None:
                y += bias
            return y
        in_out = weight.t()
        if self.native_gemm_takes(rows) and x.is_contiguous():
            if in_out.is_contiguous():
                return native.gemm(self.native, x, in_out, bias)
            if weight.is_contiguous():  # [out, in]: a tied embedding as the LM head
                y = native.gemm_nt(self.native, x, weight)
                return y if bias is None else y.add_(bias)
        return self.large_linear(x, weight, bias)

    def large_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                     ) -> torch.Tensor:
        """``F.linear`` through the large GEMM library (``weight`` ``[out, in]``, any strides)."""
        if self.large_gemm == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return F.linear(x, weight, bias)

    def native_gemm_takes(self, rows: int) -> bool:
        """Whether a float32 matmul of ``rows`` rows runs kvcli's own kernel (gemm.c)."""
        return self.native is not None and self.numpy_max_rows < rows <= self.native_gemm_max_rows

    def qgemm_takes(self, rows: int) -> bool:
        """Whether a matmul of ``rows`` rows on GGUF blocks runs in registers (qgemm.c)."""
        return rows <= self.qgemm_max_rows

    def bf16_copy_rows(self, rows: int) -> bool:
        """Whether a matmul of ``rows`` rows runs fast's bfloat16 copy instead of the integer
        kernels (quant/int_weights.py, decoder.GatedMLP)."""
        return 0 < self.bf16_prefill_rows <= rows

    def i8_copy_rows(self, rows: int) -> bool:
        """Whether a matmul of ``rows`` rows runs fast's int8-per-channel prefill copy instead of
        the integer kernels on the weights' own blocks (quant/int_weights.py)."""
        return 0 < self.i8_prefill_rows <= rows

    @property
    def prefill_copy(self) -> bool:
        """Whether the integer-kernel weights keep one of fast's prefill copies (bfloat16 or
        int8; quant/apply.py makes them)."""
        return self.bf16_prefill_rows > 0 or self.i8_prefill_rows > 0

    def prefill_copy_rows(self, rows: int) -> bool:
        """Whether a matmul of ``rows`` rows runs one of fast's prefill copies rather than the
        weights' own blocks: native_step.py's decode steps never do."""
        return self.bf16_copy_rows(rows) or self.i8_copy_rows(rows)

    def runs_bf16_copy(self, x: torch.Tensor) -> bool:
        """:meth:`bf16_copy_rows` for ``x``'s rows (of its last dimension)."""
        return self.bf16_copy_rows(x.numel() // max(1, x.shape[-1]))

    def w8a8_copy_rows(self, rows: int) -> bool:
        """Whether a matmul of ``rows`` rows runs fast's int8 copy (quant/w8a8.py) instead of
        the integer kernels on the weights' own blocks; native/decode_step.c mirrors it."""
        return 0 < self.w8a8_rows <= rows and not self.bf16_copy_rows(rows)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 narrow: bool = False) -> torch.Tensor:
        """transformers' RMSNorm of a float32 ``x`` (one fused kernel instead of six ops);
        ``narrow``: rounded to bfloat16 (for fast's bf16 prefill copy that reads it)."""
        if self.native is not None and _takes(x):  # one pass, threaded over rows
            return native.rms_norm(self.native, x, weight, eps, narrow)
        y = F.rms_norm(x, (x.shape[-1],), weight, eps)
        return y.to(torch.bfloat16) if narrow else y

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``x + delta`` and its norm, one pass where the kernels take them; the same numbers
        either way. A float32 ``delta`` gets a float32 norm, a bfloat16 one (a product of fast's
        bfloat16 copy) the norm in bfloat16."""
        narrow = delta.dtype == torch.bfloat16
        if (self.native is not None and _takes(x) and delta.dtype in (torch.float32, torch.bfloat16)
                and delta.device == x.device and delta.is_contiguous() and delta.shape == x.shape):
            return native.add_rms_norm(self.native, x, delta, weight, eps)
        total = x + delta
        return total, self.rms_norm(total, weight, eps, narrow=narrow)

    def act_and_mul(self, gate_up: torch.Tensor, act: Activation, silu: bool) -> torch.Tensor:
        """act(gate) * up over a fused ``[..., 2 * intermediate]`` projection."""
        if silu and self.native is not None and _takes(gate_up):  # one pass, no temporaries
            return native.silu_and_mul(self.native, gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return act(gate) * up

    def rope_in_place(self, rows: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor],
                      heads: int, head_dim: int) -> bool:
        """RoPE on the first ``heads`` heads of each row of ``rows`` in place, where the native
        kernel takes it (cos/sin ``[rows, 1, head_dim]``); False: the caller rotates with torch."""
        if self.native is None or not _takes(rows):
            return False
        cos, sin = cos_sin
        native.rope_(self.native, rows, cos.squeeze(1), sin.squeeze(1), heads, head_dim)
        return True

    def widen_rope(self, rows: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor],
                   heads: int, head_dim: int) -> torch.Tensor | None:
        """Contiguous bfloat16 ``rows`` (a product fast's copy left narrow) in float32 with
        :meth:`rope_in_place`'s rotation, one native pass; None: the caller widens and rotates."""
        if (self.native is None or rows.device.type != "cpu" or rows.dtype != torch.bfloat16
                or not rows.is_contiguous()):
            return None
        cos, sin = cos_sin
        return native.rope_widen(self.native, rows, cos.squeeze(1), sin.squeeze(1), heads,
                                 head_dim)

    def describe(self) -> dict[str, str]:
        """The matmul and element-wise routes, for ``--stats`` and the bench JSON."""
        numpy_rows = f"<= {self.numpy_max_rows} rows numpy (OpenBLAS)" if self.numpy_max_rows else ""
        few = (f"{self.numpy_max_rows + 1}-{self.native_gemm_max_rows} native gemm"
               if self.native is not None and self.native_gemm_max_rows > self.numpy_max_rows
               else "")
        larger = "more torch " + {"mkl": "MKL", "onednn": "oneDNN"}[self.large_gemm]
        matmul = ", ".join(p for p in (numpy_rows, few, larger) if p)
        if self.weights in NARROW:  # every matmul of the model takes narrow_linear
            name = str(self.weights).removeprefix("torch.")
            kernel = precision.bf16_kernel() if self.weights == torch.bfloat16 else "onednn"
            matmul = (f"{name} weights pre-packed for {_NARROW_KERNELS[kernel]} "
                      "(model/packed.py; float32 sums and activations)")
        if self.int_matmul:
            copies = [(n, what) for n, what in (
                (self.w8a8_rows, "an int8 copy per channel (activations per 64 values, AMX-INT8)"),
                (self.i8_prefill_rows, "an int8 copy per channel (the same kernels)"),
                (self.bf16_prefill_rows, "a bfloat16 copy through oneDNN")) if n]
            rows = (f"below {copies[0][0]} rows; " + "; ".join(f"from {n} {what}"
                                                              for n, what in copies)
                    if copies else "every row count")
            matmul = (f"quantized weights: int8 activations, {self.int_matmul} ({rows}); "
                      f"float weights: {matmul}")
        if self.own_pool:
            matmul += "; forwards on kvcli's own threads (torch's ops on one)"
        return {"matmul": matmul, "elementwise": "native" if self.native is not None else "torch"}


def select_routes(platform: Platform) -> KernelRoutes:
    """The routes of a model on ``platform`` (made once per model)."""
    return KernelRoutes(
        native=platform.native,
        numpy_max_rows=int(os.environ.get("KVCLI_NUMPY_MAX_ROWS", "1")),
        native_gemm_max_rows=int(os.environ.get("KVCLI_GEMM_MAX_ROWS", "64")),
        qgemm_max_rows=int(os.environ.get("KVCLI_QGEMM_MAX_ROWS", "64")),
        large_gemm=large_gemm.library() if platform.cpu else "mkl",
        weights=platform.weights,
    )


def process_routes() -> KernelRoutes:
    """The routes for CPU float32 as this process's environment chooses them now, for a
    matmul called outside a model (a test, a script); a model holds its own."""
    return select_routes(detect_platform("cpu", torch.float32))

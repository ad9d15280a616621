"""A quantized weight matrix and its matmul: what ``KernelRoutes.linear`` runs when a Linear's weight
is not a float tensor.

The packed bytes stay in their storage format (GGUF blocks, or kvcli's int8 rows plus one
float32 scale per output channel). Decode-sized calls (at most ``KernelRoutes.qgemm_max_rows``
rows, KVCLI_QGEMM_MAX_ROWS) run native/qgemm.c, which de-quantizes in registers; larger ones de-quantize the matrix to float32
(native, threaded) and use torch's float32 GEMM, whose packed MKL kernel is the fastest here for
hundreds of rows. Without a C compiler the matrix is de-quantized once and kept as float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from kvcli.model import native
from kvcli.model.quant import QuantError
from kvcli.model.routes import KernelRoutes, process_routes

# GGML type ids (gguf.GGMLQuantizationType) of the formats the native kernel runs; I8 is kvcli's
# per-output-channel int8 (GGML's I8 id: an int8 per weight; the scales live beside it).
Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, I8 = 2, 3, 8, 12, 13, 14, 24
NATIVE_TYPES = frozenset({Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, I8})
BLOCK_ELEMS = {Q4_K: 256, Q5_K: 256, Q6_K: 256}  # weights per block; 32 for the others


class NumpyView:
    """A quantized weight as NumPy code sees a float32 ``[out, in]`` matrix, for the fused
    one-row decoder (model/numpy_decode.py), which does ``row @ w.T`` and ``embed[token]``:
    ``.T`` is the ``[in, out]`` view, ``row @ view`` runs the quantized matmul and
    ``view[token]`` de-quantizes one row. Nothing float32 is materialised."""

    __array_ufunc__ = None  # `ndarray @ view` then calls view.__rmatmul__ (NumPy's protocol)

    def __init__(self, weight: QuantWeight | StackedWeight, transposed: bool = False) -> None:
        self.weight, self.transposed = weight, transposed
        out_features, in_features = weight.shape
        self.shape = (in_features, out_features) if transposed else (out_features, in_features)

    @property
    def T(self) -> NumpyView:  # noqa: N802 - NumPy's name
        return NumpyView(self.weight, not self.transposed)

    def __rmatmul__(self, row: np.ndarray) -> np.ndarray:
        if not self.transposed:
            raise TypeError("row @ W needs the [in, out] view (W.T)")
        x = torch.from_numpy(np.ascontiguousarray(row, dtype=np.float32))
        return self.weight.linear(x, None).numpy()

    def __getitem__(self, index: int) -> np.ndarray:
        if self.transposed or not isinstance(index, int | np.integer):
            raise TypeError("only single rows of the [out, in] view can be read")
        return self.weight.dequantize(torch.tensor([int(index)]))[0].numpy()


class _AsArray:
    """``detach().numpy()`` of a quantized weight gives its :class:`NumpyView`."""

    def detach(self) -> _AsArray:
        return self

    def numpy(self) -> NumpyView:
        return NumpyView(self)  # type: ignore[arg-type]


@dataclass(eq=False)
class QuantWeight(_AsArray):
    """``[out, in]`` weights; ``data`` is ``[out, row bytes]`` uint8 (or int8 for I8)."""

    kind: int
    data: torch.Tensor
    shape: tuple[int, int]
    scale: torch.Tensor | None = None  # float32 [out], I8 only
    _dense: torch.Tensor | None = field(default=None, repr=False)
    # The model's routes (quant/apply.py installs them); None outside a model: the process's.
    routes: KernelRoutes | None = field(default=None, repr=False)

    dtype = torch.float32  # what it computes in (activations and outputs)
    device = torch.device("cpu")

    def __post_init__(self) -> None:
        out_features, in_features = self.shape
        block = BLOCK_ELEMS.get(self.kind, 32)
        if in_features % block or self.data.shape[0] != out_features:
            raise QuantError(f"quantized weight {self.shape}: rows must hold whole "
                             f"{block}-blocks")
        self.data = self.data.contiguous()

    @property
    def nbytes(self) -> int:
        extra = 0 if self.scale is None else self.scale.numel() * 4
        return self.data.numel() * self.data.element_size() + extra

    def _routes(self, routes: KernelRoutes | None) -> KernelRoutes:
        return routes or self.routes or process_routes()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None,
               routes: KernelRoutes | None = None) -> torch.Tensor:
        """``x @ W^T (+ bias)`` for float32 ``x`` of shape ``[..., in]``."""
        routes = self._routes(routes)
        lead, in_features = x.shape[:-1], self.shape[1]
        x2 = x.reshape(-1, in_features).float().contiguous()
        lib = routes.native if self.kind in NATIVE_TYPES else None
        if lib is not None and routes.qgemm_takes(x2.shape[0]):
            y = x2.new_empty((x2.shape[0], self.shape[0]))
            status = lib.kvcli_qgemm(
                self.kind, x2.data_ptr(), self.data.data_ptr(), _ptr(self.scale),
                _ptr(None if bias is None else bias.float().contiguous()), y.data_ptr(),
                x2.shape[0], self.shape[0], in_features, native.num_threads())
            if status == 0:
                return y.reshape(*lead, self.shape[0])
        # The de-quantized panel goes to the library float32 prefill uses (model/large_gemm.py).
        dense = self.dequantize(routes=routes)
        return routes.large_linear(x2, dense, bias).reshape(*lead, self.shape[0])

    def dequantize(self, rows: torch.Tensor | None = None,
                   routes: KernelRoutes | None = None) -> torch.Tensor:
        """float32 ``[len(rows) or out, in]``: the given rows (all when None) de-quantized."""
        if self._dense is not None:
            return self._dense if rows is None else self._dense[rows]
        lib = self._routes(routes).native if self.kind in NATIVE_TYPES else None
        if lib is None:  # no compiler: de-quantize once, keep float32 (the torch path)
            self._dense = torch.from_numpy(self._dequantize_numpy())
            return self.dequantize(rows, routes)
        idx = None if rows is None else rows.reshape(-1).to(torch.int64).contiguous()
        count = self.shape[0] if idx is None else idx.numel()
        out = torch.empty((count, self.shape[1]), dtype=torch.float32)
        lib.kvcli_qdequant(self.kind, self.data.data_ptr(), _ptr(self.scale), _ptr(idx),
                           out.data_ptr(), count, self.shape[1], native.num_threads())
        return out

    def _dequantize_numpy(self) -> np.ndarray:
        if self.kind == I8:
            assert self.scale is not None
            return (self.data.float() * self.scale[:, None]).numpy()
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        flat = dequantize(self.data.numpy(), GGMLQuantizationType(self.kind))
        return np.ascontiguousarray(flat.reshape(self.shape), dtype=np.float32)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def quantize_int8(weight: torch.Tensor) -> QuantWeight:
    """Symmetric per-output-channel int8: ``scale = max|w_row| / 127``, ``q = round(w / scale)``."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantWeight(I8, q.contiguous(), tuple(w.shape), scale.contiguous())


@dataclass(eq=False)
class StackedWeight(_AsArray):
    """Fused projections (q/k/v, gate/up) whose GGUF tensors differ in type (Q4_K_M files keep
    v in Q6_K): one matmul per part, outputs side by side."""

    parts: list[QuantWeight]

    dtype = torch.float32
    device = torch.device("cpu")

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None,
               routes: KernelRoutes | None = None) -> torch.Tensor:
        y = torch.cat([p.linear(x, None, routes) for p in self.parts], dim=-1)
        return y if bias is None else y + bias

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        dense = torch.cat([p.dequantize() for p in self.parts])
        return dense if rows is None else dense[rows]

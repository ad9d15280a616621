"""The batch-1 decode step of a model as one native call (native/decode_step.c):
``--quantization gguf`` (qgemm.c's float32 math on the GGUF blocks), ``gguf-int`` / ``int8``
(qint.c's integer kernels) and float32 weights (gemv.c on their ``[in, out]`` buffers).

The fused NumPy path (numpy_decode.py) runs such a step as ~150 ctypes matmul calls and ~1200
small NumPy operations, ~4-5 ms a token beside the weights' few milliseconds of memory traffic.
Here the whole layer stack is one call: the same matmul kernels on the same bytes, and the
element-wise, KV-write and attention kernels the batched torch path calls. For float32 weights
the one-row matmul is gemv.c, not the batched path's gemm.c: each thread streams a contiguous
slab of W (12.6 ms for the model's layers on a Zen 3, OpenBLAS 14.2-14.9, gemm.c 16.9). Built
only where every matrix is one a kernel runs whole (not a StackedWeight of mixed GGUF types)
and the cache is float32 or int8 rows; otherwise NumpyDecoder keeps its own loop.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import torch

from kvcli.model import native
from kvcli.model.quant.int_weights import IntWeight
from kvcli.model.quant.weights import NATIVE_TYPES, QuantWeight

_P, _I64 = ctypes.c_void_p, ctypes.c_int64


class _Matrix(ctypes.Structure):
    _fields_ = [("int_kernel", _I64), ("type", _I64), ("variant", _I64), ("w", _P),
                ("scale", _P), ("bias", _P)]


class _Layer(ctypes.Structure):
    _fields_ = [("in_norm", _P), ("post_norm", _P), ("qkv", _Matrix), ("o", _Matrix),
                ("gate_up", _Matrix), ("down", _Matrix)]


class _Model(ctypes.Structure):
    _fields_ = [("num_layers", _I64), ("hidden", _I64), ("heads", _I64), ("kv_heads", _I64),
                ("head_dim", _I64), ("ffn", _I64), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float), ("layers", _P), ("final_norm", _P),
                ("kv_int8", _I64), ("layer_bytes", _I64), ("v_bytes", _I64),
                ("row_bytes", _I64)]


def _bind(lib: ctypes.CDLL) -> Any:
    fn = lib.kvcli_decode_step
    fn.argtypes = [_P, _P, _P, _P, _P, _I64, _P, _I64, _P, _I64]
    fn.restype = ctypes.c_int
    return fn


class NativeStep:
    """``step(h, cos, sin, kv_cache, slot, context)``: the final-normed hidden state of one
    token whose embedding is ``h``, its K/V written at ``slot``."""

    def __init__(self, lib: ctypes.CDLL, model: torch.nn.Module) -> None:
        """ValueError: a matrix no native kernel runs whole."""
        cfg, inner = model.config, model.model
        self._fn = _bind(lib)
        self._keep: list[torch.Tensor] = []  # the float32 copies the structs point into
        self._layers = (_Layer * cfg.num_layers)()
        for lw, layer in zip(self._layers, inner.layers, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            lw.in_norm = self._ptr(layer.input_layernorm.weight)
            lw.post_norm = self._ptr(layer.post_attention_layernorm.weight)
            lw.qkv, lw.o, lw.gate_up, lw.down = (
                self._matrix(p.weight, p.bias)
                for p in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj))
        self.model = _Model(cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                            cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps,
                            cfg.head_dim**-0.5, ctypes.addressof(self._layers),
                            self._ptr(inner.norm.weight), 0, 0, 0, 0)

    @classmethod
    def create(cls, model: torch.nn.Module) -> NativeStep | None:
        """None unless the kernels are built and every layer's four matrices are ones a native
        kernel runs whole."""
        lib = model.routes.native
        if lib is None or not hasattr(lib, "kvcli_decode_step"):
            return None
        try:
            return cls(lib, model)
        except ValueError:
            return None

    def _ptr(self, t: torch.Tensor | None) -> int | None:
        if t is None:
            return None
        t = t.detach().float().contiguous()
        self._keep.append(t)
        return t.data_ptr()

    def _matrix(self, weight: Any, bias: torch.Tensor | None) -> _Matrix:
        if isinstance(weight, IntWeight):
            return _Matrix(1, weight.kind, weight.variant, weight.packed.data_ptr(), None,
                           self._ptr(bias))
        if isinstance(weight, QuantWeight) and weight.kind in NATIVE_TYPES:
            return _Matrix(0, weight.kind, 0, weight.data.data_ptr(), self._ptr(weight.scale),
                           self._ptr(bias))
        if (isinstance(weight, torch.Tensor) and weight.dtype == torch.float32
                and weight.t().is_contiguous()):  # an [out, in] view of an [in, out] buffer
            self._keep.append(weight)
            return _Matrix(2, 0, 0, weight.data_ptr(), None, self._ptr(bias))
        raise ValueError(f"no native decode step for a {type(weight).__name__} matrix")

    def __call__(self, h: np.ndarray, cos: np.ndarray, sin: np.ndarray, kv_cache: np.ndarray,
                 slot: int, context: np.ndarray) -> np.ndarray:
        m = self.model
        m.kv_int8 = int(kv_cache.dtype == np.uint8)
        m.layer_bytes, m.v_bytes, m.row_bytes = kv_cache.strides[:3]
        h = np.ascontiguousarray(h, dtype=np.float32).copy()
        out = np.empty((1, h.shape[0]), dtype=np.float32)
        context = np.ascontiguousarray(context, dtype=np.int64)
        status = self._fn(ctypes.addressof(m), h.ctypes.data, cos.ctypes.data, sin.ctypes.data,
                          kv_cache.ctypes.data, slot, context.ctypes.data, context.shape[0],
                          out.ctypes.data, native.num_threads())
        if status:
            raise MemoryError(f"native decode step failed (status {status})")
        return out


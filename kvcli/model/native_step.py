"""Decode steps of a model as one native call each (native/decode_step.c): batch 1, and a
batched step whose every row is one sequence's next token (:meth:`NativeStep.rows`).
``--quantization gguf`` (qgemm.c's float32 math on the GGUF blocks), ``gguf-int`` / ``int8``
(qint.c's integer kernels) and float32 weights (gemv.c on their ``[in, out]`` buffers at one
row, gemm.c at more).

The fused NumPy path (numpy_decode.py) runs such a step as ~150 ctypes matmul calls and ~1200
small NumPy operations, ~4-5 ms a token beside the weights' few milliseconds of memory traffic.
Here the whole layer stack is one call: the same matmul kernels on the same bytes, and the
element-wise, KV-write and attention kernels the batched torch path calls. For float32 weights
the one-row matmul is gemv.c, not the batched path's gemm.c: each thread streams a contiguous
slab of W (12.6 ms for the model's layers on a Zen 3, OpenBLAS 14.2-14.9, gemm.c 16.9). Built
only where every matrix is one a kernel runs whole (not a StackedWeight of mixed GGUF types)
and the cache is float32 or int8 rows; otherwise NumpyDecoder keeps its own loop.

A batched decode step through the torch path spends ~0.3 of its ~1.45 ms a layer (32 rows,
SmolLM2-135M, fast, Xeon with AMX) in Python and dispatch between its ~10 kernel calls; in
one call those gaps are gone. It takes a step only where the batched path would run the same
kernels: every row a decode token (no prefill chunk), attended as native_cpu.py attends it (the
shared-prefix decode kernel for groups sharing a cached prefix, the paged decode kernel for the
rest; no model with a sliding window has a native step: NumpyDecoder.supports), and a row count
at which every matrix runs the kernel the call runs (routes.py's rules). Its outputs equal the
batched path's bit for bit.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import torch

from kvcli.model import native
from kvcli.model.attention.native_cpu import NativeMetadata
from kvcli.model.quant.int_weights import IntWeight
from kvcli.model.quant.weights import NATIVE_TYPES, QuantWeight

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
# A matrix's kernel (decode_step.c step_matrix.int_kernel): qgemm.c, qint.c, gemv.c / gemm.c.
BLOCK_KERNEL, INT_KERNEL, FLOAT_KERNEL = 0, 1, 2


class _Matrix(ctypes.Structure):
    _fields_ = [("int_kernel", _I64), ("type", _I64), ("variant", _I64), ("w", _P),
                ("scale", _P), ("bias", _P), ("w8", _P), ("w8_scale", _P), ("w8_rows", _I64)]


class _Layer(ctypes.Structure):
    _fields_ = [("in_norm", _P), ("post_norm", _P), ("qkv", _Matrix), ("o", _Matrix),
                ("gate_up", _Matrix), ("down", _Matrix)]


class _Rows(ctypes.Structure):  # decode_step.c step_rows: how a batched step's rows attend
    _fields_ = [("rows", _I64), ("slots", _P), ("context", _P), ("context_len", _I64),
                ("paged_rows", _P), ("paged", _I64), ("block_tables", _P), ("seq_lens", _P),
                ("block_size", _I64), ("max_blocks", _I64), ("shared_slots", _P),
                ("shared_seqs", _P), ("groups", _P), ("num_groups", _I64)]


class _Model(ctypes.Structure):
    _fields_ = [("num_layers", _I64), ("hidden", _I64), ("heads", _I64), ("kv_heads", _I64),
                ("head_dim", _I64), ("ffn", _I64), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float), ("layers", _P), ("final_norm", _P),
                ("kv_int8", _I64), ("layer_bytes", _I64), ("v_bytes", _I64),
                ("row_bytes", _I64)]


def _bind(lib: ctypes.CDLL) -> tuple[Any, Any]:
    one, rows = lib.kvcli_decode_step, lib.kvcli_decode_rows
    one.argtypes = [_P, _P, _P, _P, _P, _I64, _P, _I64, _P, _I64]
    rows.argtypes = [_P, _P, _P, _P, _P, _P, _P, _I64]
    one.restype = rows.restype = ctypes.c_int
    return one, rows


class NativeStep:
    """``step(h, cos, sin, kv_cache, slot, context)``: the final-normed hidden state of one
    token whose embedding is ``h``, its K/V written at ``slot``."""

    def __init__(self, lib: ctypes.CDLL, model: torch.nn.Module) -> None:
        """ValueError: a matrix no native kernel runs whole."""
        cfg, inner = model.config, model.model
        self._fn, self._rows_fn = _bind(lib)
        self.routes = model.routes
        self._keep: list[torch.Tensor] = []  # the float32 copies the structs point into
        self._layers = (_Layer * cfg.num_layers)()
        for lw, layer in zip(self._layers, inner.layers, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            lw.in_norm = self._ptr(layer.input_layernorm.weight)
            lw.post_norm = self._ptr(layer.post_attention_layernorm.weight)
            lw.qkv, lw.o, lw.gate_up, lw.down = (
                self._matrix(p.weight, p.bias)
                for p in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj))
        self._kernels = {int(x.int_kernel) for lw in self._layers
                         for x in (lw.qkv, lw.o, lw.gate_up, lw.down)}
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
            few = weight.few  # fast's int8 copy, which the step's calls of w8a8_rows rows run
            return _Matrix(INT_KERNEL, weight.kind, weight.variant, weight.packed.data_ptr(), None,
                           self._ptr(bias), *((few.packed.data_ptr(), few.scales.data_ptr(),
                                              self.routes.w8a8_rows) if few else (None, None, 0)))
        if isinstance(weight, QuantWeight) and weight.kind in NATIVE_TYPES:
            return _Matrix(BLOCK_KERNEL, weight.kind, 0, weight.data.data_ptr(), self._ptr(weight.scale),
                           self._ptr(bias))
        if (isinstance(weight, torch.Tensor) and weight.dtype == torch.float32
                and weight.t().is_contiguous()):  # an [out, in] view of an [in, out] buffer
            self._keep.append(weight)
            return _Matrix(FLOAT_KERNEL, 0, 0, weight.data_ptr(), None, self._ptr(bias))
        raise ValueError(f"no native decode step for a {type(weight).__name__} matrix")

    def _cache(self, kv_cache: np.ndarray) -> None:
        """The cache's format and strides in bytes (a layer, K to V, a slot) into the model."""
        m = self.model
        m.kv_int8 = int(kv_cache.dtype == np.uint8)
        m.layer_bytes, m.v_bytes, m.row_bytes = kv_cache.strides[:3]

    def takes(self, rows: int) -> bool:
        """Whether a decode step of ``rows`` rows runs every matrix on the kernel this call
        runs it on, as the batched path would (routes.py; one row is ``__call__``'s)."""
        r = self.routes
        rules = {BLOCK_KERNEL: r.qgemm_takes, FLOAT_KERNEL: r.native_gemm_takes,
                 INT_KERNEL: lambda n: not r.prefill_copy_rows(n)}
        return rows > 1 and all(rules[k](rows) for k in self._kernels)

    def rows(self, model: torch.nn.Module, input_ids: torch.Tensor, positions: torch.Tensor,
             meta: object, kv_cache: torch.Tensor) -> torch.Tensor | None:
        """The final-normed hidden states of a step whose every row is one sequence's next
        token, its K/V written; None where the step is not one this call takes (see the module
        docstring), or a kernel failed (the batched path then runs it, writing the same K/V)."""
        rows = _rows(meta)
        if rows is None or not self.takes(input_ids.shape[0]):
            return None
        inner = model.model
        h = inner.embed_tokens(input_ids).float().contiguous()
        cos, sin = (t.squeeze(1).contiguous() for t in inner.cos_sins(positions)[0])
        out = torch.empty_like(h)
        self._cache(kv_cache.numpy())
        status = self._rows_fn(ctypes.addressof(self.model), h.data_ptr(), cos.data_ptr(),
                               sin.data_ptr(), kv_cache.data_ptr(), ctypes.addressof(rows),
                               out.data_ptr(), native.num_threads())
        return None if status else out

    def __call__(self, h: np.ndarray, cos: np.ndarray, sin: np.ndarray, kv_cache: np.ndarray,
                 slot: int, context: np.ndarray) -> np.ndarray:
        m = self.model
        self._cache(kv_cache)
        h = np.ascontiguousarray(h, dtype=np.float32).copy()
        out = np.empty((1, h.shape[0]), dtype=np.float32)
        context = np.ascontiguousarray(context, dtype=np.int64)
        status = self._fn(ctypes.addressof(m), h.ctypes.data, cos.ctypes.data, sin.ctypes.data,
                          kv_cache.ctypes.data, slot, context.ctypes.data, context.shape[0],
                          out.ctypes.data, native.num_threads())
        if status:
            raise MemoryError(f"native decode step failed (status {status})")
        return out



def _rows(meta: object) -> _Rows | None:
    """How a step's rows attend (the native backends' metadata, as native_cpu.native_forward
    reads it: it points into meta's tensors); None unless every row is a decode token."""
    if not isinstance(meta, NativeMetadata) or meta.paged_prefill is not None:
        return None
    shared, decode = meta.decode_kernels(None)  # no native step where a layer has a window
    if decode is None and shared is None:
        return None
    c = meta.common
    r = _Rows(rows=c.slot_mapping.shape[0], slots=c.slot_mapping.data_ptr(),
              block_size=c.block_size)
    if decode is not None:
        r.paged, r.block_tables, r.seq_lens = (len(decode.seqs), decode.block_tables.data_ptr(),
                                               decode.seq_lens.data_ptr())
        r.max_blocks = decode.block_tables.shape[1]
        if shared is not None:  # else every row, in order
            r.paged_rows = decode.rows.data_ptr()
    if shared is not None:
        r.shared_slots, r.shared_seqs, r.groups = (shared.slots.data_ptr(),
                                                   shared.seqs.data_ptr(),
                                                   shared.groups.data_ptr())
        r.num_groups = shared.groups.shape[0]
    return r

"""Optional native CPU kernels: C compiled with the system compiler on first use, then cached.

Nothing waits on a compile step more than once per machine: the shared object is keyed by
the source, the flags (the ISA variant's among them, ``KVCLI_NATIVE_ISA``), the compiler and
the CPU's feature flags, and lives in ``$KVCLI_HOME/kernels`` (the build: build.py, which the
engine starts on a thread before the model loads). Without a compiler (or with
``KVCLI_NATIVE=0``) ``load()`` returns None and the engine keeps its torch path, which computes
the same attention, RMSNorm, SiLU-and-mul and RoPE.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch

from kvcli.model.native.build import FLAGS, HEADERS, ISA_FLAGS, SOURCES, isa_flags, library_path
from kvcli.model.native.build import cpu_flags as _cpu_flags  # noqa: F401 - tests read it here

log = logging.getLogger("kvcli.native")
__all__ = ["FLAGS", "HEADERS", "ISA_FLAGS", "SOURCES", "isa_flags", "load", "load_variant"]
I64, F32P, I64P = ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p


def load() -> ctypes.CDLL | None:
    """The compiled kernels for KVCLI_NATIVE_ISA (default native; read on each call, so a test
    or a benchmark can switch variants), or None where they cannot be built (the torch path is
    used). ValueError: an ISA this CPU cannot run."""
    return load_variant(os.environ.get("KVCLI_NATIVE_ISA", "native"))


@cache
def load_variant(isa: str) -> ctypes.CDLL | None:
    """The kernels built for ``isa`` (see :data:`ISA_FLAGS`), once per process."""
    isa_flags(isa)  # an ISA this CPU cannot run is an error even with the kernels off
    try:
        path = library_path(isa)
        if path is None:
            log.info("native CPU kernels off (KVCLI_NATIVE=0, or no C compiler)")
            return None
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or err
        log.warning("native CPU kernels off: build failed: %s", detail)
        return None
    for suffix in ("", "_int8", "_bf16"):  # the kernels of each KV cache format
        fn = getattr(lib, f"kvcli_paged_decode_attention{suffix}")
        fn.argtypes = [F32P, F32P, F32P, I64P, I64P, F32P, *[I64] * 7, ctypes.c_float, I64]
        fn.restype = ctypes.c_int
        fn = getattr(lib, f"kvcli_paged_prefill_attention{suffix}")
        fn.argtypes = [F32P, I64, F32P, F32P, I64P, I64P, F32P, *[I64] * 5, ctypes.c_float, I64]
        fn.restype = ctypes.c_int
        fn = getattr(lib, f"kvcli_shared_decode_attention{suffix}")
        fn.argtypes = [F32P, I64, F32P, F32P, I64P, I64P, I64P, F32P, *[I64] * 4,
                       ctypes.c_float, I64]
        fn.restype = ctypes.c_int
        fn = getattr(lib, f"kvcli_attention_int_scores{suffix}")
        fn.argtypes, fn.restype = [I64], I64
        fn = getattr(lib, f"kvcli_attention_amx{suffix}")
        fn.argtypes, fn.restype = [I64], I64
    lib.kvcli_quantize_kv.argtypes = [F32P, I64P, F32P, *[I64] * 5]
    lib.kvcli_quantize_kv.restype = None
    lib.kvcli_pool_team.argtypes, lib.kvcli_pool_team.restype = [I64], I64
    lib.kvcli_pool_wide.argtypes, lib.kvcli_pool_wide.restype = [I64], I64
    lib.kvcli_gemm.argtypes = [F32P, F32P, F32P, F32P, *[I64] * 4]
    lib.kvcli_gemm_nt.argtypes = [F32P, F32P, F32P, *[I64] * 4]
    lib.kvcli_gemv.argtypes = [F32P, F32P, F32P, F32P, *[I64] * 3]
    lib.kvcli_gemv.restype = ctypes.c_int
    lib.kvcli_rms_norm.argtypes = [F32P, F32P, F32P, I64, I64, ctypes.c_float, I64]
    lib.kvcli_rms_norm_bf16.argtypes = [F32P, F32P, F32P, I64, I64, ctypes.c_float, I64]
    for name in ("kvcli_add_rms_norm_bf16", "kvcli_add_rms_norm"):
        getattr(lib, name).argtypes = [F32P, F32P, F32P, F32P, F32P, I64, I64, ctypes.c_float,
                                       I64]
    lib.kvcli_silu_and_mul.argtypes = [F32P, F32P, I64, I64, I64]
    lib.kvcli_rope.argtypes = [F32P, F32P, F32P, *[I64] * 5]
    lib.kvcli_rope_widen.argtypes = [F32P, F32P, F32P, F32P, *[I64] * 5]
    for name in ("kvcli_gemm", "kvcli_gemm_nt", "kvcli_rms_norm", "kvcli_rms_norm_bf16",
                 "kvcli_add_rms_norm_bf16", "kvcli_add_rms_norm",
                 "kvcli_silu_and_mul", "kvcli_rope", "kvcli_rope_widen"):
        getattr(lib, name).restype = None
    # Quantized weights (qgemm.c; called from kvcli/model/quant/weights.py).
    lib.kvcli_qgemm.argtypes = [I64, F32P, F32P, F32P, F32P, F32P, *[I64] * 4]
    lib.kvcli_qdequant.argtypes = [I64, F32P, F32P, I64P, F32P, *[I64] * 3]
    lib.kvcli_qgemm.restype = lib.kvcli_qdequant.restype = ctypes.c_int
    # Integer-activation matmuls (qint.c; kvcli/model/quant/int_weights.py).
    lib.kvcli_qint_gemm.argtypes = [I64, I64, F32P, F32P, F32P, F32P, *[I64] * 4]
    lib.kvcli_qint_pack.argtypes = [I64, F32P, F32P, F32P, I64, I64]
    lib.kvcli_qint_packed_bytes.argtypes = [I64, I64, I64]
    lib.kvcli_qint_quantize.argtypes = [F32P, F32P, F32P, F32P, I64, I64]
    lib.kvcli_qint_gemm.restype = lib.kvcli_qint_pack.restype = ctypes.c_int
    lib.kvcli_qint_packed_bytes.restype = lib.kvcli_qint_variants.restype = I64
    lib.kvcli_qint_amx_ready.restype = I64
    lib.kvcli_qint_quantize.restype = None
    # fast's prefill MLP front on AMX-BF16 (swiglu_amx.c; kvcli/model/packed.py's SwiGLU).
    lib.kvcli_swiglu_bf16.argtypes = [F32P, F32P, F32P, F32P, *[I64] * 4]
    lib.kvcli_swiglu_bf16.restype = ctypes.c_int
    lib.kvcli_swiglu_pack.argtypes, lib.kvcli_swiglu_pack.restype = [F32P, F32P, I64, I64], None
    lib.kvcli_swiglu_packed_size.argtypes = [I64, I64]
    lib.kvcli_swiglu_packed_size.restype = lib.kvcli_swiglu_built.restype = I64
    return lib


# The integer matmul's variants (qint.c's index) and the /proc/cpuinfo flags each needs, best
# first. KVCLI_NATIVE_ISA=avx2 stands for an AVX2-only CPU (Zen 3), so it gets the AVX2 one.
QINT_VARIANTS = {"amx-int8": (3, ("amx_tile", "amx_int8", "avx512f", "avx512bw", "avx512vl",
                              "avx512_vnni")),
                 "avx512-vnni": (0, ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")),
                 "avx-vnni": (1, ("avx2", "fma", "f16c", "avx_vnni")),
                 "avx2": (2, ("avx2", "fma", "f16c"))}


def qint_available(lib: ctypes.CDLL | None) -> bool:
    """Whether the integer matmul kernels run here (``--quantization int8`` takes them then)."""
    try:
        return lib is not None and bool(qint_variant(lib))
    except ValueError:
        return False


def w8a8_available(lib: ctypes.CDLL | None) -> bool:
    """Whether fast's int8 copy for few-row matmuls runs here (w8a8.c on AMX-INT8 tiles, built
    with qint.c's AMX variant, which Linux grants; quant/w8a8.py); KVCLI_W8A8=0 turns it off,
    and KVCLI_NATIVE_ISA=avx2 (an AVX2-only CPU, as qint_variant reads it) has none."""
    return (_amx_kernel_ready(lib, "KVCLI_W8A8", {"amx_tile", "amx_int8", "avx512f", "avx512bw"})
            and lib.kvcli_qint_variants() > QINT_VARIANTS["amx-int8"][0])


def swiglu_amx_available(lib: ctypes.CDLL | None) -> bool:
    """Whether fast's bfloat16 prefill MLP takes gate, up and SiLU on AMX-BF16 tiles
    (swiglu_amx.c, built with the AMX kernels, whose tiles Linux grants; packed.SwiGLU), where
    oneDNN's two calls otherwise; KVCLI_SWIGLU_AMX=0 turns it off."""
    return (_amx_kernel_ready(lib, "KVCLI_SWIGLU_AMX",
                              {"amx_tile", "amx_bf16", "avx512f", "avx512bw", "avx512_bf16"})
            and bool(lib.kvcli_swiglu_built()))


def _amx_kernel_ready(lib: ctypes.CDLL | None, switch: str, needs: set[str]) -> bool:
    """The rule fast's AMX kernels share: not switched off (``switch`` = 0), the kernels loaded,
    not the AVX2 stand-in build (KVCLI_NATIVE_ISA=avx2, an AVX2-only CPU), the CPU's flags
    ``needs``, and the tiles granted by Linux (qint.c's one request)."""
    return (os.environ.get(switch, "1") != "0" and lib is not None
            and os.environ.get("KVCLI_NATIVE_ISA") != "avx2"
            and needs <= set(_cpu_flags().split()) and bool(lib.kvcli_qint_amx_ready()))


def qint_variant(lib: ctypes.CDLL) -> str:
    """The integer matmul variant for this CPU: KVCLI_QINT_ISA if set (ValueError when the
    CPU lacks it), else the best the CPU's flags allow. ValueError: none (not x86 AVX2)."""
    cpu = set(_cpu_flags().split())
    runs = [name for name, (index, needs) in QINT_VARIANTS.items()
            if index < lib.kvcli_qint_variants() and set(needs) <= cpu
            and (name != "amx-int8" or lib.kvcli_qint_amx_ready())]
    if os.environ.get("KVCLI_NATIVE_ISA") == "avx2":
        runs = [name for name in runs if name == "avx2"]
    wanted = os.environ.get("KVCLI_QINT_ISA")
    if wanted:
        if wanted not in QINT_VARIANTS:
            raise ValueError(f"KVCLI_QINT_ISA={wanted!r}: expected one of "
                             f"{', '.join(QINT_VARIANTS)}")
        if wanted not in runs:
            raise ValueError(f"KVCLI_QINT_ISA={wanted}: this CPU (or build) cannot run it; it "
                             f"runs {', '.join(runs) or 'none'}")
        return wanted
    if not runs:
        raise ValueError("integer-activation kernels need an x86 CPU with AVX2, FMA and F16C")
    return runs[0]


_pinned = threading.local()  # .threads: the count own_pool keeps for this thread's forward


def num_threads() -> int:
    """Kernel threads: torch's intra-op thread count, so ``torch.set_num_threads`` (``--threads``,
    a Ray actor's CPU share) bounds these kernels too; KVCLI_NATIVE_THREADS overrides."""
    pinned = getattr(_pinned, "threads", None)
    if pinned is not None:
        return pinned
    env = os.environ.get("KVCLI_NATIVE_THREADS")
    return max(1, int(env)) if env else torch.get_num_threads()


@contextmanager
def own_pool(lib: ctypes.CDLL) -> Iterator[None]:
    """A forward whose every matmul runs these kernels (``KernelRoutes.own_pool``): torch's ops
    (residual adds, the KV write) on one thread and the kernels' many-row calls on kvcli's pool,
    with :func:`num_threads` kept. torch's team then never runs, so its threads do not spin on
    the kernels' cores, and no call waits at its barrier for a thread on a core another process
    holds: distinct on gguf-int with the second vCPU busy took 20-23 s on the team, 13.8 s so
    (Zen 4; quiet, the two within noise: docs/BENCHMARKS.md, 2026-12-08)."""
    outer, torch_threads = getattr(_pinned, "threads", None), torch.get_num_threads()
    _pinned.threads = num_threads()
    torch.set_num_threads(1)
    was = lib.kvcli_pool_wide(1)
    try:
        yield
    finally:
        lib.kvcli_pool_wide(was)
        torch.set_num_threads(torch_threads)
        _pinned.threads = outer


def _kernel(lib: ctypes.CDLL, name: str, kv_layer: torch.Tensor) -> Any:
    """The attention kernel for the cache's layout: float32, the int8 rows of kv_int8.h (a
    uint8 pool, kvcli/model/attention/native_int8.py), or bfloat16 (native_bf16.py)."""
    if kv_layer.dtype == torch.uint8:
        return getattr(lib, f"{name}_int8")
    if kv_layer.dtype == torch.bfloat16:
        return getattr(lib, f"{name}_bf16")
    if kv_layer.dtype != torch.float32:
        raise TypeError(f"{name}: no kernel for a {kv_layer.dtype} KV cache")
    return getattr(lib, name)


def quantize_kv(lib: ctypes.CDLL, x: torch.Tensor, slots: torch.Tensor,
                cache: torch.Tensor) -> None:
    """New K or V rows ``x`` [T, Hkv, D] float32 into ``cache``'s int8 rows (kv_int8.h) at
    ``slots``; ``cache`` [num_slots, Hkv, D + 8] uint8, contiguous. ``x``'s rows may lie apart
    (a view of the fused QKV projection's output): read in place."""
    x = rows_in_place(x)
    lib.kvcli_quantize_kv(x.data_ptr(), slots.data_ptr(), cache.data_ptr(), x.shape[0],
                          x.shape[1], x.shape[2], x.stride(0), num_threads())


def rows_in_place(x: torch.Tensor) -> torch.Tensor:
    """A [T, heads, D] float32 tensor whose rows the kernels can read where they lie (each row
    contiguous, rows any distance apart): ``x`` itself when it is so, else a contiguous copy."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2] and x.stride(0) >= x.shape[1] * x.shape[2]:
        return x
    return x.contiguous()


def paged_decode_attention(
    lib: ctypes.CDLL,
    q: torch.Tensor,  # [S, H, D] float32
    kv_layer: torch.Tensor,  # [2, num_slots, Hkv, D] float32 (or int8 rows), contiguous
    block_tables: torch.Tensor,  # [S, max_blocks] int64
    seq_lens: torch.Tensor,  # [S] int64
    block_size: int,
    window: int | None,
    scale: float,
) -> torch.Tensor:  # [S, H, D]
    q = q.contiguous()
    out = torch.empty_like(q)
    num_seqs, num_heads, head_dim = q.shape
    status = _kernel(lib, "kvcli_paged_decode_attention", kv_layer)(
        q.data_ptr(), kv_layer[0].data_ptr(), kv_layer[1].data_ptr(), block_tables.data_ptr(),
        seq_lens.data_ptr(), out.data_ptr(), num_seqs, num_heads, kv_layer.shape[2], head_dim,
        block_size, block_tables.shape[1], window or 0, scale, num_threads())
    if status:
        raise MemoryError("paged decode attention: out of memory for its score buffers")
    return out


def paged_prefill_attention(
    lib: ctypes.CDLL,
    q: torch.Tensor,  # [T, H, D] float32, each row contiguous: every row of the step
    kv_layer: torch.Tensor,  # [2, num_slots, Hkv, D] float32 (or int8 rows), new K/V written
    slots: torch.Tensor,  # int64: the listed sequences' context slots, concatenated
    seqs: torch.Tensor,  # [S, 4] int64: first q row, q_len, context length, first slot index
    out: torch.Tensor,  # [T, H, D]: the listed sequences' rows are written
    window: int | None,
    scale: float,
) -> None:
    """Causal attention of each listed sequence's new queries over its paged context. ``q``'s
    rows may lie apart (rows_in_place); ``out`` is contiguous."""
    q = rows_in_place(q)
    _, num_heads, head_dim = q.shape
    status = _kernel(lib, "kvcli_paged_prefill_attention", kv_layer)(
        q.data_ptr(), q.stride(0), kv_layer[0].data_ptr(), kv_layer[1].data_ptr(), slots.data_ptr(),
        seqs.data_ptr(), out.data_ptr(), seqs.shape[0], num_heads, kv_layer.shape[2], head_dim,
        window or 0, scale, num_threads())
    if status:
        raise MemoryError("paged prefill attention: out of memory for its work items")


def int_scores(lib: ctypes.CDLL, kv_layer: torch.Tensor, head_dim: int) -> bool:
    """Whether the attention kernels over this cache round each query row to int8 for integer
    scores (the int8 cache where the CPU has AVX512-VNNI, native/kv_int8.h); the values' side
    stays float32."""
    return bool(_kernel(lib, "kvcli_attention_int_scores", kv_layer)(head_dim))


def attention_amx(lib: ctypes.CDLL, kv_layer: torch.Tensor, want: int = -1) -> bool:
    """Whether the many-row kernels over this cache run on AMX tiles (the int8 cache where the
    CPU has AMX-INT8 and AMX-BF16 and Linux grants the tiles, native/prefill_amx.h). ``want`` 0
    turns that off for the process, 1 back on where it can run (benchmarks and tests)."""
    return bool(_kernel(lib, "kvcli_attention_amx", kv_layer)(want))


def shared_decode_attention(
    lib: ctypes.CDLL,
    q: torch.Tensor,  # [T, H, D] float32, each row contiguous: every row of the step
    kv_layer: torch.Tensor,  # [2, num_slots, Hkv, D] float32 (or int8 rows), new K/V written
    slots: torch.Tensor,  # int64: the listed sequences' context slots, concatenated
    seqs: torch.Tensor,  # [S, 4] int64 as for prefill, q_len 1, listed group by group
    groups: torch.Tensor,  # [G, 3] int64: first listed sequence, count, shared prefix length
    out: torch.Tensor,  # [T, H, D]: the listed sequences' rows are written
    scale: float,
) -> None:
    """Decode tokens of sequences sharing a cached prefix: the prefix read once per group.
    ``q``'s rows may lie apart (rows_in_place); ``out`` is contiguous."""
    q = rows_in_place(q)
    _, num_heads, head_dim = q.shape
    status = _kernel(lib, "kvcli_shared_decode_attention", kv_layer)(
        q.data_ptr(), q.stride(0), kv_layer[0].data_ptr(), kv_layer[1].data_ptr(), slots.data_ptr(),
        seqs.data_ptr(), groups.data_ptr(), out.data_ptr(), groups.shape[0], num_heads,
        kv_layer.shape[2], head_dim, scale, num_threads())
    if status:
        raise MemoryError("shared decode attention: out of memory for its work items")


def gemm(lib: ctypes.CDLL, x: torch.Tensor, weight_in_out: torch.Tensor,
         bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight_in_out (+ bias)`` for a contiguous 2-D float32 ``x`` and a contiguous
    ``[in, out]`` weight."""
    rows, (in_features, out_features) = x.shape[0], weight_in_out.shape
    y = x.new_empty((rows, out_features))
    lib.kvcli_gemm(x.data_ptr(), weight_in_out.data_ptr(),
                   None if bias is None else bias.contiguous().data_ptr(), y.data_ptr(),
                   rows, out_features, in_features, num_threads())
    return y


def gemv(lib: ctypes.CDLL, x: torch.Tensor, weight_in_out: torch.Tensor,
         bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight_in_out (+ bias)`` for one contiguous float32 row ``x`` ``[in]`` (gemv.c, the
    native batch-1 step's float32 matmul; MemoryError: its partial sums could not be had)."""
    y = x.new_empty(weight_in_out.shape[1])
    status = lib.kvcli_gemv(x.data_ptr(), weight_in_out.data_ptr(),
                            None if bias is None else bias.contiguous().data_ptr(), y.data_ptr(),
                            weight_in_out.shape[1], weight_in_out.shape[0], num_threads())
    if status:
        raise MemoryError("gemv: no memory for the partial sums")
    return y


def gemm_nt(lib: ctypes.CDLL, x: torch.Tensor, weight_out_in: torch.Tensor) -> torch.Tensor:
    """``x @ weight_out_in.T`` for a contiguous 2-D float32 ``x`` and a contiguous ``[out, in]``
    weight (a tied embedding as the language-model head)."""
    rows, (out_features, in_features) = x.shape[0], weight_out_in.shape
    y = x.new_empty((rows, out_features))
    lib.kvcli_gemm_nt(x.data_ptr(), weight_out_in.data_ptr(), y.data_ptr(), rows, out_features,
                      in_features, num_threads())
    return y


def rms_norm(lib: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor, eps: float,
             narrow: bool = False) -> torch.Tensor:
    """transformers' RMSNorm over the last dim of a contiguous float32 ``x``; ``narrow``: the
    result rounded to bfloat16 as ``.to(torch.bfloat16)`` rounds it, in the same pass."""
    out = torch.empty_like(x, dtype=torch.bfloat16 if narrow else torch.float32)
    dim = x.shape[-1]
    kernel = lib.kvcli_rms_norm_bf16 if narrow else lib.kvcli_rms_norm
    kernel(x.data_ptr(), weight.contiguous().data_ptr(), out.data_ptr(), x.numel() // dim, dim,
           eps, num_threads())
    return out


def add_rms_norm(lib: ctypes.CDLL, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x + delta`` (a contiguous float32 ``x``, a contiguous ``delta`` of its shape) and its
    RMSNorm, in one pass: what ``rms_norm(x + delta.float(), narrow)`` gives, bit for bit,
    ``narrow`` (the norm rounded to bfloat16) where ``delta`` is bfloat16 (fast's copy's)."""
    total = torch.empty_like(x)
    out = torch.empty_like(x, dtype=delta.dtype)
    dim = x.shape[-1]
    kernel = lib.kvcli_add_rms_norm if delta.dtype == torch.float32 else lib.kvcli_add_rms_norm_bf16
    kernel(x.data_ptr(), delta.data_ptr(), total.data_ptr(), weight.contiguous().data_ptr(),
           out.data_ptr(), x.numel() // dim, dim, eps, num_threads())
    return total, out


def silu_and_mul(lib: ctypes.CDLL, gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for a contiguous ``[..., 2 * d]`` gate/up projection."""
    dim = gate_up.shape[-1] // 2
    out = gate_up.new_empty((*gate_up.shape[:-1], dim))
    lib.kvcli_silu_and_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // (2 * dim),
                           dim, num_threads())
    return out


def rope_(lib: ctypes.CDLL, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          heads: int, head_dim: int) -> None:
    """RoPE in place on the first ``heads`` heads of each row of a contiguous 2-D ``rows``;
    ``cos``/``sin`` contiguous ``[rows, head_dim]``."""
    lib.kvcli_rope(rows.data_ptr(), cos.data_ptr(), sin.data_ptr(), rows.shape[0],
                   rows.shape[1], heads, head_dim, num_threads())


def rope_widen(lib: ctypes.CDLL, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               heads: int, head_dim: int) -> torch.Tensor:
    """A contiguous 2-D bfloat16 ``rows`` in float32 with RoPE on the first ``heads`` heads of
    each row: :func:`rope_` on ``rows.float()``, bit for bit, in one pass."""
    out = torch.empty(rows.shape, dtype=torch.float32)
    lib.kvcli_rope_widen(rows.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                         rows.shape[0], rows.shape[1], heads, head_dim, num_threads())
    return out

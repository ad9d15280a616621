"""The number formats an engine computes in: ``--dtype`` and the ``--precision`` preset, decided
once per engine (LLMEngine.from_config) from the CPU's feature flags.

On the CPU, ``--dtype`` chooses how the matmul weights are stored and multiplied; activations,
norms, RoPE, attention, softmax, sampling and the KV cache stay float32. ``bfloat16`` stores the
weights in half the bytes, laid out once at load for the kernel that multiplies them
(packed.py; :func:`bf16_kernel` picks it): with AVX512_BF16 but no AMX (AMD Zen 4) kvcli's own
``vdpbf16ps`` kernel (native/bf16_gemm.c), with AMX-BF16 torch's oneDNN GEMM (AMX tiles);
each matmul's input rounded to bfloat16, float32 sums, the output float32. A CPU without native bf16 or fp16 would emulate them, slower
than float32, so those dtypes are refused there with the reason. On another device (CUDA) the
whole model and its KV cache take ``--dtype``, as before.

Measured on a Xeon with AMX-BF16 (2 vCPUs, loaded; docs/BENCHMARKS.md 2026-12-02): torch's
``F.linear`` of 576 x 3,072 weights, 16 rows 0.70 ms bf16 vs 1.41 float32, 256 rows 4.2 vs
18.2 ms; float16 (AVX512_FP16 without AMX-FP16) 1.27 / 13.5 ms, so float16 is allowed but
``auto`` and ``fast`` do not choose it. A ``vdpbf16ps`` kernel was slower than oneDNN's AMX at
every row count there, so AMX CPUs keep oneDNN; on Zen 4 (no AMX) oneDNN's bf16 calls cost
~100-400 us each whatever their size and kvcli's kernel is 1.3-3x faster per decode step.
``fast`` prefers int8 weights on the integer kernels to bfloat16 wherever it may quantize (half
the bytes, integer multiply-adds; measured faster on Zen 4, and on a Xeon with AMX than oneDNN's
AMX-BF16: 1.4-1.8x on the batched workloads, 8x at batch 1, docs/BENCHMARKS.md 2026-12-06).
``fast`` also takes an int8 KV cache where the native kernels run (:func:`_fast_kv`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from kvcli.model import large_gemm, native

# The choices of EngineConfig's dtype and precision (engine/config.py, which the model layer
# may not import; tests/test_precision.py keeps them equal).
DTYPES = ("float32", "bfloat16", "float16")
DTYPE_CHOICES = (*DTYPES, "auto")  # auto: the checkpoint's dtype where it is fast here
PRECISIONS = ("exact", "fast")
# /proc/cpuinfo flags that compute a dtype natively (any one), and those that make it fast.
_NATIVE = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}
_FAST = {"bfloat16": ("amx_bf16", "avx512_bf16"), "float16": ("amx_fp16",)}


class PrecisionError(ValueError):
    """A dtype or preset this engine cannot run as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class Precision:
    """What an engine computes in: the preset asked for, the matmul weights' dtype, and why."""

    preset: str  # "exact" | "fast" | "custom" (an explicit --dtype overrode the preset's)
    weights: str  # one of DTYPES: the float weights' (quantized weights: their activations')
    reason: str
    quantization: str | None = None  # --quantization's weights (int8, gguf) run instead
    kv_cache: str | None = None  # fast's KV cache where --kv-cache-dtype is auto (int8)
    # fast on integer-kernel weights: the dtype of the copy their many-row (prefill) matmuls
    # run from (bfloat16 on AMX-BF16: :func:`_fast_prefill`); None: every row count integer.
    prefill: str | None = None
    # fast on integer-kernel weights: the copy their few-row (batched decode) matmuls run from
    # ("int8" per channel on AMX-INT8: :func:`_fast_few_rows`); None: the weights' own kernels.
    few_rows: str | None = None

    @property
    def exact(self) -> bool:
        """Greedy outputs equal transformers' float32 (the exact guarantee)."""
        return self.weights == "float32" and self.quantization is None

    @property
    def label(self) -> str:
        """``exact: float32 weights (why)``, for the backend report."""
        weights = (f"{self.quantization} weights, {activations(self.quantization)}"
                   if self.quantization else f"{self.weights} weights")
        prefill = f", {self.prefill} prefill matmuls" if self.prefill else ""
        if self.few_rows:
            prefill += f", {self.few_rows} per-channel copy for batched decode"
        kv = f", {self.kv_cache} KV cache" if self.kv_cache else ""
        return f"{self.preset}: {weights}{prefill}{kv} ({self.reason})"

    def describe(self) -> dict[str, str]:
        """For ``--stats``, the bench JSON and ``Backend.describe()``."""
        return {"precision": self.preset, "weights": self.weights, "why": self.reason}


INT8_ACTIVATIONS = "int8 activations per 32 values"  # the integer kernels' (qint.c)


def activations(quantization: str) -> str:
    """What a quantized model's matmuls multiply its weights with (quant/apply.py decides)."""
    if quantization == "gguf-int" or (quantization == "int8" and native.qint_available(
            native.load())):
        return INT8_ACTIVATIONS
    return "float32 activations"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where unreadable)."""
    return large_gemm.cpuinfo()[1]


def _has(dtype: str, table: dict[str, tuple[str, ...]], flags: set[str]) -> bool:
    return dtype == "float32" or any(flag in flags for flag in table.get(dtype, ()))


# The CPU kernels that multiply bfloat16 weights (model/packed.py): KVCLI_BF16_GEMM's values.
KERNELS = ("avx512-bf16", "onednn")  # KVCLI_BF16_GEMM's values


class Bf16KernelError(ValueError):
    """KVCLI_BF16_GEMM asks for a kernel this CPU or build cannot run; the message says why."""


def bf16_kernel() -> str:
    """The bfloat16 matmul kernel here: KVCLI_BF16_GEMM if set (Bf16KernelError where it cannot
    run), else ``avx512-bf16`` where the CPU has avx512_bf16 but not amx_bf16 and the kernel is
    built, else ``onednn``. KVCLI_NATIVE_ISA=avx2 stands for a CPU without AVX-512, so it gets oneDNN."""
    why_not = _native_refusal()
    wanted = os.environ.get("KVCLI_BF16_GEMM", "")
    if wanted and wanted not in KERNELS:
        raise Bf16KernelError(f"KVCLI_BF16_GEMM={wanted!r}: expected one of {', '.join(KERNELS)}")
    if wanted == "avx512-bf16" and why_not:
        raise Bf16KernelError(f"KVCLI_BF16_GEMM=avx512-bf16: {why_not}")
    if wanted:
        return wanted
    # AMX tiles out-compute vdpbf16ps many times over (oneDNN beat a vdpbf16ps kernel at every
    # row count on a Xeon with AMX-BF16, docs/BENCHMARKS.md), so they keep oneDNN.
    return "onednn" if why_not or "amx_bf16" in cpu_flags() else "avx512-bf16"


def _native_refusal() -> str:
    """Why the AVX512_BF16 kernel cannot run here ("" where it can)."""
    if "avx512_bf16" not in cpu_flags():
        return "this CPU has no avx512_bf16 (/proc/cpuinfo flags)"
    if os.environ.get("KVCLI_NATIVE_ISA") == "avx2":
        return "KVCLI_NATIVE_ISA=avx2 stands for a CPU without AVX-512"
    lib = native.load()
    if lib is None or not lib.kvcli_bf16_gemm_available():
        return "the native kernels are not built (no compiler, or KVCLI_NATIVE=0)"
    return ""


def check_dtype(dtype: str, device: str) -> None:
    """PrecisionError where ``dtype`` would be emulated on this CPU (slower than float32)."""
    if dtype not in DTYPES:
        raise PrecisionError(f"--dtype: expected one of {', '.join(DTYPE_CHOICES)}, got {dtype!r}")
    if not _is_cpu(device) or _has(dtype, _NATIVE, cpu_flags()):
        return
    raise PrecisionError(
        f"--dtype {dtype}: this CPU has no native {dtype} ({' or '.join(_NATIVE[dtype])} not in "
        "/proc/cpuinfo flags); emulated it is slower than float32, so it is refused "
        "(use --dtype float32 or --precision fast)")


def fast_choice(device: str, quantization: str | None = None,
                may_quantize: bool = False) -> Precision:
    """The fastest measured combination on this machine: the one place ``--precision fast`` is
    decided for float weights. Quantized weights (``--quantization``) are their own format,
    with their own activations (float32; int8 for gguf-int, and for int8 where the integer
    kernels run); which quantized weights ``auto`` loads under fast (a GGUF's integer-kernel
    types: gguf-int) is checkpoint/quant_modes.py's ``auto_mode``, decided before loading.
    ``may_quantize`` (``--quantization auto``): float weights may become int8 wherever the
    integer kernels run. The KV cache is int8 wherever the native kernels run (:func:`_fast_kv`)."""
    if not _is_cpu(device):
        return Precision("fast", "float32", f"{device}: fast is measured on CPUs only")
    return replace(_fast_weights(quantization, may_quantize), kv_cache=_fast_kv())


def _fast_prefill(quantization: str) -> str | None:
    """fast's many-row matmuls on integer-kernel weights: "bfloat16" where the CPU has
    AMX-BF16, whose tiles multiply a bfloat16 copy of the weights (oneDNN) faster than the
    integer kernels at many rows (Xeon with AMX, one SmolLM2 layer, 2 threads: 1.5-1.9x
    AMX-INT8 at 1,024 rows, 1.4x at 80, slower at 64; docs/BENCHMARKS.md, 2026-12-06 late
    night); "int8" for a GGUF where AVX512-VNNI runs the integer kernels without AMX: an int8
    copy per channel of its blocks, whose fold is one multiply-add a block where Q4_1's is three
    (Zen 4, all 30 layers: 1.05-1.11x from 64 rows; docs/BENCHMARKS.md, 2026-12-07 tenth
    session); else None (the weights' own blocks at every row count, as on AVX2 and AVX-VNNI:
    unmeasured there). KVCLI_FAST_PREFILL=blocks keeps the blocks; =int8 asks for the int8
    copy of a GGUF's blocks; =bfloat16 for the bfloat16 copy wherever bf16 is native
    (PrecisionError elsewhere)."""
    if activations(quantization) != INT8_ACTIVATIONS:
        return None  # float32 activations (gguf): no integer kernels to stand in for
    wanted, flags = os.environ.get("KVCLI_FAST_PREFILL", ""), cpu_flags()
    if wanted not in ("", "blocks", "int8", "bfloat16"):
        raise PrecisionError(f"KVCLI_FAST_PREFILL={wanted!r}: expected blocks, int8 or bfloat16")
    if wanted == "bfloat16" and not _has("bfloat16", _NATIVE, flags):
        raise PrecisionError("KVCLI_FAST_PREFILL=bfloat16: this CPU has no native bfloat16 "
                             "(avx512_bf16 or amx_bf16 not in /proc/cpuinfo flags)")
    if wanted:
        copy = wanted if wanted != "blocks" else None
    elif "amx_bf16" in flags:
        copy = "bfloat16"
    else:
        copy = "int8" if "avx512_vnni" in flags else None
    # int8 weights are the int8 copy's own form already
    return None if copy == "int8" and quantization != "gguf-int" else copy


def _fast_few_rows(quantization: str) -> str | None:
    """fast's batched decode matmuls on integer-kernel weights: "int8" where the CPU has
    AMX-INT8 (quant/w8a8.py: an int8 copy per output channel, activations per 64 values; one
    SmolLM2-135M step's matmuls at 32 rows 13.9-14.2 ms vs 18.7-19.9 on the Q4_1 blocks, Xeon
    with AMX, weights cold, docs/BENCHMARKS.md 2026-12-07), else None. KVCLI_W8A8=0 keeps the
    weights' own kernels."""
    if activations(quantization) != INT8_ACTIVATIONS:
        return None
    return "int8" if native.w8a8_available(native.load()) else None


def _fast_kv() -> str | None:
    """fast's KV cache on the CPU: int8 where the native kernels read it in place (a
    quarter of float32's bytes a decode step streams; Zen 4, gguf-int weights, the bench's
    four workloads: 0.76-0.95x the time of a float32 cache, docs/BENCHMARKS.md), else the
    model's own."""
    return "int8" if native.load() is not None else None


def _fast_weights(quantization: str | None, may_quantize: bool) -> Precision:
    """fast's matmul weights on the CPU (fast_choice's)."""
    if quantization:
        return Precision("fast", "float32", "quantized weights are their own format",
                         quantization, prefill=_fast_prefill(quantization),
                         few_rows=_fast_few_rows(quantization))
    flags = cpu_flags()
    if may_quantize and native.qint_available(native.load()):  # AMX or not: measured faster
        return Precision("fast", "float32", "int8 weights on the integer kernels: half "
                         "bfloat16's bytes, integer multiply-adds (Zen 4 without AMX: faster "
                         "than bf16 on every workload; Xeon with AMX: 1.4-1.8x oneDNN's bf16 "
                         "on the batched workloads, 8x at batch 1)", "int8",
                         prefill=_fast_prefill("int8"), few_rows=_fast_few_rows("int8"))
    if "amx_bf16" in flags:
        return Precision("fast", "bfloat16", "AMX-BF16: oneDNN bf16 matmuls with float32 sums, "
                         "about half float32's CPU time where rows are many")
    if _has("bfloat16", _FAST, flags):
        return Precision("fast", "bfloat16", "AVX512_BF16: the native vdpbf16ps kernel, float32 "
                         "sums (faster than float32 at every row count measured)")
    why = ("--quantization none keeps float weights" if not may_quantize
           and native.qint_available(native.load()) else "no integer kernels")
    return Precision("fast", "float32", "no native bfloat16 on this CPU (emulated is slower "
                     f"than float32) and {why}")


def resolve_precision(preset: str, dtype: str | None, device: str,
                      checkpoint_dtype: str | None = None,
                      quantization: str | None = None,
                      may_quantize: bool = False) -> Precision:
    """The engine's precision: ``preset`` (exact, fast) for whatever ``dtype`` does not fix.

    An explicit ``dtype`` overrides the preset's weights (then the preset is reported as
    ``custom``; ``--precision fast --dtype float32`` keeps fast's other choice, the int8 KV
    cache); ``auto`` is ``checkpoint_dtype`` where it is fast here, else float32.
    PrecisionError: an unknown preset, or a dtype this CPU lacks.
    """
    if preset not in PRECISIONS:
        raise PrecisionError(f"--precision: expected one of {', '.join(PRECISIONS)}, "
                             f"got {preset!r}")
    if dtype is None:
        if preset == "fast":
            return fast_choice(device, quantization, may_quantize)
        if quantization:
            return Precision("exact", "float32", "quantized: greedy agreement with float32 "
                             "is measured, not guaranteed", quantization)
        return Precision("exact", "float32", "greedy outputs equal transformers' float32")
    reason = f"--dtype {dtype}"
    if dtype == "auto":
        dtype, reason = _auto(device, checkpoint_dtype)
    check_dtype(dtype, device)
    chosen = resolve_precision(preset, None, device, quantization=quantization)
    if chosen.weights == dtype:
        return chosen
    return Precision("custom", dtype, f"{reason}, over --precision {preset}'s {chosen.weights}",
                     quantization, chosen.kv_cache)


def _auto(device: str, checkpoint_dtype: str | None) -> tuple[str, str]:
    """--dtype auto's dtype and why."""
    stored = checkpoint_dtype or "float32"
    if stored in DTYPES and (not _is_cpu(device) or _has(stored, _FAST, cpu_flags())):
        return stored, f"--dtype auto: the checkpoint's {stored}"
    return "float32", f"--dtype auto: the checkpoint's {stored} is not fast here, float32"


def _is_cpu(device: str) -> bool:
    return str(device).split(":")[0] == "cpu"

"""kvcli's own rows of `kvcli bench`: what each row's engine is loaded from, and loading it.

A row (the reference `kvcli` and every `kvcli-*` of --compare) is a KvcliRow: plain data
that says how `kvcli generate` would load that engine. The bench loads it in its own process
(load_row) or hands it to a child process of its own (kvcli_process.py, --isolate), which
loads it with the same function, so both paths run the very same engine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcli.bench.systems import KVCLI
from kvcli.bench.workloads import BenchConfigError

if TYPE_CHECKING:
    from kvcli.bench.suite import BenchConfig

# kvcli on quantized weights (`--quantization`), measured against kvcli's float32 weights.
QUANTIZED = {"kvcli-gguf": "gguf", "kvcli-gguf-int": "gguf-int", "kvcli-int8": "int8"}
# kvcli at another precision (`--dtype`, `--precision`): (precision, dtype), measured likewise.
PRECISION_PEERS = {"kvcli-bf16": ("exact", "bfloat16"), "kvcli-fast": ("fast", None)}
# --precision fast on the GGUF itself (what `generate --precision fast` runs on the default
# model: its own blocks on the integer kernels, an int8 KV cache), where kvcli-fast runs the
# bench's float weights.
GGUF_FAST = "kvcli-gguf-fast"
# kvcli with another KV cache (`--kv-cache-dtype`), float32 weights, in the same run.
KV_DTYPES = {"kvcli-int8kv": "int8", "kvcli-bf16kv": "bfloat16"}
NO_CACHE = "kvcli-no-cache"  # the reference's engine with its prefix cache off
VARIANTS = (NO_CACHE, *QUANTIZED, *PRECISION_PEERS, GGUF_FAST, *KV_DTYPES)
# The options a load error of the reference row names (a variant's names its --compare).
REFERENCE_FLAGS = "--quantization / --precision / --dtype / --kv-cache-dtype"


@dataclass(frozen=True, slots=True)
class KvcliRow:
    """How one kvcli row's engine is loaded: `kvcli generate`'s options for it. JSON-able,
    so a child process can be handed it (kvcli_runner.py)."""

    name: str
    model: str  # a directory or a --model spec (a GGUF runs from its own spec)
    max_num_batched_tokens: int
    quantization: str | None = None
    precision: str = "exact"
    dtype: str | None = None
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True

    @property
    def flag(self) -> str:
        return REFERENCE_FLAGS if self.name == KVCLI else f"--compare {self.name}"


def kvcli_mode(cfg: BenchConfig) -> str | None:
    """The kvcli row's weights: --quantization resolved for --model as generate resolves it."""
    from kvcli.checkpoint.quant_modes import resolve_mode

    return resolve_mode(cfg.model, cfg.quantization, "cpu", cfg.dtype, cfg.precision)


def weights_spec(model_dir: Path, cfg: BenchConfig, mode: str | None) -> str:
    """What kvcli loads ``mode`` from: gguf runs a GGUF spec itself (as generate does, not via
    a conversion's record, whose source may be gone), anything else the bench's directory."""
    from kvcli.checkpoint.quant_modes import GGUF_MODES, spec_gguf

    return str(cfg.model) if mode in GGUF_MODES and spec_gguf(cfg.model) else str(model_dir)


def kvcli_row(name: str, model_dir: Path, cfg: BenchConfig) -> KvcliRow:
    """The row ``name`` (KVCLI or one of VARIANTS) of a bench of ``cfg`` on ``model_dir``."""
    base = KvcliRow(name, str(model_dir), cfg.max_num_batched_tokens,
                    kv_cache_dtype=cfg.kv_cache_dtype)
    if name in (KVCLI, NO_CACHE):
        mode = kvcli_mode(cfg)
        return replace(base, model=weights_spec(model_dir, cfg, mode), quantization=mode,
                       precision=cfg.precision, dtype=cfg.dtype,
                       enable_prefix_caching=name == KVCLI)
    if name in QUANTIZED:  # gguf from the GGUF spec or the file a directory came from
        mode = QUANTIZED[name]
        return replace(base, model=weights_spec(model_dir, cfg, mode), quantization=mode,
                       kv_cache_dtype="auto")
    if name in PRECISION_PEERS:  # as `generate --model DIR --precision ...` (--quantization auto)
        precision, dtype = PRECISION_PEERS[name]
        return replace(base, quantization="auto", precision=precision, dtype=dtype)
    if name == GGUF_FAST:
        return replace(base, model=weights_spec(model_dir, cfg, "gguf-int"),
                       quantization="auto", precision="fast", kv_cache_dtype="auto")
    if name in KV_DTYPES:  # its own model: the KV dtype picks the model's attention backend
        return replace(base, kv_cache_dtype=KV_DTYPES[name])
    raise KeyError(f"not a kvcli row: {name!r}")


def load_row(row: KvcliRow) -> Any:
    """The row's engine as a KvcliSystem in this process; a load that cannot work (bfloat16
    without it, gguf without a GGUF) is a BenchConfigError naming the row's options."""
    from kvcli.bench.systems import KvcliSystem

    try:
        return KvcliSystem.load(row.model, row.max_num_batched_tokens, row.quantization,
                                row.name, row.precision, row.dtype, row.kv_cache_dtype,
                                row.enable_prefix_caching)
    except ValueError as err:  # PrecisionError, QuantError
        raise BenchConfigError(f"{row.flag}: {err}") from None

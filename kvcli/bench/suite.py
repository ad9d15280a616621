"""`kvcli bench` end to end: resolve the model, load the systems once, run each workload."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcli.bench.openvino_system import VARIANTS as OPENVINO_VARIANTS
from kvcli.bench.workloads import WORKLOAD_NAMES, BenchConfigError
from kvcli.engine.config import EngineConfig

_ENGINE = EngineConfig()  # the engine options' defaults, for kvcli's own runs

# kvcli on quantized weights (`--quantization`), measured against kvcli's float32 weights.
QUANTIZED = {"kvcli-gguf": "gguf", "kvcli-gguf-int": "gguf-int", "kvcli-int8": "int8"}
# kvcli at another precision (`--dtype`, `--precision`): (precision, dtype), measured likewise.
PRECISION_PEERS = {"kvcli-bf16": ("exact", "bfloat16"), "kvcli-fast": ("fast", None)}
# kvcli with another KV cache (`--kv-cache-dtype`), float32 weights, in the same run.
KV_DTYPES = {"kvcli-int8kv": "int8", "kvcli-bf16kv": "bfloat16"}
OPENVINO_PEERS = tuple(OPENVINO_VARIANTS)  # float32 forced / its defaults on fp32, int8, int4
PEERS = ("hf-generate", "hf-generate-batch", "kvcli-no-cache", "vllm", *OPENVINO_PEERS,
         "llamacpp", *QUANTIZED, *PRECISION_PEERS, *KV_DTYPES)
DEFAULT_COMPARE = "hf-generate"
# Peers that need no float weights in the bench's model directory (else a GGUF is converted).
NATIVE_PEERS = {"llamacpp", "kvcli-gguf", "kvcli-gguf-int", "kvcli-no-cache"}


@dataclass(slots=True)
class BenchConfig:
    workloads: list[str]
    model: str | None = _ENGINE.model
    compare: list[str] = field(default_factory=lambda: [DEFAULT_COMPARE])
    num_prompts: int | None = None
    max_tokens: int | None = None
    seed: int = 0
    scale: float = 1.0
    repeat: int = 1
    threads: int | None = None
    hf_batch_size: int = 8
    hf_page_size: int = 32
    max_num_batched_tokens: int = _ENGINE.max_num_batched_tokens
    kv_cache_dtype: str = _ENGINE.kv_cache_dtype  # kvcli's (the reference's) KV cache
    warmup: bool = True
    vllm_python: Path | None = None
    openvino_python: Path | None = None
    llamacpp_server: Path | None = None
    quantization: str | None = _ENGINE.quantization  # the kvcli row's (auto: as generate)
    precision: str = _ENGINE.precision  # kvcli's own row (the reference): --precision, --dtype
    dtype: str | None = _ENGINE.dtype


def parse_compare(value: str) -> list[str]:
    """`hf-generate,hf-generate-batch` -> names; '' or 'none' -> []; unknown -> BenchConfigError."""
    names = [n.strip() for n in value.split(",") if n.strip() and n.strip() != "none"]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise BenchConfigError(f"unknown system(s) {', '.join(map(repr, unknown))}; "
                         f"choose from {', '.join(PEERS)}")
    return list(dict.fromkeys(names))


def expand_workloads(names: list[str]) -> list[str]:
    """Workload names in the order given, 'all' meaning every workload."""
    out: list[str] = []
    for name in names:
        for item in WORKLOAD_NAMES if name == "all" else (name,):
            if item not in WORKLOAD_NAMES:
                raise BenchConfigError(f"unknown workload {item!r}; choose from "
                                 f"{', '.join(WORKLOAD_NAMES)} or all")
            if item not in out:
                out.append(item)
    return out


def load_systems(model_dir: Path, cfg: BenchConfig, progress: Callable[[str], None]) -> list[Any]:
    from kvcli.bench.hf_systems import HFGenerateBatchSystem, HFGenerateSystem

    mode = kvcli_mode(cfg)
    spec = _weights_spec(model_dir, cfg, mode)
    progress(f"loading kvcli engine ({spec}, quantization {mode or 'none'})")
    kvcli = _load_kvcli(spec, cfg, None, cfg.precision, cfg.dtype, mode)
    systems: list[Any] = [kvcli]
    for name in cfg.compare:
        progress(f"loading {name}")
        if name == "llamacpp":
            systems.append(llamacpp_peer(cfg))
        elif name == "vllm":
            systems.append(start_vllm(model_dir, cfg, kvcli.max_model_len, progress))
        elif name in OPENVINO_PEERS:
            systems.append(start_openvino(model_dir, cfg, progress, name))
        elif name == "hf-generate":
            systems.append(HFGenerateSystem(model_dir, cfg.hf_batch_size))
        elif name == "hf-generate-batch":
            systems.append(HFGenerateBatchSystem(model_dir, cfg.hf_page_size,
                                                 cfg.max_num_batched_tokens))
        elif name in QUANTIZED:
            systems.append(load_quantized(name, model_dir, cfg))
        elif name in PRECISION_PEERS:
            # as `generate --model DIR --precision ...` (its default --quantization auto)
            systems.append(_load_kvcli(str(model_dir), cfg, name, *PRECISION_PEERS[name], "auto"))
        elif name in KV_DTYPES:  # its own model: the KV dtype picks the model's attention backend
            systems.append(_load_kvcli(str(model_dir), cfg, name, "exact", None,
                                       kv_cache_dtype=KV_DTYPES[name]))
        else:
            systems.append(kvcli.variant(name, enable_prefix_caching=False))
    return systems


def _weights_spec(model_dir: Path, cfg: BenchConfig, mode: str | None) -> str:
    """What kvcli loads ``mode`` from: gguf runs a GGUF spec itself (as generate does, not via
    a conversion's record, whose source may be gone), anything else the bench's directory."""
    from kvcli.checkpoint.quant_modes import GGUF_MODES, spec_gguf

    return str(cfg.model) if mode in GGUF_MODES and spec_gguf(cfg.model) else str(model_dir)


def bench_model_dir(cfg: BenchConfig, mode: str | None) -> Path:
    """The directory the report names and float peers load: the float32 conversion of a GGUF
    where a row needs float weights, else (a gguf kvcli row, gguf peers only) the GGUF's own
    directory, so the default model is not converted just to be benchmarked natively."""
    from kvcli.checkpoint.quant_modes import GGUF_MODES, spec_gguf
    from kvcli.model.gguf_convert import resolve_model

    native = mode in GGUF_MODES and spec_gguf(cfg.model) is not None
    if native and set(cfg.compare) <= NATIVE_PEERS:
        return Path(resolve_model(cfg.model, quantization=mode))
    return Path(resolve_model(cfg.model))


def kvcli_mode(cfg: BenchConfig) -> str | None:
    """The kvcli row's weights: --quantization resolved for --model as generate resolves it."""
    from kvcli.checkpoint.quant_modes import resolve_mode

    return resolve_mode(cfg.model, cfg.quantization, "cpu", cfg.dtype, cfg.precision)


def llamacpp_peer(cfg: BenchConfig) -> Any:
    """llama-server on the GGUF file behind --model (the default model's, or a .gguf)."""
    import torch

    from kvcli.bench.llamacpp_system import LlamaCppSystem
    from kvcli.checkpoint.quant_modes import spec_gguf

    gguf = spec_gguf(cfg.model)
    if gguf is None:
        raise BenchConfigError("--compare llamacpp: runs a GGUF file; --model "
                               f"{cfg.model} is not one (give the default model or a .gguf)")
    assert cfg.llamacpp_server is not None  # checked by the command before any loading
    return LlamaCppSystem(cfg.llamacpp_server, gguf, cfg.threads or torch.get_num_threads()).check()


def _load_kvcli(model_dir: str, cfg: BenchConfig, name: str | None, precision: str,
                dtype: str | None, quantization: str | None = None,
                kv_cache_dtype: str | None = None) -> Any:
    """kvcli's engine at ``precision`` / ``dtype`` / ``quantization`` / ``kv_cache_dtype``
    (default the bench's --kv-cache-dtype; ``name`` None: kvcli's own row)."""
    from kvcli.bench.systems import KVCLI, KvcliSystem

    try:
        return KvcliSystem.load(model_dir, cfg.max_num_batched_tokens, quantization,
                                name or KVCLI, precision, dtype,
                                kv_cache_dtype or cfg.kv_cache_dtype)
    except ValueError as err:  # PrecisionError, QuantError: bfloat16 without it, gguf without a GGUF
        flag = (f"--compare {name}" if name
                else "--quantization / --precision / --dtype / --kv-cache-dtype")
        raise BenchConfigError(f"{flag}: {err}") from None


def load_quantized(name: str, model_dir: Path, cfg: BenchConfig) -> Any:
    """kvcli with quantized weights: gguf runs the GGUF spec's tensors (or those of the file
    a directory was converted from, found by its record), int8 quantizes the reference
    directory's float32 weights at load."""
    from kvcli.bench.systems import KvcliSystem

    mode = QUANTIZED[name]
    try:
        return KvcliSystem.load(_weights_spec(model_dir, cfg, mode), cfg.max_num_batched_tokens,
                                mode, name)
    except ValueError as err:  # QuantError: e.g. no GGUF behind a safetensors model
        raise BenchConfigError(f"--compare {name}: {err}") from None


def start_vllm(model_dir: Path, cfg: BenchConfig, max_model_len: int,
               progress: Callable[[str], None]) -> Any:
    import torch

    from kvcli.bench.vllm_system import VllmSystem

    assert cfg.vllm_python is not None  # checked by the command before any loading
    progress("  vLLM compiles the model on every start (minutes); load is not timed")
    system = VllmSystem(cfg.vllm_python, model_dir, cfg.max_num_batched_tokens, max_model_len,
                        cfg.threads or torch.get_num_threads()).start()
    progress(f"  vllm {system.version} loaded in {system.load_s:.1f} s")
    return system


def start_openvino(model_dir: Path, cfg: BenchConfig, progress: Callable[[str], None],
                   name: str = "openvino") -> Any:
    import torch

    from kvcli.bench.openvino_system import OpenVinoSystem

    assert cfg.openvino_python is not None  # checked by the command before any loading
    system = OpenVinoSystem(cfg.openvino_python, model_dir, cfg.max_num_batched_tokens,
                            cfg.threads or torch.get_num_threads(), name=name)
    if system.needs_export:
        progress(f"  exporting the model to OpenVINO IR ({system.variant.weight_format} weights) "
                 f"in {system.ir_dir} (once, a minute or more; not timed)")
    system.start()
    progress(f"  {name} {system.version} loaded in {system.load_s:.1f} s ({system.precision})")
    return system


def run_bench(cfg: BenchConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    """The report: one workload's document, or {"runs": [...]} for several."""
    import torch

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    model_dir = bench_model_dir(cfg, kvcli_mode(cfg))
    systems = load_systems(model_dir, cfg, progress)
    try:
        docs = _run_workloads(cfg, systems, model_dir, progress)
    finally:
        for system in systems:
            if hasattr(system, "close"):
                system.close()
    return docs[0] if len(docs) == 1 else {"runs": docs}


def _run_workloads(cfg: BenchConfig, systems: list[Any], model_dir: Path,
                   progress: Callable[[str], None]) -> list[dict[str, Any]]:
    import torch

    from kvcli.bench.measure import machine_info
    from kvcli.bench.runner import check_fits, run_workload
    from kvcli.bench.workloads import build_workload
    from kvcli.checkpoint.resolve import DEFAULT_MODEL_NAME

    kvcli = systems[0]
    docs = []
    for name in cfg.workloads:
        workload = build_workload(name, kvcli.base.tokenizer, num_prompts=cfg.num_prompts,
                                  seed=cfg.seed, scale=cfg.scale, max_new_tokens=cfg.max_tokens)
        check_fits(workload, kvcli.max_model_len)
        machine = machine_info(torch.get_num_threads())
        section = run_workload(workload, systems, cfg.repeat, progress, cfg.warmup)
        docs.append({"workload": name, "model": cfg.model or DEFAULT_MODEL_NAME,
                     "model_dir": str(model_dir), "seed": cfg.seed, "scale": cfg.scale,
                     "machine": machine, **section})
    return docs

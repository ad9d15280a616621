"""`kvcli bench` end to end: resolve the model, load the systems once, run each workload."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcli.bench.kvcli_rows import (
    GGUF_FAST,
    KV_DTYPES,
    NO_CACHE,
    PRECISION_PEERS,
    QUANTIZED,
    VARIANTS,
    kvcli_mode,
)
from kvcli.bench.openvino_system import VARIANTS as OPENVINO_VARIANTS
from kvcli.bench.systems import KVCLI
from kvcli.bench.workloads import WORKLOAD_NAMES, BenchConfigError
from kvcli.engine.config import EngineConfig

_ENGINE = EngineConfig()  # the engine options' defaults, for kvcli's own runs

OPENVINO_PEERS = tuple(OPENVINO_VARIANTS)  # float32 forced / its defaults on fp32, int8, int4
PEERS = ("hf-generate", "hf-generate-batch", NO_CACHE, "vllm", *OPENVINO_PEERS,
         "llamacpp", *QUANTIZED, *PRECISION_PEERS, GGUF_FAST, *KV_DTYPES)
DEFAULT_COMPARE = "hf-generate"
# Peers that need no float weights in the bench's model directory (else a GGUF is converted).
NATIVE_PEERS = {"llamacpp", "kvcli-gguf", "kvcli-gguf-int", GGUF_FAST, NO_CACHE}


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
    # kvcli's rows each in a process of its own (kvcli_process.py); None: when --compare
    # names a kvcli-* row, so no row's peak RSS is that of several engines
    isolate: bool | None = None

    @property
    def isolated(self) -> bool:
        return any(n in VARIANTS for n in self.compare) if self.isolate is None else self.isolate


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
    """kvcli's row, then every --compare system in order; on a failure, those already
    started are closed."""
    systems: list[Any] = []
    try:
        kvcli = _kvcli_system(KVCLI, model_dir, cfg, progress)
        systems.append(kvcli)
        for name in cfg.compare:
            progress(f"loading {name}")
            systems.append(_peer(name, kvcli, model_dir, cfg, progress))
    except BaseException:
        for system in systems:
            if hasattr(system, "close"):
                system.close()
        raise
    return systems


def _peer(name: str, kvcli: Any, model_dir: Path, cfg: BenchConfig,
          progress: Callable[[str], None]) -> Any:
    from kvcli.bench.hf_systems import HFGenerateBatchSystem, HFGenerateSystem

    if name == "llamacpp":
        return llamacpp_peer(cfg)
    if name == "vllm":
        return start_vllm(model_dir, cfg, kvcli.max_model_len, progress)
    if name in OPENVINO_PEERS:
        return start_openvino(model_dir, cfg, progress, name)
    if name == "hf-generate":
        return HFGenerateSystem(model_dir, cfg.hf_batch_size)
    if name == "hf-generate-batch":
        return HFGenerateBatchSystem(model_dir, cfg.hf_page_size, cfg.max_num_batched_tokens)
    if name == NO_CACHE and not cfg.isolated:  # the reference's engine, weights shared
        return kvcli.variant(name, enable_prefix_caching=False)
    return _kvcli_system(name, model_dir, cfg, progress)


def _kvcli_system(name: str, model_dir: Path, cfg: BenchConfig,
                  progress: Callable[[str], None]) -> Any:
    """A kvcli row: loaded here, or (--isolate) started in a process of its own."""
    from kvcli.bench.kvcli_process import KvcliProcessSystem
    from kvcli.bench.kvcli_rows import kvcli_row, load_row

    row = kvcli_row(name, model_dir, cfg)
    if name == KVCLI:
        progress(f"loading kvcli engine ({row.model}, quantization {row.quantization or 'none'})")
    if not cfg.isolated:
        return load_row(row)
    system = KvcliProcessSystem(row, cfg.threads).start()
    progress(f"  {name} loaded in its own process in {system.load_s:.1f} s "
             f"(RSS {system.load_rss_mb} MiB)")
    return system


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
    from kvcli.checkpoint.resolve import DEFAULT_MODEL_NAME

    kvcli = systems[0]
    docs = []
    for name in cfg.workloads:
        workload = kvcli.workload(name, num_prompts=cfg.num_prompts, seed=cfg.seed,
                                  scale=cfg.scale, max_new_tokens=cfg.max_tokens)
        check_fits(workload, kvcli.max_model_len)
        machine = machine_info(torch.get_num_threads())
        section = run_workload(workload, systems, cfg.repeat, progress, cfg.warmup)
        docs.append({"workload": name, "model": cfg.model or DEFAULT_MODEL_NAME,
                     "model_dir": str(model_dir), "seed": cfg.seed, "scale": cfg.scale,
                     "isolated": cfg.isolated, "machine": machine, **section})
    return docs

"""``kvcli generate --ray``: the local batch job (kvcli.batch.run) with a pool of Ray actors as its engine.

Everything the local command does stays in kvcli.batch: cheap path checks,
``--resume``, lazy reading, parsing and encoding (so token ids equal a local
run's), the writer, ``--ordered``, the summary and exit codes. This module only
supplies the engine: a :class:`WorkerPool` built once the cheap checks passed.
The driver loads the tokenizer (not the model) to encode requests and route them.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvcli.batch.run import BatchUsageError, GenerateConfig, run_generate
from kvcli.distributed.cluster import Cluster, ClusterError, start_cluster
from kvcli.distributed.options import RayOptions
from kvcli.distributed.pool import WorkerPool, WorkerPoolError
from kvcli.distributed.routing import make_router
from kvcli.engine.config import EngineConfig

EXIT_FAILED = 1


def run_generate_on_ray(cfg: GenerateConfig, opts: RayOptions) -> int:
    """The command's exit status, as :func:`kvcli.batch.run.run_generate` gives it."""
    opts.validate()
    clusters: list[Cluster] = []

    def factory(cfg: GenerateConfig) -> WorkerPool:
        tokenizer = _load_tokenizer(cfg)
        try:
            cluster = start_cluster(opts, actor_engine_config(cfg, opts), cfg.quiet,
                                    forward_logs=not cfg.to_stdout)
        except ClusterError as err:
            raise BatchUsageError(str(err)) from None
        clusters.append(cluster)
        return build_pool(cfg, opts, cluster, tokenizer)

    try:
        return run_generate(cfg, factory)
    except WorkerPoolError as err:
        how = "" if cfg.to_stdout else f"; rerun with --resume -o {cfg.output} to finish"
        print(f"kvcli generate: stopped: {err}{how}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        for cluster in clusters:
            cluster.close()


def actor_engine_config(cfg: GenerateConfig, opts: RayOptions) -> EngineConfig:
    """The EngineConfig each actor builds: a local model path made absolute, GPUs -> cuda."""
    engine = replace(cfg.engine)
    model = engine.model
    if model and Path(model).expanduser().exists():  # actors may run in another directory
        engine.model = str(Path(model).expanduser().resolve())
    if opts.worker_gpus > 0 and engine.device == "cpu":
        engine.device = "cuda"  # Ray gives the actor its GPU(s) as CUDA_VISIBLE_DEVICES
    return engine


def build_pool(cfg: GenerateConfig, opts: RayOptions, cluster: Cluster,
               tokenizer: Any) -> WorkerPool:
    first = cluster.infos[0]
    workers = len(cluster.handles)
    in_flight = opts.max_in_flight or math.ceil(opts.load_factor * cfg.max_pending / workers)
    if not cfg.quiet:
        nodes = sorted({i.node for i in cluster.infos})
        share = f"{opts.worker_cpus:g} CPU" + (f", {opts.worker_gpus:g} GPU" if opts.worker_gpus
                                               else "")
        print(f"kvcli generate: {workers} Ray workers ({share} each) on {', '.join(nodes)}; "
              f"routing by {'prefix' if opts.routing == 'prefix' else 'random choice'}",
              file=sys.stderr)
    router = make_router(opts.routing, workers, opts.load_factor, opts.seed)
    return WorkerPool(cluster.handles, [i.node for i in cluster.infos], router, tokenizer,
                      first.max_model_len, first.vocab_size, cfg.engine.block_size,
                      opts.affinity_blocks, max(1, in_flight), opts.max_restarts)


def _load_tokenizer(cfg: GenerateConfig) -> Any:
    """The model's tokenizer, on the driver (raises ValueError/OSError: "cannot load model")."""
    from kvcli.checkpoint.quant_modes import resolve_mode
    from kvcli.model.gguf_convert import resolve_model
    from kvcli.tokenizer import Tokenizer

    engine = cfg.engine
    mode = resolve_mode(engine.model, engine.quantization, engine.device, engine.dtype,
                        engine.precision)
    model_dir = resolve_model(engine.model, allow_pickle=engine.allow_pickle, quantization=mode)
    tokenizer = Tokenizer.from_dir(model_dir)
    if engine.chat_template is not None:  # --chat-template: as the engines render
        tokenizer.set_chat_template(engine.chat_template)
    return tokenizer

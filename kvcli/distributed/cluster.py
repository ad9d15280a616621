"""Connecting to Ray and starting the engine actors.

``--ray`` alone starts a local Ray instance (stopped again at the end); an
address joins a running cluster as a driver (``auto``, ``host:6379``,
``ray://host:10001``). A driver that already called ``ray.init`` (a notebook,
the tests) keeps its connection. Actors are named ``kvcli-worker-<run>-<i>`` so
``ray list actors`` shows them; Ray restarts a dead one up to ``max_restarts``
times (``max_task_retries=0``: the pool re-sends the lost work itself).
"""

from __future__ import annotations

import logging
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayError

from kvcli.distributed.options import RayOptions
from kvcli.distributed.worker import EngineWorker, WorkerInfo
from kvcli.engine.config import EngineConfig

READY_NOTE_EVERY_S = 30.0
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class ClusterError(Exception):
    """Ray could not be reached, or the workers could not start (a usage problem: exit 2)."""


@dataclass(slots=True)
class Cluster:
    started_here: bool  # this process called ray.init, so it disconnects (or stops Ray) at the end
    handles: list[Any]
    infos: list[WorkerInfo]

    def close(self) -> None:
        for handle in self.handles:
            try:
                ray.kill(handle, no_restart=True)
            except (RayError, ValueError):
                pass  # already gone
        self.handles = []
        if self.started_here and ray.is_initialized():
            ray.shutdown()


def connect(opts: RayOptions, forward_logs: bool = True, quiet: bool = False) -> bool:
    """``ray.init`` unless already connected; True when this call connected.

    ``forward_logs=False`` keeps the actors' output off the driver's terminal: Ray would
    print an actor's stdout on the driver's stdout, in the middle of results written there.
    """
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"logging_level": logging.ERROR if quiet else logging.WARNING,
                              "log_to_driver": forward_logs}
    try:
        if opts.starts_local:
            ray.init(include_dashboard=False, **kwargs)
        else:
            ray.init(address=opts.address, **kwargs)
    except Exception as err:  # Ray raises ConnectionError, RuntimeError, ValueError... alike
        where = "a local Ray instance" if opts.starts_local else f"Ray at {opts.address!r}"
        raise ClusterError(f"cannot start or reach {where}: {err}") from None
    return True


def worker_count(opts: RayOptions, local: bool) -> int:
    """``--workers``, or as many as the cluster's free CPUs (GPUs) allow; checked on a local instance."""
    resources = ray.cluster_resources()
    cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
    fit = int(cpus // opts.worker_cpus)
    if opts.worker_gpus > 0:
        fit = min(fit, int(gpus // opts.worker_gpus))
    workers = opts.workers if opts.workers is not None else max(1, fit)
    need_cpus, need_gpus = workers * opts.worker_cpus, workers * opts.worker_gpus
    if need_cpus <= cpus + 1e-9 and need_gpus <= gpus + 1e-9:
        return workers
    what = (f"{workers} workers x {opts.worker_cpus:g} CPU"
            + (f" x {opts.worker_gpus:g} GPU" if opts.worker_gpus else "")
            + f" need {need_cpus:g} CPUs{f' and {need_gpus:g} GPUs' if need_gpus else ''}; "
            f"the cluster has {cpus:g} CPUs and {gpus:g} GPUs")
    if local:
        raise ClusterError(f"{what}: lower --workers / --worker-cpus / --worker-gpus")
    print(f"kvcli generate: {what}; the workers wait until Ray finds room (autoscaling)",
          file=sys.stderr)
    return workers


def start_workers(opts: RayOptions, engine: EngineConfig, count: int) -> list[Any]:
    actor_class = ray.remote(EngineWorker)
    run = uuid.uuid4().hex[:8]
    threads = max(1, int(opts.worker_cpus))
    # Ray sets OMP_NUM_THREADS to the actor's CPUs only when the driver has none set, and the
    # engine's small matmuls go through OpenBLAS: pin every pool to the actor's share.
    env = {name: str(threads) for name in THREAD_ENV}
    return [
        actor_class.options(name=f"kvcli-worker-{run}-{i}", num_cpus=opts.worker_cpus,
                            num_gpus=opts.worker_gpus, max_restarts=opts.max_restarts,
                            max_task_retries=0, runtime_env={"env_vars": env},
                            ).remote(engine, threads)
        for i in range(count)
    ]


def wait_ready(handles: list[Any], quiet: bool) -> list[WorkerInfo]:
    """Each actor's engine facts, once its model is loaded; a worker that cannot start is an error."""
    refs = [h.info.remote() for h in handles]
    pending = list(refs)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=READY_NOTE_EVERY_S)
        if pending and not quiet:
            print(f"kvcli generate: waiting for {len(pending)} of {len(handles)} Ray workers to "
                  "start (loading the model, or waiting for free resources)", file=sys.stderr)
    infos = []
    for i, ref in enumerate(refs):
        try:
            infos.append(ray.get(ref))
        except RayError as err:
            raise ClusterError(f"Ray worker {i} could not start: {describe_error(err)}") from None
    return infos


def start_cluster(opts: RayOptions, engine: EngineConfig, quiet: bool,
                  forward_logs: bool = True) -> Cluster:
    started = connect(opts, forward_logs, quiet)
    cluster = Cluster(started, [], [])
    try:
        count = worker_count(opts, local=started and opts.starts_local)
        cluster.handles = start_workers(opts, engine, count)
        cluster.infos = wait_ready(cluster.handles, quiet)
    except BaseException:
        cluster.close()
        raise
    return cluster


def describe_error(err: BaseException) -> str:
    """A Ray error in one line: its type and the last line of its message (often a remote
    traceback, whose last line names the cause)."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1][:200]}" if lines else type(err).__name__

"""Settings of a Ray run, and the check that Ray is installed (importable without Ray)."""

from __future__ import annotations

from dataclasses import dataclass

from kvcli.engine.config import option

INSTALL_HINT = "pip install 'kvcli[ray]'"


class RayMissingError(Exception):
    """``--ray`` was given but the optional Ray dependency is not installed."""


@dataclass(slots=True)
class RayOptions:
    address: str | None = None  # None / "local": start a local Ray instance; else ray.init(address)
    # The flags of `kvcli generate --ray` (kvcli/commands/options.py derives them).
    workers: int | None = option(None, min=1, help="With --ray: engine actors (default: as many "
                                 "as the cluster's CPUs, or GPUs, allow).")
    worker_cpus: float = option(  # also the actor's torch thread count (at least 1)
        1.0, min=0, min_open=True, help="With --ray: CPUs per actor (also its torch threads).")
    worker_gpus: float = option(  # > 0 runs the engine on "cuda"
        0.0, min=0, help="With --ray: GPUs per actor (> 0 runs the engine on cuda).")
    max_restarts: int = 3  # Ray restarts of one actor before its work moves to the others
    routing: str = "prefix"  # "prefix" (affinity with bounded load) | "random" (for comparison)
    affinity_blocks: int = 4  # a request's routing key: the chain hash of its first N full blocks
    load_factor: float = 1.25  # no worker takes more than this times the average load
    max_in_flight: int | None = None  # per actor; None: the job's window split over the workers
    seed: int = 0  # of the random router

    @property
    def starts_local(self) -> bool:
        return self.address in (None, "local")

    def validate(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError("workers: expected an integer >= 1")
        if self.worker_cpus <= 0 or self.worker_gpus < 0:
            raise ValueError("worker_cpus: expected > 0 (and worker_gpus >= 0)")
        if self.routing not in ("prefix", "random"):
            raise ValueError(f"routing: expected 'prefix' or 'random', got {self.routing!r}")
        if self.affinity_blocks < 1 or self.load_factor < 1.0 or self.max_restarts < 0:
            raise ValueError("affinity_blocks >= 1, load_factor >= 1 and max_restarts >= 0")


def require_ray() -> None:
    """Raise :class:`RayMissingError` naming the install command when Ray is absent."""
    try:
        import ray  # noqa: F401
    except ImportError as err:
        raise RayMissingError(f"--ray needs Ray, which is not installed ({err}); install it "
                              f"with: {INSTALL_HINT}") from None

"""What ``--device`` and ``--kv-cache-memory`` ask of this machine, checked before the model
loads, so a request it cannot meet names its flag and the real cause instead of failing deep
in torch ("Cannot allocate memory", an ``AssertionError``, torch's list of device types)."""

from __future__ import annotations

import os
from typing import Any

from kvcli.engine.config import EngineConfig

#: The device types kvcli's engine runs on.
DEVICE_TYPES = ("cpu", "cuda")


class ResourceError(ValueError):
    """A flag this machine cannot honour: a usage error (exit 2). A ValueError, as every
    load failure load_engine raises, so its other callers (kvcli serve) need no new case."""


def gib(n: int) -> str:
    return f"{n / 2**30:,.0f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def machine_memory() -> int | None:
    """Physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_device(spec: str) -> Any:
    """``--device`` as a torch device this build and machine can use (imports torch)."""
    import torch

    kind = spec.split(":", 1)[0].strip().lower()
    if kind not in DEVICE_TYPES:
        raise ResourceError(f"--device {spec}: unknown device; use " + " or ".join(DEVICE_TYPES)
                            + " (cuda:N for one GPU)")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ResourceError(f"--device {spec}: not a device name; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.backends.cuda.is_built():
            raise ResourceError(f"--device {spec}: this torch build has no CUDA (torch "
                                f"{torch.__version__}); install a CUDA build of torch, or use "
                                "--device cpu")
        if not torch.cuda.is_available():
            raise ResourceError(f"--device {spec}: no CUDA device is visible (check the driver "
                                "and CUDA_VISIBLE_DEVICES), or use --device cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ResourceError(f"--device {spec}: this machine has {count} CUDA device"
                                f"{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1})")
    return device


def device_memory(device: Any) -> tuple[int | None, str]:
    """Memory the KV cache would live in, and what to call it."""
    if device.type == "cuda":
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory, f"{device}'s memory"
    return machine_memory(), "this machine's memory"


def check_kv_memory(kv_cache_memory: int | None, device: Any) -> None:
    """``--kv-cache-memory`` must fit in the memory it is allocated in (with the weights
    beside it, which the load reports itself if they do not fit)."""
    if kv_cache_memory is None:
        return
    total, where = device_memory(device)
    if total is not None and kv_cache_memory > total:
        raise ResourceError(f"--kv-cache-memory {gib(kv_cache_memory)} is more than {where} "
                            f"({gib(total)}); give a smaller SIZE")


def check_engine_options(engine: EngineConfig) -> None:
    """Both checks, for the engine options of ``kvcli generate`` (kvcli/batch/run.py)."""
    device = check_device(engine.device)
    check_kv_memory(engine.kv_cache_memory, device)

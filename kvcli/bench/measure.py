"""Measurements around a benchmark run: peak RSS, latency percentiles, machine facts.

All systems run in one process, so the process-wide peak RSS (ru_maxrss) only grows.
On Linux the kernel's high-water mark can be reset (`5` to /proc/self/clear_refs),
which gives each run its own peak; elsewhere the peak is reported as unknown.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The peers' runners read the same counters in their own processes (peer_serve.py).
from kvcli.bench.peer_serve import reset_peak
from kvcli.bench.peer_serve import status_kib as _status_kib
from kvcli.calibration import cpu_model  # one definition: the stored rates are keyed by it


@dataclass(slots=True)
class RssTracker:
    """Peak resident memory of the process during one run, and its growth over the run."""

    start_kib: int | None = None

    def start(self) -> None:
        # VmHWM restarts from the current RSS; growth is measured from that RSS
        self.start_kib = _status_kib("VmRSS") if reset_peak() else None

    def stop(self) -> tuple[float | None, float | None]:
        """(peak RSS MiB, peak minus RSS at start MiB), or Nones where unmeasurable."""
        peak = _status_kib("VmHWM") if self.start_kib is not None else None
        if peak is None or self.start_kib is None:
            return None, None
        return round(peak / 1024, 1), round((peak - self.start_kib) / 1024, 1)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def latency_summary(values: list[float]) -> dict[str, float | None]:
    return {
        "ttft_mean_s": statistics.fmean(values) if values else None,
        "ttft_p50_s": percentile(values, 50),
        "ttft_p90_s": percentile(values, 90),
    }


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) jiffies of every CPU together (/proc/stat), or None off Linux."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + fields[4], sum(fields[:8])  # idle + iowait; user..steal


def wait_for_quiet(timeout_s: float = 15.0, window_s: float = 0.25, idle_share: float = 0.9
                   ) -> float:
    """Until the machine's CPUs were ``idle_share`` idle over a ``window_s`` window, at most
    ``timeout_s``; returns the seconds waited. vLLM's idle engine can keep a core busy for
    seconds after a batch (a per-process CPU trace, docs/BENCHMARKS.md, 2026-12-08): no row is
    timed beside such leftover work."""
    start = time.monotonic()
    before = _cpu_times()
    while before is not None and time.monotonic() - start < timeout_s:
        time.sleep(window_s)
        after = _cpu_times()
        if after is None:
            break
        idle, total = after[0] - before[0], after[1] - before[1]
        if total > 0 and idle >= idle_share * total:
            break
        before = after
    return round(time.monotonic() - start, 2)


def float32_gflops() -> float:
    """The machine's float32 speed now: GFLOP/s of one fixed torch matmul (1,024 x 576 by
    576 x 1,536, best of 5, ~0.1 s). A VM's host moved it 1.5x within an hour with nothing else
    running (docs/BENCHMARKS.md, 2026-12-03), so each workload records it at its start and end
    beside the load: ratios between systems of one run hold; seconds across runs only at equal
    speed."""

    import torch

    a, b = torch.randn(1024, 576), torch.randn(576, 1536)
    a @ b  # wakes the threads
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return round(2 * 1024 * 576 * 1536 / best / 1e9, 1)


def cpu_kind() -> str:
    """Family/model and vector ISA, e.g. "family 26 model 2, avx512": "AMD EPYC" alone names
    Zen 3 (AVX2) and Zen 5 (AVX-512) machines alike, and the kernels differ between them."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return ""
    flags = set(fields.get("flags", "").split())
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"
    return f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}, {isa}"


def machine_info(threads: int) -> dict[str, Any]:
    """What decides CPU timings: cores, load, library versions, thread settings."""
    import torch
    import transformers

    return {
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_kind": cpu_kind(),
        "load_avg_1_5_15": load_average(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "threads": threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "openblas_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
    }

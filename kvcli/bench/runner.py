"""Run systems on one workload, alternating, and turn the timings into a report document.

Every system first runs a short warm-up, then each repeat runs all systems one after
another on the same token ids (the order rotates between repeats so slow drift in the
machine's load does not always favour the same system). The best and the median wall
time of each system are reported; speedups are ratios of walls from this same run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvcli.bench.measure import (
    RssTracker,
    float32_gflops,
    latency_summary,
    load_average,
    wait_for_quiet,
)
from kvcli.bench.systems import KVCLI, BenchSystem, RunResult
from kvcli.bench.workloads import BenchConfigError, Workload

Progress = Callable[[str], None]
WARMUP_PROMPTS = 2
WARMUP_NEW_TOKENS = 4


@dataclass(slots=True)
class TimedRun:
    result: RunResult
    wall_s: float
    peak_rss_mb: float | None
    rss_growth_mb: float | None
    quiet_wait_s: float = 0.0  # waited before it for the machine's CPUs to go idle


def check_fits(workload: Workload, max_model_len: int) -> None:
    """A clear error before any timing when a prompt cannot fit the model's context."""
    for i, prompt in enumerate(workload.prompts):
        if len(prompt) + workload.max_new_tokens > max_model_len:
            raise BenchConfigError(
                f"workload {workload.name}: prompt {i} has {len(prompt)} tokens + "
                f"{workload.max_new_tokens} new > the model's context of {max_model_len} "
                "(lower --scale or --max-tokens)")


def timed_run(system: BenchSystem, prompts: list[list[int]], max_new_tokens: int) -> TimedRun:
    before = getattr(system, "before_run", None)
    if before is not None:  # untimed: a peer that can only empty its prefix cache by a rebuild
        before(prompts, max_new_tokens)
    # Untimed: whatever ran before (a peer whose engine spins on after its batch) lets go of
    # the cores, so no row is timed beside another's leftover work.
    quiet = wait_for_quiet()
    rss = RssTracker()
    rss.start()
    start = time.perf_counter()
    result = system.run(prompts, max_new_tokens)
    wall = time.perf_counter() - start
    peak, growth = rss.stop()
    if result.peak_rss_mb is not None:  # the system ran in its own process: its own peak
        peak, growth = result.peak_rss_mb, result.rss_growth_mb
    return TimedRun(result, wall, peak, growth, quiet)


def run_workload(workload: Workload, systems: list[BenchSystem], repeat: int,
                 progress: Progress, warmup: bool = True) -> dict[str, Any]:
    """Time every system `repeat` times on `workload`; the report's workload section."""
    if systems[0].name != KVCLI:
        raise ValueError("systems: kvcli must come first (it is the reference)")
    load_start, speed_start = load_average(), float32_gflops()
    guard = PeerGuard(workload.name, progress)
    for system in systems:  # per-workload allocations that the peers make at load (untimed)
        prepare = getattr(system, "prepare", None)
        if prepare is not None:
            guard(system, "prepare", prepare, workload.prompts, workload.max_new_tokens)
    if warmup:
        for system in systems:
            progress(f"[{workload.name}] warm-up {system.name}")
            guard(system, "warm-up", system.run, workload.prompts[:WARMUP_PROMPTS],
                  min(WARMUP_NEW_TOKENS, workload.max_new_tokens))
    runs: dict[str, list[TimedRun]] = {s.name: [] for s in systems}
    for r in range(repeat):
        shift = r % len(systems)
        for system in systems[shift:] + systems[:shift]:
            if system.name in guard.failed:
                continue
            progress(f"[{workload.name}] run {r + 1}/{repeat} {system.name} "
                     f"({len(workload.prompts)} prompts, load {load_average()})")
            timed = guard(system, f"run {r + 1}", timed_run, system, workload.prompts,
                          workload.max_new_tokens)
            if timed is not None:
                runs[system.name].append(timed)
                waited = f" (after {timed.quiet_wait_s:.1f} s for quiet CPUs)" if timed.quiet_wait_s > 1 else ""
                progress(f"[{workload.name}]   {system.name}: {timed.wall_s:.2f} s{waited}")
    for name in guard.failed:
        del runs[name]
    reference = min(runs[KVCLI], key=lambda t: t.wall_s).result.outputs
    exact = {s.name: getattr(s, "exact", True) for s in systems}
    # Each row's precision: kvcli's from its engine, the peers' as they are run (float32).
    precision = {s.name: {"precision": getattr(s, "precision", "float32"),
                          "weights": getattr(s, "weights_kind", "float32")} for s in systems}
    entries = [{"name": s.name, "error": guard.failed[s.name], **precision[s.name]}
               if s.name in guard.failed else
               {**system_entry(s.name, runs[s.name], workload, reference, exact[s.name]),
                **precision[s.name]} for s in systems]
    best = {name: min(t.wall_s for t in timed) for name, timed in runs.items()}
    median = {name: statistics.median(t.wall_s for t in timed) for name, timed in runs.items()}
    peers = [s.name for s in systems[1:] if s.name in runs]
    return {
        "workload": workload.name,
        "description": workload.description,
        "num_prompts": len(workload.prompts),
        "prompt_tokens": workload.prompt_tokens,
        "max_new_tokens": workload.max_new_tokens,
        "repeat": repeat,
        "load_avg_start": load_start,
        "load_avg_end": load_average(),
        # The machine's own speed (measure.float32_gflops) at the start and the end.
        "float32_gflops_start": speed_start,
        "float32_gflops_end": float32_gflops(),
        "systems": entries,
        # Ratios of unrounded walls from this same run: > 1 means kvcli was faster.
        "speedup": {p: round(best[p] / best[KVCLI], 3) for p in peers},
        "speedup_median": {p: round(median[p] / median[KVCLI], 3) for p in peers},
    }


class PeerGuard:
    """Runs one step of a system; a peer's failure (a server that does not start, a crash, a
    lost connection) becomes its row's error for the rest of the workload and the other
    systems go on, so one broken peer never costs the others' measurements. kvcli's own
    failure ends the bench: it is the reference."""

    def __init__(self, workload: str, progress: Progress) -> None:
        self.workload, self.progress = workload, progress
        self.failed: dict[str, str] = {}

    def __call__(self, system: BenchSystem, stage: str, call: Any, *args: Any) -> Any:
        if system.name in self.failed:
            return None
        try:
            return call(*args)
        except Exception as exc:  # any peer failure: recorded on its row, the rest still run
            if system.name == KVCLI:
                raise
            self.failed[system.name] = f"{stage}: {type(exc).__name__}: {exc}"
            self.progress(f"[{self.workload}] {system.name} failed ({self.failed[system.name]}); "
                          "the other systems go on")
            return None


def first_divergence(output: list[int], reference: list[int]) -> int | None:
    """Index of the first token where two greedy outputs differ; None when they are equal."""
    for i, (a, b) in enumerate(zip(output, reference, strict=False)):
        if a != b:
            return i
    return None if len(output) == len(reference) else min(len(output), len(reference))


def greedy_agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict[str, Any]:
    """How far a system's greedy outputs follow the reference's: the share of identical
    outputs, and where the others first differ (token index, 0 = the first new token)."""
    firsts = [first_divergence(o, r) for o, r in zip(outputs, reference, strict=True)]
    diverged = [f for f in firsts if f is not None]
    agreeing = [len(r) if f is None else f for f, r in zip(firsts, reference, strict=True)]
    return {
        "identical_share": round(1 - len(diverged) / len(reference), 4) if reference else None,
        "diverged": len(diverged),
        # over the outputs that differ; None when none does
        "mean_first_divergence": round(statistics.fmean(diverged), 2) if diverged else None,
        # over all outputs, an identical one counting its whole length
        "mean_agreeing_tokens": round(statistics.fmean(agreeing), 2) if agreeing else None,
    }


def system_entry(name: str, timed: list[TimedRun], workload: Workload,
                 reference: list[list[int]], exact: bool = True) -> dict[str, Any]:
    """One system's line of the report: its best run's numbers plus the median wall."""
    best = min(timed, key=lambda t: t.wall_s)
    walls = [t.wall_s for t in timed]
    median = statistics.median(walls)
    res = best.result
    generated = sum(len(o) for o in res.outputs)
    prompt_tokens = workload.prompt_tokens
    matching = sum(a == b for a, b in zip(res.outputs, reference, strict=True))
    return {
        "name": name,
        "wall_s": round(best.wall_s, 5),
        "wall_s_median": round(median, 5),
        "wall_s_runs": [round(w, 5) for w in walls],
        "quiet_wait_s_runs": [t.quiet_wait_s for t in timed],
        "prompt_tokens": prompt_tokens,
        "prefill_tokens_computed": res.prefill_tokens_computed,
        "cached_tokens": res.cached_tokens,
        "generated_tokens": generated,
        "output_tok_s": round(generated / best.wall_s, 2),
        "output_tok_s_median": round(generated / median, 2),
        "total_tok_s": round((prompt_tokens + generated) / best.wall_s, 2),
        **{k: None if v is None else round(v, 6) for k, v in latency_summary(res.ttfts).items()},
        "peak_rss_mb": best.peak_rss_mb,
        "rss_growth_mb": best.rss_growth_mb,
        # True: the peak is of a process that ran this system alone (a peer, an isolated
        # kvcli row); False: of the bench's process, shared by every system run in it
        "rss_own_process": res.peak_rss_mb is not None,
        "kv_utilization": res.kv_utilization,
        "outputs_match": matching == len(reference),
        "outputs_matching": matching,
        "outputs_total": len(reference),
        # False for quantized weights: differing outputs are measured, not a failure
        "exact": exact,
        "agreement": greedy_agreement(res.outputs, reference),
        "details": res.details,
    }

"""What a run did: per-request counters kept by the job, merged with the engine's own metrics.

Every counter of the summary is defined here, once, and the ones that describe the same tokens
add up (tests/test_reliability_messages.py checks it for n > 1, interrupts, preemption and
resume):

- ``ok`` / ``failed``: result lines this run wrote; ``skipped``: lines already in the output
  (--resume). A result held back by ``--ordered`` or lost to a full disk is not counted, so
  the counts always match the file.
- ``prompt_tokens``, ``cached_tokens``, ``generated_tokens``: the sums of the written lines'
  ``usage`` (one prompt per line, however many samples; cached = the first sample's
  prefix-cache hit); ``hit_rate`` = cached / prompt.
- ``sequences``: the written lines' samples (``n`` each); ``sequence_prompt_tokens``: their
  prompts, one per sample.
- ``prefill_tokens_computed`` + ``prefill_tokens_skipped`` (cache hits): all the prefill work
  the engine did in this run (every sample, every admission). It is, exactly,
  ``sequence_prompt_tokens`` + ``prefill_tokens_recomputed`` (tokens prefilled again after a
  preemption, prompt and generated so far) + ``prefill_tokens_unwritten`` (work for requests
  whose result was not written: interrupted, or lost with a write).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from kvcli.engine.outputs import RequestOutput
from kvcli.numbers import percent, plural


@dataclass(slots=True, frozen=True)
class Tally:
    """What one result line adds to the counters once it is written."""

    ok: bool
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    sequences: int = 0
    prefill_computed: int = 0
    prefill_skipped: int = 0
    sequence_prompt_tokens: int = 0  # the prompt tokens its sequences prefill, all together

    @classmethod
    def of(cls, out: RequestOutput) -> Tally:
        prompt = len(out.prompt_token_ids)
        if out.embeddings is not None:  # one sequence per input; prompt_token_ids holds them all
            return cls(True, prompt, out.num_cached_tokens, 0, len(out.embeddings),
                       out.prefill_computed, out.prefill_skipped, prompt)
        return cls(True, prompt, out.num_cached_tokens,
                   sum(len(c.token_ids) for c in out.outputs), len(out.outputs),
                   out.prefill_computed, out.prefill_skipped, len(out.outputs) * prompt)


FAILED = Tally(ok=False)


@dataclass(slots=True)
class RunCounters:
    ok: int = 0
    failed: int = 0
    skipped: int = 0  # already in the output file (--resume)
    duplicates: int = 0  # input lines whose id an earlier line already used
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    sequences: int = 0
    sequence_prompt_tokens: int = 0
    written_prefill: int = 0  # computed + skipped of the written results' sequences
    started: float = field(default_factory=time.perf_counter)

    def add(self, tally: Tally) -> None:
        if not tally.ok:
            self.failed += 1
            return
        self.ok += 1
        self.prompt_tokens += tally.prompt_tokens
        self.cached_tokens += tally.cached_tokens
        self.generated_tokens += tally.generated_tokens
        self.sequences += tally.sequences
        self.sequence_prompt_tokens += tally.sequence_prompt_tokens
        self.written_prefill += tally.prefill_computed + tally.prefill_skipped

    @property
    def done(self) -> int:
        return self.ok + self.failed + self.skipped

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


# engine.stats() keys copied into the summary (see kvcli/engine/metrics.py)
ENGINE_KEYS = ("prefill_tokens_computed", "prefill_tokens_skipped", "decode_tokens", "preemptions",
               "steps", "forward_s", "num_blocks", "block_size", "peak_blocks_in_use",
               "peak_kv_utilization", "evicted_blocks", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s",
               # from a pool of engines (--ray): per-worker rows, and one engine's predicted hits
               "workers", "single_engine_cached_tokens", "single_engine_hit_rate",
               "disk_cache",  # --kv-cache-dir (kvcli/engine/kv_disk.py)
               "structured")  # constrained lines (kvcli/structured/validity.py)


def build_summary(counters: RunCounters, engine_stats: dict[str, Any] | None,
                  status: str, exit_code: int) -> dict[str, Any]:
    wall = counters.elapsed
    stats = engine_stats or {}
    summary: dict[str, Any] = {k: v for k, v in asdict(counters).items()
                               if k not in ("started", "written_prefill")}
    summary.update(
        status=status,
        exit_code=exit_code,
        hit_rate=round(counters.hit_rate, 4),
        wall_s=round(wall, 3),
        generated_tok_s=round(counters.generated_tokens / wall, 2) if wall > 0 else 0.0,
        **{k: stats[k] for k in ENGINE_KEYS if k in stats},
    )
    computed = stats.get("prefill_tokens_computed")
    if computed is not None and wall > 0:
        summary["processed_tok_s"] = round((computed + counters.generated_tokens) / wall, 2)
    if computed is not None:
        summary.update(_prefill_split(counters, computed + stats.get("prefill_tokens_skipped", 0)))
    return summary


def _prefill_split(counters: RunCounters, prefill: int) -> dict[str, int]:
    """The engine's prefill work, split as the module docstring defines (clamped at 0 for an
    engine that does not attribute its work to results)."""
    written = max(counters.written_prefill, counters.sequence_prompt_tokens)
    return {"prefill_tokens_recomputed": written - counters.sequence_prompt_tokens,
            "prefill_tokens_unwritten": max(0, prefill - written)}


def _prefill_line(s: dict[str, Any]) -> str:
    extra = [f"{s['sequence_prompt_tokens']:,} of the written results' "
             + plural(s["sequences"], "sequence")]
    if s.get("prefill_tokens_recomputed"):
        extra.append(f"{s['prefill_tokens_recomputed']:,} recomputed after preemption")
    if s.get("prefill_tokens_unwritten"):
        extra.append(f"{s['prefill_tokens_unwritten']:,} for requests not written")
    total = s["prefill_tokens_computed"] + s.get("prefill_tokens_skipped", 0)
    return (f"  prefill       {s['prefill_tokens_computed']:,} tokens computed + "
            f"{s.get('prefill_tokens_skipped', 0):,} skipped (cache hits) = {total:,}: "
            + " + ".join(extra))


def format_summary(s: dict[str, Any], output_name: str) -> str:
    lines = [f"kvcli generate: {s['ok']:,} ok, {s['failed']:,} failed"
             + (f", {s['skipped']} already in {output_name}" if s["skipped"] else "")
             + f" in {s['wall_s']:.1f} s ({s['status']})"]
    lines.append(f"  prompt tokens {s['prompt_tokens']:,}, cached {s['cached_tokens']:,} "
                 f"({percent(s['cached_tokens'], s['prompt_tokens'])} prefix-cache hit rate)")
    if "prefill_tokens_computed" in s and "sequences" in s:
        lines.append(_prefill_line(s))
    rate = f", {s['processed_tok_s']:,.1f} tok/s prompt+generated" if "processed_tok_s" in s else ""
    lines.append(f"  generated     {plural(s['generated_tokens'], 'token')}, "
                 f"{s['generated_tok_s']:,.1f} tok/s{rate}")
    if "num_blocks" in s:
        peak = s.get("peak_blocks_in_use", 0)
        lines.append(f"  KV cache      peak {peak:,} of {s['num_blocks']:,} blocks "
                     f"({percent(peak, max(1, s['num_blocks']))}), "
                     f"{percent(s.get('peak_kv_utilization', 0))} of their slots filled, "
                     f"{plural(s.get('preemptions', 0), 'preemption')}")
    if "workers" in s:
        lines.extend(_worker_lines(s))
    if "disk_cache" in s:
        lines.append(_disk_line(s["disk_cache"]))
    if "structured" in s:
        lines.append(_structured_line(s["structured"]))
    return "\n".join(lines)


def _structured_line(d: dict[str, Any]) -> str:
    return (f"  structured    {d['requests']:,} constrained, {d['completed']:,} completed by their "
            f"grammar ({d['invalid']} invalid), {d['cut']:,} cut by max_tokens or stop; "
            f"{plural(d['grammars_compiled'], 'grammar')} compiled in {d['compile_s']:.2f} s, "
            f"masks {d['mask_s']:.2f} s")


def _disk_line(d: dict[str, Any]) -> str:
    rate = f" at {d['load_gb_s']:.2f} GB/s" if d.get("load_gb_s") else ""
    stopped = f"; writing stopped: {d['write_error']}" if d.get("write_error") else ""
    damaged = f", {d['corrupt_blocks']} damaged ignored" if d.get("corrupt_blocks") else ""
    return (f"  disk cache    {d['hit_tokens']:,} cached tokens from disk ({d['hit_blocks']:,} "
            f"blocks, {d['bytes_read'] / 1e6:,.1f} MB read{rate}{damaged}), "
            f"{d['written_blocks']:,} blocks written ({d['bytes_written'] / 1e6:,.1f} MB)"
            f"{stopped}")


def _worker_lines(s: dict[str, Any]) -> list[str]:
    single = s.get("single_engine_hit_rate")
    versus = f", one engine would have had {percent(single)} (predicted)" if single is not None \
        else ""
    lines = [f"  workers       {len(s['workers'])}, {percent(s['cached_tokens'], s['prompt_tokens'])} hit rate together"
             + versus]
    for w in s["workers"]:
        n = w["restarts"]
        restarts = f", restarted {n} time{'s' if n > 1 else ''}" if n else ""
        lines.append(f"    worker {w['worker']:<5} {w['requests']:,} requests, "
                     f"{percent(w['hit_rate'])} hit rate, {w['generated_tok_s']:,.1f} generated "
                     f"tok/s, {w['busy_s']:.1f} s busy on {w['node']}{restarts}")
    return lines

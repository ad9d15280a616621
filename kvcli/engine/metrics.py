"""Run-level engine metrics: prefill computed vs skipped, KV use, throughput (torch-free)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kvcli.engine.kv_cache import KVCacheManager
from kvcli.engine.outputs import RequestOutput
from kvcli.engine.scheduler import SchedulerOutput


@dataclass(slots=True)
class EngineMetrics:
    num_blocks: int
    block_size: int
    started: float = field(default_factory=time.perf_counter)
    steps: int = 0
    forward_s: float = 0.0
    prefill_tokens_computed: int = 0
    decode_tokens: int = 0
    requests_finished: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    peak_blocks_in_use: int = 0
    peak_kv_utilization: float = 0.0  # live tokens / allocated slots, at the peak
    ttfts: list[float] = field(default_factory=list)

    def on_schedule(self, out: SchedulerOutput, kv: KVCacheManager) -> None:
        in_use = self.num_blocks - kv.num_free_blocks
        live = sum(r.num_computed_tokens + n for r, n in zip(out.requests, out.num_new_tokens,
                                                            strict=True))
        if in_use >= self.peak_blocks_in_use and in_use > 0:
            self.peak_blocks_in_use = in_use
            self.peak_kv_utilization = min(1.0, live / (in_use * self.block_size))

    def on_step(self, out: SchedulerOutput, num_sampled: int, seconds: float) -> None:
        self.steps += 1
        self.forward_s += seconds

    def on_computed(self, out: SchedulerOutput) -> None:
        """Prefill vs decode tokens of a step, before any of its requests finishes (a result
        carries its sequences' prefill_computed, so the last chunk must be in it)."""
        for req, n in zip(out.requests, out.num_new_tokens, strict=True):
            # Called after the cursors advanced: a decode row is one token past the prompt.
            if n == 1 and req.num_computed_tokens - 1 >= req.num_prompt_tokens:
                self.decode_tokens += 1
            else:
                self.prefill_tokens_computed += n
                req.prefill_computed += n

    def on_finished(self, result: RequestOutput) -> None:
        self.requests_finished += 1
        self.prompt_tokens += len(result.prompt_token_ids)
        self.cached_tokens += result.num_cached_tokens
        self.generated_tokens += sum(len(c.token_ids) for c in result.outputs)
        if result.time_to_first_token is not None:
            self.ttfts.append(result.time_to_first_token)

    def to_dict(self, kv: KVCacheManager, preemptions: int) -> dict[str, Any]:
        wall = time.perf_counter() - self.started
        s = kv.stats
        ttfts = sorted(self.ttfts)
        return {
            "requests_finished": self.requests_finished,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "prefix_cache_queries": s.queries,
            "prefix_cache_hits": s.hits,
            "prefill_tokens_computed": self.prefill_tokens_computed,
            "generated_tokens": self.generated_tokens,
            "decode_tokens": self.decode_tokens,
            "preemptions": preemptions,
            "steps": self.steps,
            "forward_s": round(self.forward_s, 4),
            "wall_s": round(wall, 4),
            "output_tok_s": self.generated_tokens / self.forward_s if self.forward_s else 0.0,
            "total_tok_s": (self.prefill_tokens_computed + self.decode_tokens) / self.forward_s
            if self.forward_s else 0.0,
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "peak_blocks_in_use": self.peak_blocks_in_use,
            "peak_kv_utilization": round(self.peak_kv_utilization, 4),
            "evicted_blocks": s.evicted_blocks,
            "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else None,
            "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else None,
            "ttft_p90_s": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.9))] if ttfts else None,
        }

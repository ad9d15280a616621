"""Per-worker accounting for the summary: requests, hit rate, tokens/s, restarts, engine stats.

Request counts and tokens are counted by the driver from the results it received,
so they stay exact across actor restarts. Engine stats (prefill computed/skipped,
KV blocks, preemptions) come from the actor; when Ray restarts an actor its new
engine starts from zero, so the last stats of the old incarnation are kept
("retired") and added to the new one's (what it did after its last report is lost).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# engine.stats() keys that add up across engines (see kvcli/engine/metrics.py)
SUMMED_STATS = ("prefill_tokens_computed", "prefill_tokens_skipped", "decode_tokens",
                "preemptions", "steps", "forward_s", "num_blocks", "peak_blocks_in_use",
                "evicted_blocks")


@dataclass(slots=True)
class WorkerTally:
    index: int
    node: str = ""
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    predicted_cached: int | None = 0  # a single engine's prediction for these requests
    restarts: int = 0  # new incarnations seen (Ray restarted the actor)
    busy_s: float = 0.0  # time spent in engine steps
    incarnation: str = ""
    _retired: dict[str, float] = field(default_factory=dict)
    _latest: dict[str, Any] = field(default_factory=dict)

    def record(self, out: Any, predicted: int | None) -> None:
        self.requests += 1
        self.prompt_tokens += len(out.prompt_token_ids)
        self.cached_tokens += out.num_cached_tokens
        self.generated_tokens += sum(len(c.token_ids) for c in out.outputs)
        if predicted is None or self.predicted_cached is None:
            self.predicted_cached = None
        else:
            self.predicted_cached += predicted

    def note_stats(self, incarnation: str, stats: dict[str, Any] | None) -> None:
        if incarnation != self.incarnation:
            self.restarts += bool(self.incarnation)
            for key in SUMMED_STATS:
                self._retired[key] = self._retired.get(key, 0) + self._latest.get(key, 0)
            self._latest = {}
            self.incarnation = incarnation
        if stats is not None:
            self._latest = stats

    def engine_stats(self) -> dict[str, Any]:
        merged: dict[str, Any] = {k: self._retired.get(k, 0) + self._latest.get(k, 0)
                                  for k in SUMMED_STATS}
        merged["block_size"] = self._latest.get("block_size")
        merged["peak_kv_utilization"] = self._latest.get("peak_kv_utilization", 0.0)
        return merged

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def row(self, wall_s: float) -> dict[str, Any]:
        return {
            "worker": self.index, "node": self.node, "requests": self.requests,
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "hit_rate": round(self.hit_rate, 4), "generated_tokens": self.generated_tokens,
            "generated_tok_s": round(self.generated_tokens / wall_s, 2) if wall_s > 0 else 0.0,
            "busy_s": round(self.busy_s, 3), "restarts": self.restarts,
        }


def merge_stats(tallies: list[WorkerTally], wall_s: float) -> dict[str, Any]:
    """One engine.stats()-like dict for the whole pool, plus ``workers`` rows and the prediction."""
    per_engine = [t.engine_stats() for t in tallies]
    merged: dict[str, Any] = {k: sum(s[k] for s in per_engine) for k in SUMMED_STATS}
    merged["forward_s"] = round(merged["forward_s"], 4)
    sizes = [s["block_size"] for s in per_engine if s["block_size"] is not None]
    if sizes:
        merged["block_size"] = sizes[0]
    merged["peak_kv_utilization"] = max(s["peak_kv_utilization"] for s in per_engine)
    merged["workers"] = [t.row(wall_s) for t in tallies]
    # Constrained-decoding counts (kvcli/structured/validity.py) add up too; an actor restarted
    # by Ray reports only what its new engine did.
    structured = [t._latest["structured"] for t in tallies if "structured" in t._latest]
    if structured:
        merged["structured"] = {k: round(sum(d[k] for d in structured), 4) for k in structured[0]}
    prompt = sum(t.prompt_tokens for t in tallies)
    predicted = [t.predicted_cached for t in tallies]
    if prompt and all(p is not None for p in predicted):
        total = sum(p for p in predicted if p is not None)
        merged["single_engine_cached_tokens"] = total
        merged["single_engine_hit_rate"] = round(total / prompt, 4)
    return merged

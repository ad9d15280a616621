"""Cache sizes (--cache-size in tokens, blocks or bytes) and the capacity report built at the end.

Bytes follow the engine's KV layout (kvcli/model/attention/kv_cache.py kv_cache_bytes_per_block):
layers x 2 (K and V) x kv_heads x head_dim x dtype bytes per token (int8: head_dim + 8 bytes,
the row's scale and zero point), read from the model's
config.json with the engine's own parser (kvcli/checkpoint/config.py, torch-free), so
`--cache-size 1GiB` is the pool `kvcli generate --kv-cache-memory 1GiB` gets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcli.audit.bounded import BoundedReplay
from kvcli.audit.curve import StackModel
from kvcli.hashing import BlockHash

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
# `--kv-cache-dtype int8`: each token's row per layer and KV head ends in a float32 scale and zero
# point (kvcli/model/attention/native_int8.py INT8_ROW_EXTRA; tests/test_audit_kv_dtype.py checks).
INT8_ROW_EXTRA = 8
BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}  # fmt: skip
ELBOW_SHARE = 0.9
# `kvcli generate`'s pool without --num-blocks / --kv-cache-memory: 1 GiB of KV, at most 32,768
# blocks (kvcli/engine/llm_engine.py, which imports torch; tests/test_audit_capacity.py checks
# these copies against it).
ENGINE_KV_MEMORY = 1 << 30
ENGINE_MAX_BLOCKS = 32768
ASSUMES = ("prompts run one after another in input order (concurrency 1), each finishing after its "
           "prefill (outputs are not cached); LRU eviction as kvcli's block pool does it")


class SizeError(ValueError):
    """A --cache-size the audit cannot turn into blocks; the message names the flag."""


def model_config(model_dir: Path) -> Any:
    """The model's ModelConfig, read with the engine's own torch-free parser."""
    from kvcli.checkpoint.config import load_config_json, parse_model_config

    path = model_dir / "config.json"
    raw = load_config_json(path)
    architectures = raw.get("architectures") or ["?"]
    return parse_model_config(raw, str(path), str(architectures[0]))


def bytes_per_token(model_dir: Path, dtype: str = "float32") -> int:
    """KV-cache bytes one token costs in `kvcli generate` with this model (all layers, K and V)."""
    config = model_config(model_dir)
    row = config.head_dim + (INT8_ROW_EXTRA if dtype == "int8" else 0)
    return config.num_layers * 2 * config.num_kv_heads * row * DTYPE_BYTES[dtype]


def engine_pool_blocks(token_bytes: int, block_size: int) -> int:
    """The pool `kvcli generate` allocates by default for a model of this KV layout."""
    return max(1, min(ENGINE_KV_MEMORY // (token_bytes * block_size), ENGINE_MAX_BLOCKS))


def parse_size(spec: str, block_size: int, token_bytes: int | None) -> int:
    """`--cache-size` as whole blocks: '8192' or '8192tokens', '512blocks', '1GiB' (with --model)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", spec)
    if m is None:
        raise SizeError(f"--cache-size {spec}: expected a number with an optional unit (tokens, blocks, MiB, GiB, ...)")
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit in ("", "t", "token", "tokens"):
        blocks = int(number) // block_size
    elif unit in ("block", "blocks"):
        blocks = int(number)
    elif unit in BYTE_UNITS:
        if token_bytes is None:
            raise SizeError(f"--cache-size {spec}: a size in bytes needs --model (the bytes per token "
                            "follow the model's KV layout)")
        blocks = int(number * BYTE_UNITS[unit]) // (token_bytes * block_size)
    else:
        raise SizeError(f"--cache-size {spec}: unknown unit '{m.group(2)}' (tokens, blocks, B, KiB, MiB, GiB, KB, MB, GB)")
    if blocks < 1:
        raise SizeError(f"--cache-size {spec}: less than one block of {block_size} tokens")
    return blocks


@dataclass(slots=True)
class CurvePoint:
    blocks: int
    tokens: int
    bytes: int | None
    cached_tokens: int
    hit_rate: float


@dataclass(slots=True)
class Bounded:
    """The exact replay at --cache-size (bounded.py)."""

    blocks: int
    concurrency: int
    cached_tokens: int
    hit_rate: float
    too_large: int
    method: str = "stack model of kvcli's block pool (equal to replaying it)"


@dataclass(slots=True)
class CapacityReport:
    block_size: int
    token_bytes: int | None  # with --model
    unbounded_hit_rate: float
    working_set_blocks: int  # distinct blocks: no eviction from this size on
    largest_prompt_blocks: int  # smaller caches cannot hold every prompt
    curve: list[CurvePoint] = field(default_factory=list)
    elbow: CurvePoint | None = None
    bounded: Bounded | None = None
    assumes: str = ASSUMES
    ordering: Any = None  # ordering.OrderingAdvice, added by the command
    engine_pool: CurvePoint | None = None  # with --model: at `kvcli generate`'s default pool
    kv_dtype: str | None = None  # with --model: the KV element type the bytes are counted in (--dtype)

    def size_bytes(self, blocks: int) -> int | None:
        return blocks * self.block_size * self.token_bytes if self.token_bytes else None


def build_report(model: StackModel, token_bytes: int | None, bounded: Bounded | None = None) -> CapacityReport:
    """The curve from the largest prompt's size up to the first size that never evicted."""
    bs = model.block_size
    unbounded = next((s.cached_tokens for s in model.sizes if not s.evicted), 0)
    tokens = max(model.tokens, 1)
    report = CapacityReport(bs, token_bytes, unbounded / tokens, model.distinct_blocks, model.largest_prompt,
                            bounded=bounded)
    for size in model.sizes:
        if size.blocks < model.largest_prompt:
            continue
        report.curve.append(CurvePoint(size.blocks, size.blocks * bs, report.size_bytes(size.blocks),
                                       size.cached_tokens, size.cached_tokens / tokens))
        if not size.evicted:
            break
    report.elbow = next((p for p in report.curve if p.cached_tokens >= ELBOW_SHARE * unbounded), None)
    return report


@dataclass(slots=True)
class CacheModels:
    """What the auditor feeds each prompt to: the stack model (every size, and --cache-size at
    concurrency 1: equal to the engine's pool, tests/test_audit_capacity.py), and with
    --concurrency N > 1 the engine's own KV-cache manager replayed (pinned running prompts)."""

    curve: StackModel
    token_bytes: int | None = None
    replay: BoundedReplay | None = None

    @classmethod
    def make(cls, block_size: int, cache_blocks: int | None, concurrency: int, token_bytes: int | None) -> CacheModels:
        replay = BoundedReplay(cache_blocks, block_size, concurrency) if cache_blocks and concurrency > 1 else None
        watch = cache_blocks if cache_blocks and replay is None else None
        extra = [b for b in (cache_blocks, engine_pool_blocks(token_bytes, block_size) if token_bytes else None) if b]
        return cls(StackModel(block_size, extra=extra, watch=watch), token_bytes, replay)

    def observe(self, nodes: list[int], matched: int, hashes: list[BlockHash], num_tokens: int,
                min_tokens: int) -> int | None:
        """One prompt, in input order; its cached tokens at --cache-size (None without it)."""
        watched = self.curve.observe(nodes, matched, num_tokens, min_tokens)
        return self.replay.step(hashes, num_tokens, min_tokens) if self.replay is not None else watched

    def bounded(self) -> Bounded | None:
        if self.replay is not None:
            r = self.replay
            r.finish()
            return Bounded(r.num_blocks, r.concurrency, r.cached_tokens, r.hit_rate, r.too_large,
                           "kvcli's KVCacheManager replayed, running prompts pinning their blocks")
        size = next((s for s in self.curve.sizes if s.blocks == self.curve.watch), None)
        if size is None:
            return None
        return Bounded(size.blocks, 1, size.cached_tokens, size.cached_tokens / max(self.curve.tokens, 1), size.refused)

    def report(self) -> CapacityReport:
        report = build_report(self.curve, self.token_bytes, self.bounded())
        if self.token_bytes:
            pool = engine_pool_blocks(self.token_bytes, self.curve.block_size)
            size = next(s for s in self.curve.sizes if s.blocks == pool)
            tokens = max(self.curve.tokens, 1)
            report.engine_pool = CurvePoint(pool, pool * self.curve.block_size, report.size_bytes(pool),
                                            size.cached_tokens, size.cached_tokens / tokens)
        return report

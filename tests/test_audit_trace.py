"""Hash-id traces (--trace-block-size): the replay equals a plain LRU simulation of the same trace at
every size of the curve and at --cache-size, the engine's own manager agrees, bad lines are named."""

from __future__ import annotations

import json
import random
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from test_audit_support import run

from kvcli.audit.bounded import BoundedReplay
from kvcli.audit.capacity import CacheModels
from kvcli.audit.curve import StackModel
from kvcli.audit.profiles import get_profile
from kvcli.audit.timing import Clock
from kvcli.audit.trace import HashIdIndex, TraceReplay, parse_trace_line
from kvcli.bench.audit_trace import TraceShape, generate

BS = 4


def _trace(seed: int, n: int = 300) -> list[dict[str, Any]]:
    """A small Mooncake-style trace; no prompt a whole number of blocks (the one case where the
    curve refreshes a block the engine recomputes, curve.py), and some lines whose ids re-appear
    under another parent (a trie node is a block after its prefix, not an id)."""
    shape = TraceShape(n, BS, systems=6, system_blocks=(1, 4), turn_blocks=(1, 3), first_blocks=(1, 4),
                       turns=(1, 6), live=8, whole_blocks=False)
    rng = random.Random(seed)
    lines = []
    for line in generate(shape, seed):
        if lines and rng.random() < 0.1:
            other = rng.choice(lines)
            ids = [rng.choice(other["hash_ids"])] + line["hash_ids"]
            line = {**line, "input_length": line["input_length"] + BS, "hash_ids": ids}
        lines.append(line)
    return lines


def plain_lru(lines: list[dict[str, Any]], size: int, bs: int = BS) -> int:
    """The engine's pool written out plainly: an LRU of cached blocks keyed by their whole prefix;
    a prompt pins its hits, evicts the least recent for its other blocks, and frees tail first."""
    cache: OrderedDict[tuple[int, ...], None] = OrderedDict()
    cached = 0
    for line in lines:
        n, ids = line["input_length"], line["hash_ids"]
        full, total = n // bs, -(-n // bs)
        if total > size:
            continue
        keys = [tuple(ids[: j + 1]) for j in range(full)]
        hits = 0
        while hits < full and keys[hits] in cache:
            hits += 1
        hits = min(hits, (n - 1) // bs)  # one token is always computed
        for key in keys[:hits]:
            del cache[key]  # pinned while it runs
        while len(cache) > size - total:
            cache.popitem(last=False)
        for key in reversed(keys):  # freed tail first: block 0 is the most recent
            cache[key] = None
            cache.move_to_end(key)
        cached += hits * bs
    return cached


def _cli(path: Path, *args: str) -> Any:
    return run([str(path), *args])


def _doc(path: Path, *args: str) -> dict[str, Any]:
    result = _cli(path, "--format", "json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _write(tmp_path: Path, lines: list[dict[str, Any]], name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("seed", range(4))
def test_trace_replay_equals_a_plain_lru_at_every_size(tmp_path: Path, seed: int) -> None:
    lines = _trace(seed)
    path = _write(tmp_path, lines)
    largest = max(-(-line["input_length"] // BS) for line in lines)
    size = largest + 7
    doc = _doc(path, "--trace-block-size", str(BS), "--cache-size", f"{size}blocks")
    capacity = doc["capacity"]
    assert capacity["bounded"]["cached_tokens"] == plain_lru(lines, size)
    assert len(capacity["curve"]) >= 3
    for point in capacity["curve"]:
        assert point["cached_tokens"] == plain_lru(lines, point["blocks"]), point["blocks"]
    assert doc["summary"]["cached_tokens"] == plain_lru(lines, 10**9)
    assert doc["trace"]["requests"] == len(lines)
    assert doc["summary"]["tokens"] == sum(line["input_length"] for line in lines)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_the_engines_manager_replays_trace_nodes(concurrency: int) -> None:
    """--concurrency runs kvcli's KVCacheManager on the trie's nodes; at 1 it is the same LRU."""
    lines = _trace(7)
    size = max(-(-line["input_length"] // BS) for line in lines) + 3
    profile = get_profile("kvcli").with_overrides(BS, None)
    models = CacheModels(StackModel(BS, watch=size), None, BoundedReplay(size, BS, concurrency))
    replay = TraceReplay(profile, models, Clock.make(None))
    for i, line in enumerate(lines):
        req = parse_trace_line(line, f"t:{i + 1}", BS)
        assert not isinstance(req, str)
        replay.step(req)  # type: ignore[arg-type]
    bounded = models.bounded()
    assert bounded is not None
    if concurrency == 1:
        assert bounded.cached_tokens == plain_lru(lines, size)
    else:  # prompts in flight pin their blocks and share what is running: not the sequential LRU
        assert 0 < bounded.cached_tokens <= replay.cached_tokens


def test_hash_id_index_is_a_trie_of_prefixes() -> None:
    index = HashIdIndex()
    assert index.walk([1, 2, 3]) == ([0, 1, 2], 0)
    assert index.walk([1, 2, 9]) == ([0, 1, 3], 2)
    assert index.walk([2, 3]) == ([4, 5], 0)  # id 2 under another parent: another block
    assert index.walk([1, 2, 3, 4]) == ([0, 1, 2, 6], 3)
    assert len(index) == 7


def test_timestamps_and_a_lifetime_expire_blocks(tmp_path: Path) -> None:
    lines = [{"timestamp": t, "input_length": 10, "output_length": 5, "hash_ids": [1, 2, 3]}
             for t in (0, 1000, 400_000)]  # ms: the third comes 399 s after the second
    path = _write(tmp_path, lines)
    no_ttl = _doc(path, "--trace-block-size", str(BS))
    assert no_ttl["summary"]["cached_tokens"] == 16
    doc = _doc(path, "--trace-block-size", str(BS), "--cache-ttl", "300")
    assert doc["summary"]["cached_tokens"] == 8 and doc["summary"]["expired_tokens"] == 8
    assert doc["trace"]["span_s"] == pytest.approx(400.0)
    seconds = _doc(path, "--trace-block-size", str(BS), "--cache-ttl", "300", "--trace-time-unit", "s")
    assert seconds["summary"]["cached_tokens"] == 0  # 1,000 s apart, then 399,000 s: both expired
    text = _cli(path, "--trace-block-size", str(BS), "--cache-ttl", "300")
    assert "expiry: 8 tokens" in text.output and "timestamps span 400.0 s" in text.output


def test_a_wrong_block_size_is_an_error_per_line(tmp_path: Path) -> None:
    lines = [{"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [1, 2, 3, 4]},
             {"timestamp": 1, "input_length": 20, "output_length": 1, "hash_ids": [1, "x"]},
             {"timestamp": 2, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}]
    path = _write(tmp_path, lines)
    result = _cli(path, "--trace-block-size", "16", "--format", "json")
    assert result.exit_code == 2
    assert "trace.jsonl:1: hash_ids: 4 ids for input_length 2000 at --trace-block-size 16 (expected 125: is the block size" \
        in result.stderr
    assert "trace.jsonl:2: hash_ids: expected an array of integers" in result.stderr
    ok = _cli(path, "--trace-block-size", "512", "--format", "json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["input_problems"] == 1


def test_a_trace_without_the_flag_says_what_to_give(tmp_path: Path) -> None:
    path = _write(tmp_path, [{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}])
    result = _cli(path)
    assert result.exit_code == 2
    assert "a hash-id trace line" in result.stderr and "--trace-block-size N" in result.stderr


@pytest.mark.parametrize("flag", [["--diff", "a", "b"], ["--show-blocks"], ["--profile", "anthropic"],
                                  ["--format", "jsonl"], ["--block-size", "8"]])
def test_options_a_trace_cannot_honour_are_refused(tmp_path: Path, flag: list[str]) -> None:
    path = _write(tmp_path, _trace(1, 20))
    result = _cli(path, "--trace-block-size", str(BS), *flag)
    assert result.exit_code == 2 and "kvcli audit: error:" in result.stderr

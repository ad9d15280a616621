"""Ordering advice: the bounded hit rate with the prompts sorted by prefix, next to the given order."""

from __future__ import annotations

import random
from pathlib import Path

from test_audit_support import audit_json, chat, run, system, user, write_jsonl

from kvcli.audit.bounded import BoundedReplay
from kvcli.audit.ordering import replay_sorted, sorted_paths
from kvcli.audit.prefix_index import PrefixIndex, token_bytes
from kvcli.hashing import hash_token_blocks

BS = 4
APPS = [f"You are assistant number {k}, expert in topic {k}. Answer precisely and cite sources. " * 5
        for k in range(3)]


def _index(rng: random.Random, n: int) -> tuple[PrefixIndex, list[list[int]]]:
    heads = [[rng.randrange(40) for _ in range(rng.randrange(6, 24))] for _ in range(5)]
    index, prompts = PrefixIndex(BS), []
    for i in range(n):
        ids = rng.choice(heads) + [rng.randrange(40) for _ in range(rng.randrange(1, 16))]
        raw = token_bytes(ids)
        index.insert(i, raw, None, index.match(ids, raw, None))
        prompts.append(ids)
    return index, prompts


def test_sorted_order_groups_every_shared_prefix() -> None:
    index, prompts = _index(random.Random(1), 120)
    order = [p for p, _ in sorted_paths(index)]
    assert sorted(order) == list(range(len(prompts)))
    position = {p: k for k, p in enumerate(order)}
    prefixes: dict[tuple[int, ...], list[int]] = {}
    for p, ids in enumerate(prompts):
        for j in range(1, len(ids) // BS + 1):
            prefixes.setdefault(tuple(ids[: j * BS]), []).append(position[p])
    for places in prefixes.values():  # the prompts sharing a block prefix run one after another
        assert max(places) - min(places) == len(places) - 1


def test_sorted_replay_equals_the_engine_pool_in_that_order() -> None:
    index, prompts = _index(random.Random(2), 120)
    order = [p for p, _ in sorted_paths(index)]
    size = 3 * max(-(-len(p) // BS) for p in prompts)
    model = replay_sorted(index, [size], BS)
    replay = BoundedReplay(size, BS)
    for p in order:
        replay.step(hash_token_blocks(prompts[p], BS), len(prompts[p]), BS)
    assert next(s for s in model.sizes if s.blocks == size).cached_tokens == replay.cached_tokens


def _interleaved() -> list[dict]:
    """Three applications taking turns: a cache holding one application's prefix loses it each turn."""
    return [chat([system(APPS[k]), user(f"Question {turn} about topic {k}?")], id=f"a{k}-{turn}")
            for turn in range(4) for k in range(3)]


def test_ordering_by_prefix_raises_the_bounded_hit_rate(tmp_path: Path) -> None:
    largest = audit_json(tmp_path, _interleaved())["capacity"]["largest_prompt_blocks"]
    size = largest + 4  # one application's prompt and a little more
    doc = audit_json(tmp_path, _interleaved(), "--cache-size", f"{size}blocks")
    ordering = doc["capacity"]["ordering"]
    assert ordering["blocks"] == size
    assert ordering["given_hit_rate"] == doc["capacity"]["bounded"]["hit_rate"]
    assert ordering["sorted_hit_rate"] > ordering["given_hit_rate"] + 0.3
    assert ordering["advice"].startswith(f"ordering by prefix would raise the hit rate at {size} blocks")
    text = run([str(write_jsonl(tmp_path / "r.jsonl", _interleaved())), "--cache-size", f"{size}blocks"]).stdout
    assert f"ordering by prefix would raise the hit rate at {size} blocks ({size * 16:,} tokens) from" in text


def test_without_cache_size_the_advice_is_at_the_elbow(tmp_path: Path) -> None:
    doc = audit_json(tmp_path, _interleaved())
    capacity = doc["capacity"]
    assert capacity["ordering"]["blocks"] == capacity["elbow"]["blocks"]

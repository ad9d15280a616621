"""KVCacheManager / BlockPool: the worked examples of paged KV with prefix caching."""

from __future__ import annotations

import time

import pytest

from kvcli.engine.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from kvcli.engine.kv_cache import KVCacheManager
from kvcli.engine.request import Request
from kvcli.sampling_params import SamplingParams


def make_request(rid: str, tokens: list[int], salt: str | None = None, bs: int = 16) -> Request:
    return Request(rid, list(tokens), SamplingParams(), cache_salt=salt, block_size=bs)


def admit(kv: KVCacheManager, req: Request) -> list[KVCacheBlock] | None:
    """What the scheduler does on admission: look up, allocate the rest, run the step."""
    hits, num_hit = kv.get_computed_blocks(req)
    new = kv.allocate_slots(req, req.num_tokens - num_hit, hits)
    if new is not None:
        req.num_computed_tokens = req.num_tokens  # the whole prefill ran
    return new


def free_ids(kv: KVCacheManager) -> list[int]:
    return [b.block_id for b in kv.block_pool.free_queue.blocks()]


def test_free_queue_is_an_o1_intrusive_lru() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeKVCacheBlockQueue(blocks)
    assert len(q) == 5 and [b.block_id for b in q.blocks()] == [0, 1, 2, 3, 4]
    q.remove(blocks[2])  # from the middle
    q.remove(blocks[4])  # the back
    assert blocks[2] not in q and blocks[2].prev_free is None
    assert q.popleft() is blocks[0]
    q.append(blocks[2])
    q.appendleft(blocks[4])
    assert [b.block_id for b in q.blocks()] == [4, 1, 3, 2] and len(q) == 4
    with pytest.raises(ValueError, match="already in the free queue"):
        q.append(blocks[1])
    with pytest.raises(ValueError, match="not in the free queue"):
        q.remove(blocks[0])
    for _ in range(4):
        q.popleft()
    with pytest.raises(IndexError):
        q.popleft()


def test_50_token_prompt_takes_4_blocks_last_partial() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=16)
    req = make_request("a", list(range(50)))
    assert len(req.block_hashes) == 3
    new = admit(kv, req)
    assert new is not None and len(new) == 4
    assert kv.get_block_ids("a") == [b.block_id for b in new]
    assert [b.block_hash for b in new[:3]] == req.block_hashes
    assert new[3].block_hash is None  # a partial block is never cached
    assert kv.num_cached_blocks == 3 and kv.num_free_blocks == 6
    assert kv.usage == pytest.approx(0.4)


def test_shared_prefix_hits_and_ref_counts() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=16)
    shared = list(range(32))
    a = make_request("a", shared + list(range(100, 132)))
    b = make_request("b", shared + list(range(200, 232)))
    admit(kv, a)
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 32 and [h.block_id for h in hits] == kv.get_block_ids("a")[:2]
    new = kv.allocate_slots(b, b.num_tokens - num_hit, hits)
    assert new is not None and len(new) == 2  # computes blocks 2 and 3 only
    ids_a, ids_b = kv.get_block_ids("a"), kv.get_block_ids("b")
    assert ids_b[:2] == ids_a[:2] and not set(ids_b[2:]) & set(ids_a)
    shared_block = hits[0]
    assert shared_block.ref_cnt == 2
    kv.free(a)
    assert shared_block.ref_cnt == 1 and shared_block not in kv.block_pool.free_queue
    kv.free(b)
    assert shared_block.ref_cnt == 0 and shared_block in kv.block_pool.free_queue
    # Freed blocks keep their hash: still a hit until the block is reused.
    assert kv.get_computed_blocks(make_request("c", shared + [1]))[1] == 32
    assert kv.num_free_blocks == 10 and kv.usage == 0.0


def test_lru_eviction_tail_of_chain_first() -> None:
    kv = KVCacheManager(num_blocks=5, block_size=16)
    prompt = list(range(65))  # 4 full blocks + 1 token
    a = make_request("a", prompt)
    admit(kv, a)
    ids = kv.get_block_ids("a")
    kv.free(a)
    # Reverse order; the unhashed partial block is recycled before any cached one.
    assert free_ids(kv) == [ids[4], ids[3], ids[2], ids[1], ids[0]]
    other = make_request("o", list(range(500, 520)))  # needs 2 blocks
    assert [b.block_id for b in admit(kv, other)] == [ids[4], ids[3]]
    assert kv.stats.evicted_blocks == 1  # only block 3 held a hash
    assert kv.get_computed_blocks(make_request("a2", prompt))[1] == 48


def test_unhashed_blocks_are_reused_before_older_cached_ones() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=16)
    a, b = make_request("a", list(range(32))), make_request("b", list(range(100, 110)))
    admit(kv, a)
    admit(kv, b)
    kv.free(a)
    kv.free(b)  # freed later, but its block holds no reusable prefix
    admit(kv, make_request("c", list(range(200, 220))))  # 2 blocks: b's and the never-used one
    assert kv.stats.evicted_blocks == 0
    assert kv.get_computed_blocks(make_request("a2", list(range(33))))[1] == 32


@pytest.mark.parametrize("salt_b, shared", [("beta", False), ("alpha", True), (None, False)])
def test_salt_isolation(salt_b: str | None, shared: bool) -> None:
    kv = KVCacheManager(num_blocks=20, block_size=16)
    prompt = list(range(70))
    a, b = make_request("a", prompt, "alpha"), make_request("b", prompt, salt_b)
    admit(kv, a)
    hits, num_hit = kv.get_computed_blocks(b)
    assert (num_hit == 64) is shared and (num_hit == 0) is not shared
    kv.allocate_slots(b, b.num_tokens - num_hit, hits)
    common = set(kv.get_block_ids("a")) & set(kv.get_block_ids("b"))
    assert bool(common) is shared


@pytest.mark.parametrize("length, expect_hit", [(64, 48), (50, 48), (48, 32), (16, 0), (17, 16)])
def test_fully_cached_prompt_still_computes_a_token(length: int, expect_hit: int) -> None:
    kv = KVCacheManager(num_blocks=20, block_size=16)
    first = make_request("a", list(range(length)))
    admit(kv, first)
    again = make_request("b", list(range(length)))
    hits, num_hit = kv.get_computed_blocks(again)
    assert num_hit == expect_hit and num_hit < length
    new = kv.allocate_slots(again, length - num_hit, hits)
    assert new is not None
    # The recomputed last block duplicates a cached one: the first mapping is kept.
    for i, block_hash in enumerate(again.block_hashes):
        assert kv.block_pool.get_cached_block(block_hash).block_id == kv.get_block_ids("a")[i]


def _snapshot(kv: KVCacheManager) -> tuple:
    pool = kv.block_pool
    return (free_ids(kv), [b.ref_cnt for b in pool.blocks], dict(pool.cached),
            [b.block_hash for b in pool.blocks], kv.stats.to_dict(), dict(kv._requests))


def test_allocate_slots_short_returns_none_without_side_effects() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=16)
    a = make_request("a", list(range(48)))
    admit(kv, a)
    kv.free(a)  # 4 free blocks, 3 of them cached
    b = make_request("b", list(range(88)))  # 6 blocks: 3 hits (all free) + 3 new
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 48 and kv.num_free_blocks == 4
    before = _snapshot(kv)
    # 3 new <= 4 free, but reviving the 3 hits takes them out of the free pool too.
    assert kv.allocate_slots(b, b.num_tokens - num_hit, hits) is None
    assert _snapshot(kv) == before and kv.get_block_ids("b") == []
    assert kv.allocate_slots(b, 16, hits) is not None  # 3 hits + 1 new: exactly fits
    assert kv.num_free_blocks == 0 and kv.stats.peak_blocks_in_use == 4


def test_decode_filling_a_block_makes_it_cacheable() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=16)
    req = make_request("a", list(range(30)))
    admit(kv, req)
    assert kv.num_cached_blocks == 1
    for token in (30, 31, 32):
        req.append_output_token(token)
        assert kv.allocate_slots(req, 1) is not None
        req.num_computed_tokens += 1
    assert kv.num_cached_blocks == 2 and len(kv.get_block_ids("a")) == 3
    probe = make_request("b", list(range(40)))
    assert kv.get_computed_blocks(probe)[1] == 32


def test_blocks_of_a_step_that_never_ran_are_not_served() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=16)
    a = make_request("a", list(range(64)))
    hits, _ = kv.get_computed_blocks(a)
    kv.allocate_slots(a, 32, hits)  # first chunk: blocks 0-1 registered at allocation
    assert kv.num_cached_blocks == 2
    a.num_computed_tokens = 32  # the chunk ran
    kv.allocate_slots(a, 32)  # second chunk registered ...
    assert kv.num_cached_blocks == 4
    kv.free(a)  # ... but the request is preempted before it runs
    assert kv.num_cached_blocks == 2
    assert kv.get_computed_blocks(make_request("b", list(range(64))))[1] == 32


def test_preempted_lookups_are_counted_apart() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=16)
    a = make_request("a", list(range(40)))
    admit(kv, a)
    kv.free(a)
    a.num_computed_tokens, a.num_preemptions = 0, 1
    admit(kv, a)  # recompute after preemption: its own blocks hit again
    s = kv.stats
    assert (s.requests, s.queries, s.hits) == (1, 40, 0)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 40, 32)
    assert s.hit_rate == 0.0 and s.to_dict()["hit_rate"] == 0.0


def test_a_lookup_retried_while_waiting_counts_once() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=16)
    holder = make_request("h", list(range(20)))
    admit(kv, holder)
    waiting = make_request("w", list(range(20)))
    for _ in range(3):  # no room: the scheduler retries the lookup every step
        hits, num_hit = kv.get_computed_blocks(waiting)
        assert kv.allocate_slots(waiting, waiting.num_tokens - num_hit, hits) is None
    kv.free(holder)
    admit(kv, waiting)
    assert (kv.stats.requests, kv.stats.queries, kv.stats.hits) == (2, 40, 16)
    assert kv.stats.hit_rate == pytest.approx(16 / 40)


def test_caching_disabled() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=16, enable_caching=False)
    admit(kv, make_request("a", list(range(40))))
    assert kv.get_computed_blocks(make_request("b", list(range(40)))) == ([], 0)
    assert kv.num_cached_blocks == 0 and kv.stats.queries == 0


def test_reset_prefix_cache_only_when_idle() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=16)
    a = make_request("a", list(range(40)))
    admit(kv, a)
    assert kv.reset_prefix_cache() is False and kv.num_cached_blocks == 2
    kv.free(a)
    assert kv.reset_prefix_cache() is True and kv.num_cached_blocks == 0
    assert all(b.block_hash is None for b in kv.block_pool.blocks)
    assert kv.get_computed_blocks(make_request("b", list(range(40))))[1] == 0


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheManager(num_blocks=0, block_size=16)
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(num_blocks=4, block_size=0)
    kv = KVCacheManager(num_blocks=4, block_size=16)
    with pytest.raises(ValueError, match="block_size"):
        kv.get_computed_blocks(make_request("a", [1, 2, 3], bs=8))
    stale = make_request("b", list(range(20)))
    stale.num_computed_tokens = 20  # e.g. not reset after preemption
    with pytest.raises(ValueError, match="num_computed_tokens"):
        kv.allocate_slots(stale, 1)
    with pytest.raises(ValueError, match="freed more often"):
        BlockPool(2).free_blocks([BlockPool(2).blocks[0]])


def test_benchmark_allocate_and_free_10k_requests() -> None:
    kv = KVCacheManager(num_blocks=4096, block_size=16)
    system = list(range(256))  # a shared 16-block system prompt
    reqs = [make_request(str(i), system + [1000 + i] * 20) for i in range(10_000)]
    start = time.perf_counter()
    for req in reqs:
        assert admit(kv, req) is not None
        kv.free(req)
    elapsed = time.perf_counter() - start
    print(f"allocate+free: {len(reqs) / elapsed:,.0f} requests/s ({elapsed * 1e3:.0f} ms for 10k)")
    assert kv.stats.hits == 16 * 16 * (len(reqs) - 1)
    assert kv.num_free_blocks == kv.num_blocks

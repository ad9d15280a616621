"""Sliding-window block freeing in the KV-cache manager (torch-free).

A query at position p sees keys in (p - w, p] (transformers: ``kv_idx > q_idx - w``), so once a
request has computed c tokens, a block ending at or before c - w + 1 is never attended again.
"""

from __future__ import annotations

import math

import pytest

from kvcli.engine.kv_cache import NULL_BLOCK, KVCacheManager
from kvcli.engine.request import Request, RequestStatus
from kvcli.engine.scheduler import Scheduler, SchedulerConfig
from kvcli.sampling_params import SamplingParams

BS = 16


def make_request(rid: str, tokens: list[int], bs: int = BS) -> Request:
    return Request(rid, list(tokens), SamplingParams(), block_size=bs)


def first_visible_key(num_computed: int, window: int) -> int:
    """The oldest key any query at position >= num_computed can see (transformers' rule)."""
    return max(0, num_computed - window + 1)


def prefill(kv: KVCacheManager, req: Request) -> None:
    hits, num_hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - num_hit, hits) is not None
    req.num_computed_tokens = req.num_tokens


def decode(kv: KVCacheManager, req: Request, token: int) -> list | None:
    """One decode step: the sampled token arrives, then its slot is allocated and computed."""
    req.append_output_token(token)
    new = kv.allocate_slots(req, 1)
    if new is not None:
        req.num_computed_tokens += 1
    return new


def test_blocks_leave_exactly_when_no_query_can_see_them() -> None:
    window = 32
    kv = KVCacheManager(num_blocks=16, block_size=BS, sliding_window=window)
    req = make_request("a", list(range(40)))
    prefill(kv, req)
    assert kv.get_block_ids("a") == [0, 1, 2]
    for step in range(60):
        computed = req.num_computed_tokens  # the position of the token this step computes
        decode(kv, req, 1000 + step)
        blocks = kv.get_blocks("a")
        boundary = first_visible_key(computed, window)
        for i, block in enumerate(blocks):
            ends_before = (i + 1) * BS <= boundary  # every token of the block is invisible
            assert (block is NULL_BLOCK) is ends_before, (computed, i)
    # c = 46: the query at 46 still sees key 15 (block 0); c = 47 sees from 16 on.
    kv2 = KVCacheManager(num_blocks=16, block_size=BS, sliding_window=window)
    req2 = make_request("b", list(range(46)))
    prefill(kv2, req2)
    decode(kv2, req2, 7)  # computes position 46
    assert kv2.get_blocks("b")[0] is not NULL_BLOCK
    decode(kv2, req2, 8)  # computes position 47
    assert kv2.get_blocks("b")[0] is NULL_BLOCK and kv2.get_block_ids("b")[0] == 0


def test_released_full_block_stays_a_cache_hit_and_pool_counts() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, sliding_window=16)
    prompt = list(range(40))
    req = make_request("a", prompt)
    prefill(kv, req)
    block0 = kv.get_blocks("a")[0]
    assert kv.num_free_blocks == 5
    decode(kv, req, 1)  # computes position 40: keys from 25 on; block 0 (0..15) leaves
    assert kv.get_blocks("a")[0] is NULL_BLOCK
    assert kv.num_free_blocks == 6 and block0.ref_cnt == 0
    assert block0 in kv.block_pool.free_queue
    assert kv.block_pool.free_queue.blocks()[-1] is block0  # cached: at the LRU back
    assert kv.block_pool.get_cached_block(req.block_hashes[0]) is block0
    # A later request with the same prefix hits it (and revives it), as in vLLM.
    other = make_request("b", prompt[:20])
    hits, num_hit = kv.get_computed_blocks(other)
    assert hits == [block0] and num_hit == 16
    assert kv.allocate_slots(other, other.num_tokens - num_hit, hits) is not None
    assert block0.ref_cnt == 1 and kv.num_free_blocks == 4
    assert kv.window is not None and kv.window.num_released == 1


def test_without_caching_released_blocks_are_reused_first() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_caching=False, sliding_window=16)
    req = make_request("a", list(range(40)))
    prefill(kv, req)
    block0 = kv.get_blocks("a")[0]
    decode(kv, req, 1)
    assert block0.block_hash is None and kv.block_pool.free_queue.blocks()[0] is block0


def test_free_and_preemption_release_only_held_blocks() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, sliding_window=16)
    req = make_request("a", list(range(60)))
    prefill(kv, req)
    for t in range(30):
        decode(kv, req, t)
    nulls = sum(b is NULL_BLOCK for b in kv.get_blocks("a"))
    assert nulls >= 3 and NULL_BLOCK.ref_cnt == 0
    kv.free(req)  # what preemption and finishing do: no double free, nothing left held
    assert kv.num_free_blocks == 8 and NULL_BLOCK.ref_cnt == 0
    assert kv.get_blocks("a") == []
    req.num_computed_tokens = 0  # recompute after preemption: the prefix is looked up again
    hits, num_hit = kv.get_computed_blocks(req)
    assert num_hit == len(hits) * BS and hits == [kv.block_pool.get_cached_block(h)
                                                  for h in req.block_hashes[: len(hits)]]
    assert kv.allocate_slots(req, req.num_tokens - num_hit, hits) is not None


def test_shared_blocks_stay_held_until_every_sharer_releases_them() -> None:
    """n > 1: the second sample hits the first one's prompt blocks; each drops its reference."""
    kv = KVCacheManager(num_blocks=12, block_size=BS, sliding_window=16)
    prompt = list(range(33))
    a, b = make_request("p#0", prompt), make_request("p#1", prompt)
    prefill(kv, a)
    prefill(kv, b)
    shared = kv.get_blocks("p#0")[0]
    assert kv.get_blocks("p#1")[0] is shared and shared.ref_cnt == 2
    for t in range(8):
        decode(kv, a, t)
    assert kv.get_blocks("p#0")[0] is NULL_BLOCK and shared.ref_cnt == 1
    assert shared not in kv.block_pool.free_queue
    for t in range(8):
        decode(kv, b, t)
    assert shared.ref_cnt == 0 and shared in kv.block_pool.free_queue


@pytest.mark.parametrize("window, block_size", [(32, 16), (20, 16), (32, 32), (7, 4)])
def test_long_generation_holds_a_bounded_number_of_blocks(window: int, block_size: int) -> None:
    bound = math.ceil(window / block_size) + 2
    kv = KVCacheManager(num_blocks=bound, block_size=block_size, sliding_window=window)
    req = make_request("a", list(range(10)), bs=block_size)
    prefill(kv, req)
    for t in range(400):  # 410 tokens would need 26+ blocks without freeing
        assert decode(kv, req, t) is not None, t
    assert kv.peak_request_blocks <= bound
    assert kv.stats.peak_blocks_in_use <= bound
    assert kv.num_free_blocks >= bound - 2 - (window - 1) // block_size


def test_no_window_keeps_every_block() -> None:
    kv = KVCacheManager(num_blocks=32, block_size=BS)
    req = make_request("a", list(range(10)))
    prefill(kv, req)
    for t in range(100):
        decode(kv, req, t)
    assert NULL_BLOCK not in kv.get_blocks("a") and kv.peak_request_blocks == 7
    assert kv.window is None
    with pytest.raises(ValueError, match="sliding_window"):
        KVCacheManager(num_blocks=4, block_size=BS, sliding_window=0)


@pytest.mark.parametrize("caching", [True, False])
def test_scheduler_chunked_prefill_and_preemption_never_hide_a_visible_block(caching: bool
                                                                             ) -> None:
    """The scheduler, chunking (budget 24) and preempting in a small pool, with the model
    played by appending tokens: every step's queries find each block they can see."""
    window = 24
    kv = KVCacheManager(num_blocks=9, block_size=BS, enable_caching=caching,
                        sliding_window=window)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=4,
                                      max_model_len=512), kv)
    shared = list(range(40))
    reqs = [make_request(str(i), shared + [100 + i] * (5 + 7 * i)) for i in range(4)]
    for req in reqs:
        sched.add_request(req)
    while sched.has_unfinished():
        out = sched.schedule()
        assert out.requests, "nothing scheduled while requests wait"
        for req, n in zip(out.requests, out.num_new_tokens, strict=True):
            blocks = kv.get_blocks(req.request_id)
            first = first_visible_key(req.num_computed_tokens, window)
            last = req.num_computed_tokens + n - 1
            assert all(b is not NULL_BLOCK for b in blocks[first // BS : last // BS + 1])
        sched.update_after_step(out)
        for req in list(out.requests):
            if req.num_computed_tokens == req.num_tokens:
                req.append_output_token(7)
                if req.num_output_tokens == 60:
                    sched.finish(req, RequestStatus.FINISHED_LENGTH)
    assert sched.num_preemptions > 0
    assert kv.num_free_blocks == 9 and kv.window is not None and kv.window.num_released > 0
    # Without freeing, each request would hold ceil((45 + 60) / 16) = 7+ of the 9 blocks.
    assert kv.peak_request_blocks <= math.ceil(window / BS) + 2 + 40 // BS

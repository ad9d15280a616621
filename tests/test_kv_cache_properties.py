"""KVCacheManager against a simple reference model, driven by random scheduler-like ops.

The test plays the scheduler and the model runner: it admits requests (lookup +
allocate), runs prefill chunks and decode steps, preempts, finishes and aborts.
It tracks which prefix each block's KV was computed for, so a cache hit can be
checked to serve exactly the request's own prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcli.engine.kv_cache import KVCacheManager
from kvcli.engine.request import Request
from kvcli.hashing import hash_token_blocks
from kvcli.sampling_params import SamplingParams

BS = 4
# Prompts share prefixes of these bases, so hits, duplicates and evictions all happen.
BASES = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 9, 9, 9, 9], [7] * 12]

Identity = tuple[str | None, tuple[int, ...]]  # (salt, every token up to the block's end)


class KVCacheMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(3, 16), caching=st.booleans())
    def setup(self, num_blocks: int, caching: bool) -> None:
        self.kv = KVCacheManager(num_blocks, BS, enable_caching=caching)
        self.tables: dict[str, list[int]] = {}  # request -> block ids, from return values
        self.running: dict[str, Request] = {}
        self.waiting: dict[str, Request] = {}
        self.identity: dict[int, Identity] = {}  # block id -> prefix its KV was computed for
        self.free_order = list(range(num_blocks))  # reference LRU queue, front first
        self.next_id = 0
        # Lookups: admitted ones count once; a waiting request's latest lookup counts too.
        self.admitted: list[tuple[int, int, bool]] = []
        self.pending: dict[str, tuple[int, int, bool]] = {}

    # ----------------------------------------------------------- model steps
    def _holders(self, block_id: int) -> int:
        return sum(table.count(block_id) for table in self.tables.values())

    def _schedule(self, req: Request, num_new: int, hit_ids: Sequence[int] = (),
                  run: bool = True) -> bool:
        """allocate_slots checked against the model; on success the step runs if ``run``."""
        table = self.tables.get(req.request_id, [])
        total = req.num_computed_tokens + len(hit_ids) * BS + num_new
        needed = max(0, -(-total // BS) - len(table) - len(hit_ids))
        revived = [b for b in hit_ids if self._holders(b) == 0]
        short = needed + len(revived) > len(self.free_order)
        before = (self.kv.block_pool.free_queue.blocks(), dict(self.kv.block_pool.cached))
        hits = [self.kv.block_pool.blocks[b] for b in hit_ids]
        new = self.kv.allocate_slots(req, num_new, hits)
        if new is None:
            assert short
            after = (self.kv.block_pool.free_queue.blocks(), dict(self.kv.block_pool.cached))
            assert after == before
            return False
        assert not short
        new_ids = [b.block_id for b in new]
        for b in revived:
            self.free_order.remove(b)
        assert new_ids == self.free_order[:needed]  # LRU front first
        del self.free_order[:needed]
        for b in new_ids:
            self.identity.pop(b, None)  # about to be overwritten
        self.tables[req.request_id] = table + list(hit_ids) + new_ids
        req.num_computed_tokens += len(hit_ids) * BS
        if run:
            self._run_step(req, num_new)
        return True

    def _run_step(self, req: Request, num_new: int) -> None:
        start, end = req.num_computed_tokens, req.num_computed_tokens + num_new
        table = self.tables[req.request_id]
        for i in range(start // BS, end // BS):  # blocks completed by this step
            self.identity[table[i]] = (req.cache_salt, tuple(req.token_ids[: (i + 1) * BS]))
        req.num_computed_tokens = end

    def _free(self, req: Request) -> None:
        self.kv.free(req)
        for b in reversed(self.tables.pop(req.request_id)):
            if self._holders(b) == 0:
                hashed = self.kv.block_pool.blocks[b].block_hash is not None
                self.free_order.insert(len(self.free_order) if hashed else 0, b)
        del self.running[req.request_id]

    def _admit(self, req: Request, chunk: int) -> bool:
        hits, num_hit = self.kv.get_computed_blocks(req)
        assert num_hit == len(hits) * BS < max(req.num_tokens, 1)
        cached = self.kv.block_pool.cached if self.kv.enable_caching else {}
        longest = 0
        while longest < (req.num_tokens - 1) // BS and req.block_hashes[longest] in cached:
            longest += 1
        assert len(hits) == longest
        if self.kv.enable_caching:
            self.pending[req.request_id] = (req.num_tokens, num_hit, req.num_preemptions > 0)
        for i, block in enumerate(hits):  # a hit serves exactly this request's prefix
            assert self.identity[block.block_id] == (
                req.cache_salt, tuple(req.token_ids[: (i + 1) * BS]))
        num_new = min(chunk, req.num_tokens - num_hit)
        if not self._schedule(req, num_new, [b.block_id for b in hits]):
            return False
        self.waiting.pop(req.request_id, None)
        self.running[req.request_id] = req
        if self.kv.enable_caching:
            self.admitted.append(self.pending.pop(req.request_id))
        return True

    def _preempt(self, req: Request) -> None:
        self._free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting[req.request_id] = req

    # ------------------------------------------------------------------ rules
    @rule(base=st.sampled_from(BASES), keep=st.integers(0, 12),
          tail=st.lists(st.integers(0, 3), max_size=9), salt=st.sampled_from([None, "s"]),
          chunk=st.integers(1, 24))
    def add_request(self, base: list[int], keep: int, tail: list[int], salt: str | None,
                    chunk: int) -> None:
        tokens = base[:keep] + tail or [0]
        req = Request(f"r{self.next_id}", tokens, SamplingParams(), cache_salt=salt, block_size=BS)
        self.next_id += 1
        self.waiting[req.request_id] = req
        self._admit(req, chunk)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), chunk=st.integers(1, 24))
    def readmit(self, data: st.DataObject, chunk: int) -> None:
        self._admit(data.draw(st.sampled_from(sorted(self.waiting.values(),
                                                     key=lambda r: r.request_id))), chunk)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), chunk=st.integers(1, 24), token=st.integers(0, 3))
    def step(self, data: st.DataObject, chunk: int, token: int) -> None:
        req = data.draw(st.sampled_from(sorted(self.running.values(), key=lambda r: r.request_id)))
        if req.num_computed_tokens == req.num_tokens:  # decode: sample, then schedule it
            req.append_output_token(token)
        num_new = min(chunk, req.num_tokens - req.num_computed_tokens)
        if not self._schedule(req, num_new):
            self._preempt(req)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), abort_before_run=st.booleans())
    def finish(self, data: st.DataObject, abort_before_run: bool) -> None:
        req = data.draw(st.sampled_from(sorted(self.running.values(), key=lambda r: r.request_id)))
        if abort_before_run and req.num_computed_tokens < req.num_tokens:
            # Allocated (and registered) for a step that is then never run.
            self._schedule(req, req.num_tokens - req.num_computed_tokens, run=False)
        self._free(req)

    @rule()
    def reset_prefix_cache(self) -> None:
        idle = not any(self.tables.values())
        assert self.kv.reset_prefix_cache() is idle
        if idle:
            assert not self.kv.block_pool.cached

    # ------------------------------------------------------------- invariants
    @invariant()
    def pool_is_consistent(self) -> None:
        pool = self.kv.block_pool
        free = pool.free_queue.blocks()
        assert [b.block_id for b in free] == self.free_order
        for block in pool.blocks:
            assert block.ref_cnt == self._holders(block.block_id)
            assert (block in pool.free_queue) == (block.ref_cnt == 0)
        in_use = sum(1 for b in pool.blocks if b.ref_cnt > 0)
        assert len(free) + in_use == pool.num_blocks == self.kv.num_free_blocks + in_use
        for rid, table in self.tables.items():
            assert self.kv.get_block_ids(rid) == table
        assert self.kv.stats.peak_blocks_in_use >= in_use

    @invariant()
    def stats_count_each_admission_once(self) -> None:
        lookups = self.admitted + list(self.pending.values())
        s = self.kv.stats
        for preempted, (reqs, queries, hits) in (
            (False, (s.requests, s.queries, s.hits)),
            (True, (s.preempted_requests, s.preempted_queries, s.preempted_hits)),
        ):
            mine = [(n, h) for n, h, p in lookups if p is preempted]
            assert queries == sum(n for n, _ in mine) and hits == sum(h for _, h in mine)
            assert reqs == len(mine)

    @invariant()
    def cached_hashes_name_their_contents(self) -> None:
        pool = self.kv.block_pool
        if not self.kv.enable_caching:
            assert not pool.cached
        for block_hash, block in pool.cached.items():
            assert block.block_hash == block_hash
            assert block.block_id in self.identity, "a cached block's KV was never computed"
            salt, tokens = self.identity[block.block_id]
            assert hash_token_blocks(tokens, BS, cache_salt=salt)[-1] == block_hash
        assert all(b.block_hash is None or pool.cached[b.block_hash] is b for b in pool.blocks)


TestKVCacheMachine = KVCacheMachine.TestCase
TestKVCacheMachine.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

"""Per-request paged KV-cache bookkeeping with hash-chained prefix caching (torch-free).

Layout of one request's blocks, as :meth:`KVCacheManager.allocate_slots` sees it::

    | computed (owned) | new_computed (cache hits) | new (to compute now) | unused tail |
    '--------------- num_computed_tokens ---------'--- num_new_tokens ---'

A block is registered in the prefix-cache index as soon as it will be full after
the step being scheduled (like vLLM), so a request admitted later in the same
step already hits it. The lookup walks ``request.block_hashes`` from block 0 and
stops at the first miss: hashes are chained, so every later block misses too.
With a disk tier (``--kv-cache-dir``) a block missing in memory is looked up on
disk before the walk gives up; a disk hit is loaded into a free pool block and
indexed like any computed block, so it is an ordinary memory hit from then on
(kvcli/engine/disk_blocks.py).
With ``sliding_window`` (every layer windowed), blocks a running request can no longer attend
become placeholders and go back to the pool (kvcli/engine/sliding_window.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvcli.engine.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from kvcli.engine.disk_blocks import DiskBlocks, DiskTier
from kvcli.engine.prefix_stats import PrefixCacheStats
from kvcli.engine.request import Request
from kvcli.engine.sliding_window import NULL_BLOCK, SlidingWindowFreer
from kvcli.hashing import BlockHash

__all__ = [
    "BlockPool",
    "DiskTier",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "NULL_BLOCK",
    "PrefixCacheStats",
]


@dataclass(slots=True)
class _RequestBlocks:
    """What the manager remembers about one request's blocks."""

    blocks: list[KVCacheBlock] = field(default_factory=list)
    num_registered: int = 0  # leading blocks already offered to the cache index
    # Leading blocks known to hold computed KV (cache hits, or computed before the
    # latest allocation); blocks registered after them may not be written yet.
    num_known_computed: int = 0
    num_released: int = 0  # leading entries that are NULL_BLOCK (left the sliding window)


class KVCacheManager:
    """Hands out KV-cache blocks to requests and finds their cached prefixes."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 disk: DiskTier | None = None, sliding_window: int | None = None) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: expected an integer >= 1, got {block_size!r}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.stats = PrefixCacheStats()
        self._requests: dict[str, _RequestBlocks] = {}
        # Lookup recorded for a request not admitted yet: a retry replaces it, so a
        # request that waits several steps for blocks is counted once.
        self._pending_lookups: dict[str, tuple[int, int, bool]] = {}
        self.disk_hit_tokens: dict[str, int] = {}  # request id -> tokens loaded from disk
        self.disk: DiskBlocks | None = None  # what comes from and goes to the disk tier
        if disk is not None and enable_caching:
            self.disk = DiskBlocks(disk, self.block_pool, block_size, self.stats,
                                   self.disk_hit_tokens)
        self.window = (None if sliding_window is None else
                       SlidingWindowFreer(sliding_window, block_size, self.block_pool))
        self.peak_request_blocks = 0  # most pool blocks one request held at once

    # ------------------------------------------------------------------ lookup
    def get_computed_blocks(
        self, request: Request, record_stats: bool = True
    ) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of ``request`` as (blocks, tokens); no other side effects.

        At least one token is left to compute: the engine needs its logits, so a
        fully cached prompt gives up its last hit block. ``record_stats=False``
        makes a pure probe (e.g. for cache-aware ordering of the waiting queue) that never
        reads the disk tier; otherwise disk hits are loaded into the pool first.
        """
        if not self.enable_caching or not request.reads_prefix_cache:
            return [], 0  # e.g. prompt logprobs need the logits of every prompt position
        self._check_block_size(request)
        max_hit_blocks = max(0, request.num_tokens - 1) // self.block_size
        hashes = request.block_hashes[:max_hit_blocks]
        hits: list[KVCacheBlock] = []
        for block_hash in hashes:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        if record_stats and self.disk is not None and len(hits) < len(hashes):
            hits = self.disk.continue_walk(hits, hashes)
        num_hit_tokens = len(hits) * self.block_size
        if record_stats:
            self._record_lookup(request, num_hit_tokens)
        return hits, num_hit_tokens

    def _record_lookup(self, request: Request, num_hit_tokens: int) -> None:
        lookup = (request.num_tokens, num_hit_tokens, request.num_preemptions > 0)
        previous = self._pending_lookups.get(request.request_id)
        if previous is not None:
            self.stats.record(*previous, count=-1)
        self.stats.record(*lookup)
        self._pending_lookups[request.request_id] = lookup

    # -------------------------------------------------------------- allocation
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> list[KVCacheBlock] | None:
        """Own blocks for every token up to the end of this step; None (untouched) if short.

        Returns the newly allocated blocks. ``new_computed_blocks`` are the hits
        from :meth:`get_computed_blocks`, taken only by a request holding no blocks.
        With a sliding window, blocks out of it are released first, even when None follows:
        they are never needed again, and they may be what lets this allocation succeed.
        """
        state = self._requests.get(request.request_id)
        if state is not None and self.window is not None:
            state.num_released = self.window.release(state.blocks, state.num_released,
                                                     request.num_computed_tokens)
        owned = state.blocks if state is not None else []
        self._check_allocation(request, num_new_tokens, owned, new_computed_blocks)
        num_hit = len(new_computed_blocks)
        total_tokens = request.num_computed_tokens + num_hit * self.block_size + num_new_tokens
        num_needed = max(0, -(-total_tokens // self.block_size) - len(owned) - num_hit)
        # Reviving a free hit block takes it out of the free pool too.
        num_revived = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        if num_needed + num_revived > self.block_pool.num_free_blocks:
            return None

        if state is None:
            state = self._requests[request.request_id] = _RequestBlocks()
            self._pending_lookups.pop(request.request_id, None)
            if self.disk is not None:
                self.disk.credit(request, new_computed_blocks)
        known = max(num_hit, request.num_computed_tokens // self.block_size)
        state.num_known_computed = max(state.num_known_computed, known)
        self.block_pool.touch(new_computed_blocks)
        state.blocks.extend(new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_needed)
        state.blocks.extend(new_blocks)
        if self.enable_caching:
            self._register_full_blocks(request, state, total_tokens)
        held = len(state.blocks) - state.num_released
        self.peak_request_blocks = max(self.peak_request_blocks, held)
        self._update_pool_stats()
        return new_blocks

    def _check_allocation(
        self,
        request: Request,
        num_new_tokens: int,
        owned: list[KVCacheBlock],
        new_computed_blocks: Sequence[KVCacheBlock],
    ) -> None:
        """Catch scheduler bookkeeping slips before they corrupt the block tables."""
        self._check_block_size(request)
        rid = request.request_id
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens: expected an integer >= 0, got {num_new_tokens}")
        if new_computed_blocks and owned:
            raise ValueError(f"new_computed_blocks: request {rid!r} already holds blocks")
        if request.num_computed_tokens > len(owned) * self.block_size:
            raise ValueError(
                f"num_computed_tokens: request {rid!r} claims {request.num_computed_tokens} "
                f"computed tokens but holds {len(owned)} blocks"
            )

    def _register_full_blocks(
        self, request: Request, state: _RequestBlocks, total_tokens: int
    ) -> None:
        """Index the blocks that will be full once this step has run.

        Only real tokens have hashes, so speculative or padding slots never get cached.
        """
        hashes = request.block_hashes
        num_full = min(total_tokens // self.block_size, len(hashes))
        for i in range(state.num_registered, num_full):
            block = state.blocks[i]
            fresh = block.block_hash is None  # not a hit: this step computes its K/V
            if self.block_pool.cache_block(block, hashes[i]) and fresh and self.disk is not None:
                self.disk.filled.append((block, hashes[i]))
        state.num_registered = max(state.num_registered, num_full)

    def _update_pool_stats(self) -> None:
        in_use = self.block_pool.num_blocks - self.block_pool.num_free_blocks
        self.stats.peak_blocks_in_use = max(self.stats.peak_blocks_in_use, in_use)
        self.stats.evicted_blocks = self.block_pool.num_evicted_blocks

    def drain_new_full_blocks(self) -> list[tuple[int, BlockHash]]:
        """(block id, hash) of every block the step just run filled, for the disk tier
        (:meth:`DiskBlocks.drain_filled`); always empty without one."""
        return self.disk.drain_filled() if self.disk is not None else []

    # ------------------------------------------------------------------- free
    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, so a chain's tail is evicted before its head.

        Blocks registered at allocation whose step never ran (the request was
        preempted or aborted first) would serve unwritten KV: they are unindexed.
        Call this before resetting ``num_computed_tokens`` on preemption.
        """
        self._pending_lookups.pop(request.request_id, None)
        state = self._requests.pop(request.request_id, None)
        if state is None:
            return
        computed = max(state.num_known_computed, request.num_computed_tokens // self.block_size)
        for block in state.blocks[computed : state.num_registered]:
            self.block_pool.uncache_block(block)
        self.block_pool.free_blocks(reversed(state.blocks[state.num_released:]))

    # ---------------------------------------------------------------- queries
    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """The request's block list; released entries are ``sliding_window.NULL_BLOCK``."""
        state = self._requests.get(request_id)
        return list(state.blocks) if state is not None else []

    def get_block_ids(self, request_id: str) -> list[int]:
        state = self._requests.get(request_id)
        return [block.block_id for block in state.blocks] if state is not None else []

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return self.block_pool.num_cached_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    def reset_prefix_cache(self) -> bool:
        """Forget all cached prefixes; False (nothing done) while any request holds blocks."""
        return self.block_pool.reset_prefix_cache()

    def _check_block_size(self, request: Request) -> None:
        if request.block_size != self.block_size:
            raise ValueError(
                f"block_size: request {request.request_id!r} hashes blocks of "
                f"{request.block_size} tokens, the KV cache uses {self.block_size}"
            )

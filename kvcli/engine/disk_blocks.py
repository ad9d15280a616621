"""The KV-cache manager's side of the disk tier (torch-free): blocks that come from it, blocks
that go to it.

With ``--kv-cache-dir`` the hit walk of :meth:`KVCacheManager.get_computed_blocks` does not give
up at the first memory miss: it goes on asking the disk for each next hash, loading every disk
hit into a free pool block that is then indexed like any computed block (an ordinary memory hit
from then on). The first request to take a loaded block is credited with it as a disk hit.
In the other direction, every block a step computes and indexes is queued here, and handed to
the writer (kvcli/engine/kv_disk.py) once the forward pass has filled it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvcli.engine.block_pool import BlockPool, KVCacheBlock
from kvcli.engine.prefix_stats import PrefixCacheStats
from kvcli.engine.request import Request
from kvcli.hashing import BlockHash


class DiskTier(Protocol):
    """Where blocks missing in memory may still be found (kvcli/engine/kv_disk.py)."""

    def load(self, block_hash: BlockHash, block_id: int) -> bool:
        """Fill pool block ``block_id`` with the block named ``block_hash``; False if absent."""
        ...


@dataclass(slots=True)
class DiskBlocks:
    """Loads, credits and queues for saving the blocks of one manager's pool."""

    disk: DiskTier
    pool: BlockPool
    block_size: int
    stats: PrefixCacheStats  # the manager's counters: disk hits are a part of its hits
    hit_tokens: dict[str, int]  # request id -> tokens loaded from disk (the manager's dict)
    filled: list[tuple[KVCacheBlock, BlockHash]] = field(default_factory=list)  # this step

    def continue_walk(self, hits: list[KVCacheBlock],
                      hashes: list[BlockHash]) -> list[KVCacheBlock]:
        """The same walk past the first memory miss, loading disk hits into pool blocks.

        The walk's blocks are pinned meanwhile, so taking a free block for a load can
        never evict a block of this very prefix; released, they are cached free blocks
        (most recently used) that ``allocate_slots`` takes like any hit. A load takes a
        block the request needs anyway (a full block is a hit or computed, in a pool block
        either way), so loading never makes an admission fail that would have succeeded.
        """
        pool = self.pool
        pool.touch(hits)
        walk = list(hits)
        try:
            for block_hash in hashes[len(walk):]:
                block = pool.get_cached_block(block_hash)
                if block is not None:
                    pool.touch([block])
                elif pool.num_free_blocks == 0 or (block := self._load(block_hash)) is None:
                    break
                walk.append(block)
        finally:
            pool.free_blocks(reversed(walk))
        return walk

    def _load(self, block_hash: BlockHash) -> KVCacheBlock | None:
        [block] = self.pool.get_new_blocks(1)
        if not self.disk.load(block_hash, block.block_id):
            self.pool.free_blocks([block])
            return None
        self.pool.cache_block(block, block_hash)
        block.from_disk = True
        return block

    def credit(self, request: Request, hits: Sequence[KVCacheBlock]) -> None:
        """Credit the blocks loaded from disk to the first request that takes them."""
        tokens = self.block_size * sum(block.from_disk for block in hits)
        for block in hits:
            block.from_disk = False
        if request.num_preemptions == 0:
            self.stats.disk_hits += tokens
        self.hit_tokens.setdefault(request.request_id, tokens)

    def drain_filled(self) -> list[tuple[int, BlockHash]]:
        """(block id, hash) of every block the step just run filled, for the disk tier.

        Call after the forward pass. A block unindexed or reused before the step ran (its
        request was preempted in the same schedule) no longer carries its hash: skipped.
        """
        done = [(b.block_id, h) for b, h in self.filled if b.block_hash == h]
        self.filled.clear()
        return done

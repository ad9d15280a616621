"""The physical KV-cache blocks, their free LRU queue and the prefix-cache index (torch-free).

Every block is created once. A block is *in use* while ``ref_cnt > 0`` and *free*
otherwise; free blocks sit in :class:`FreeKVCacheBlockQueue`, least recently
freed at the front. A free block keeps its hash and stays a cache hit until it
is popped for reuse (lazy eviction), so freeing costs nothing and a popular
prefix survives as long as there is room.

Invariant kept by :class:`BlockPool`: ``block.block_hash is not None`` exactly when
``cached[block.block_hash] is block``, i.e. a hash names at most one block.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kvcli.hashing import BlockHash


# eq=False: blocks are compared by identity; a generated __eq__ would walk the links.
@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One physical block of ``block_size`` token slots in the KV cache."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    # Loaded from the disk cache and not yet taken by a request: its first taker counts a
    # disk hit, later ones a memory hit (disk_blocks.DiskBlocks.credit).
    from_disk: bool = False
    # Intrusive links of the free queue: None while the block is in use.
    prev_free: KVCacheBlock | None = field(default=None, repr=False)
    next_free: KVCacheBlock | None = field(default=None, repr=False)


class FreeKVCacheBlockQueue:
    """Doubly-linked LRU queue threaded through the blocks themselves.

    All operations are O(1) and allocate nothing. ``remove`` from the middle is
    what a cache hit on a free block needs (``deque.remove`` would be O(n)).
    Two sentinel nodes mean no ``None`` checks on the hot path.
    """

    __slots__ = ("_head", "_tail", "_len")

    def __init__(self, blocks: Iterable[KVCacheBlock] = ()) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.prev_free is not None

    def __iter__(self) -> Iterator[KVCacheBlock]:
        node = self._head.next_free
        while node is not self._tail:
            assert node is not None
            yield node
            node = node.next_free

    def blocks(self) -> list[KVCacheBlock]:
        """The queued blocks front (next to be reused) to back."""
        return list(self)

    def _link_before(self, block: KVCacheBlock, successor: KVCacheBlock) -> None:
        if block.prev_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        prev = successor.prev_free
        assert prev is not None
        block.prev_free, block.next_free = prev, successor
        prev.next_free = successor.prev_free = block
        self._len += 1

    def append(self, block: KVCacheBlock) -> None:
        """Queue at the back: reused last."""
        self._link_before(block, self._tail)

    def appendleft(self, block: KVCacheBlock) -> None:
        """Queue at the front: reused first."""
        assert self._head.next_free is not None
        self._link_before(block, self._head.next_free)

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free, nxt.prev_free = nxt, prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail or block is None:
            raise IndexError("popleft from an empty free-block queue")
        self.remove(block)
        return block


class BlockPool:
    """All blocks of the cache, the free queue and the hash -> block index."""

    __slots__ = ("blocks", "enable_caching", "free_queue", "cached", "num_evicted_blocks")

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks: expected an integer >= 1, got {num_blocks!r}")
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.enable_caching = enable_caching
        self.free_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached: dict[BlockHash, KVCacheBlock] = {}
        self.num_evicted_blocks = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ``ref_cnt == 0``, cached or not: all can be handed out."""
        return len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (held by at least one request)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the LRU front, evicting their stale hashes; ref_cnt = 1."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot allocate {num_blocks} blocks, {self.num_free_blocks} free")
        new = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            assert block.ref_cnt == 0, "a free block must not be referenced"
            if block.block_hash is not None:
                self.uncache_block(block)
                self.num_evicted_blocks += 1
            block.ref_cnt = 1
            block.from_disk = False
            new.append(block)
        return new

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on hit blocks, reviving any that sat free in the queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching 0 are queued in the given order.

        Cached blocks go to the back and keep their hash (still a hit until reused).
        Unhashed blocks hold nothing reusable, so they go to the front and are
        recycled before any cached content is evicted.
        """
        for block in ordered_blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} freed more often than referenced")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self.free_queue.appendleft(block)
                else:
                    self.free_queue.append(block)

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash) -> bool:
        """Index ``block`` under ``block_hash``; False if another block already owns the hash.

        The existing mapping wins so block tables stay append-only; the duplicate
        simply stays uncached and is recycled first once freed.
        """
        if block.block_hash is not None:
            if block.block_hash != block_hash:
                raise ValueError(f"block {block.block_id} is already cached under another hash")
            return True
        if not self.enable_caching or block_hash in self.cached:
            return False
        block.block_hash = block_hash
        self.cached[block_hash] = block
        return True

    def uncache_block(self, block: KVCacheBlock) -> None:
        """Forget ``block``'s hash (its contents are stale or about to be overwritten)."""
        if block.block_hash is not None:
            del self.cached[block.block_hash]
            block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; refused (False) while any block is in use."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
        return True

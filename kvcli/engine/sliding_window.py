"""Freeing the blocks a sliding window has left behind (torch-free), as vLLM's sliding-window manager.

A model whose every attention layer has a window ``w`` (Mistral, Mixtral, Phi-3-mini-4k, Qwen2
with ``use_sliding_window`` on all layers) never attends a key older than ``w`` positions: a
query at position ``p`` sees keys in ``(p - w, p]`` (transformers' mask, ``kv > q - w``, and
``attention.common.attention_mask``). The next query of a request sits at ``num_computed_tokens``, and
later ones further right, so no future step reads a token before ``num_computed_tokens - w + 1``.
Every block that ends before it is released while the request runs:

* its block-table entry becomes :data:`NULL_BLOCK` (id 0, like the padding of the decode
  tables), which no attention path reads: the native decode kernel starts at
  ``seq_len - window``, the torch paths slice ``context_slots`` from the same first visible key,
  and the cascades that share leading blocks and the fused NumPy decode never run on windowed
  layers. Table positions stay positional, so slot arithmetic is unchanged;
* the block goes back to the pool: a hashed (full) block as a free-but-cached block at the LRU
  back, still a prefix-cache hit for later requests until it is reused, an unhashed one first.

Models with any global layer (Gemma 2/3 mix local and global layers) keep every block: the
global layers attend the whole context. A prefix-cache hit on admission still takes all its
blocks (the hit walk runs from block 0); the request frees them from its next step on.
Preemption frees the rest as usual, and recomputation looks the prefix up again from block 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcli.engine.block_pool import BlockPool, KVCacheBlock

#: The placeholder of a released block in a request's block list; never in the pool, never
#: referenced, never hashed. Its id, 0, is a real block's: harmless to address, and never read.
NULL_BLOCK = KVCacheBlock(0)


@dataclass(slots=True)
class SlidingWindowFreer:
    """Releases out-of-window blocks of running requests back to ``pool``."""

    window: int
    block_size: int
    pool: BlockPool
    num_released: int = 0  # blocks handed back during runs, over the manager's life

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"sliding_window: expected an integer >= 1, got {self.window!r}")

    def first_useful_block(self, num_computed_tokens: int) -> int:
        """Index of the first block a query at ``num_computed_tokens`` or later can attend."""
        return max(0, num_computed_tokens - self.window + 1) // self.block_size

    def release(self, blocks: list[KVCacheBlock], num_released: int,
                num_computed_tokens: int) -> int:
        """Replace ``blocks[num_released:first useful]`` by NULL_BLOCK and free them, oldest
        first (so the oldest is evicted first); returns the new count of leading placeholders.

        Only computed blocks can fall out of the window, never one this step writes.
        """
        end = min(self.first_useful_block(num_computed_tokens), len(blocks))
        if end <= num_released:
            return num_released
        released = blocks[num_released:end]
        blocks[num_released:end] = [NULL_BLOCK] * (end - num_released)
        self.pool.free_blocks(released)
        self.num_released += len(released)
        return end

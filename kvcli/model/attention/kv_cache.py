"""The paged KV pool: one flat-slot tensor for all layers (layout in common.py), sized by bytes."""

from __future__ import annotations

from typing import Protocol

import torch


class KVCacheSpec(Protocol):
    """Anything that knows the cache geometry: a loaded model or its ModelConfig."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def kv_cache_bytes_per_block(spec: KVCacheSpec, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block costs across all layers (K and V), to size the pool from a byte budget."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return spec.num_layers * 2 * block_size * spec.num_kv_heads * spec.head_dim * element_size


def allocate_kv_cache(
    spec: KVCacheSpec,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    # Zeroed rather than empty so that a bookkeeping bug reads zeros, not NaN garbage.
    shape = (spec.num_layers, 2, num_blocks * block_size, spec.num_kv_heads, spec.head_dim)
    # Not a lazily zeroed (calloc) pool: first-touch page faults then land inside decode steps,
    # one per new block and layer, and cost ~20 us each on a VM (32x slower KV writes, measured).
    # On CPU the pages are faulted in by a background thread instead (kv_pool.py): torch.zeros
    # of 1 GiB held start-up ~1.4 s.
    if torch.device(device).type == "cpu":
        from kvcli.model.kv_pool import zeroed_cpu_tensor

        return zeroed_cpu_tensor(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)

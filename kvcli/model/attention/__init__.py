"""Paged attention: one backend per route, chosen once per model (selector.py), and the KV pool.

The model runner builds the step's common fields (:func:`build_attention_metadata`); the
model's backend builds its own metadata from them and every layer runs that backend's
implementation. Import a backend from its module, the selector from ``selector``.
"""

from kvcli.model.attention.common import (
    AttentionBackend,
    AttentionImpl,
    CommonAttentionMetadata,
    LayerAttention,
    build_common_metadata,
)
from kvcli.model.attention.kv_cache import (
    KVCacheSpec,
    allocate_kv_cache,
    kv_cache_bytes_per_block,
    kv_cache_dtype_name,
    kv_storage_dtype,
)

#: The step's common fields (the name callers and tests know).
build_attention_metadata = build_common_metadata

__all__ = [
    "AttentionBackend",
    "AttentionImpl",
    "CommonAttentionMetadata",
    "KVCacheSpec",
    "LayerAttention",
    "allocate_kv_cache",
    "build_attention_metadata",
    "build_common_metadata",
    "kv_cache_bytes_per_block",
    "kv_cache_dtype_name",
    "kv_storage_dtype",
]

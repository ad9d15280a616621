"""The paged KV pool: one flat-slot tensor for all layers (layout in common.py), sized by bytes.

``KV_CACHE_DTYPES`` maps ``--kv-cache-dtype`` to the pool's element type; ``int8`` is a uint8
pool whose rows end in their scale and zero point (native_int8.py)."""

from __future__ import annotations

from typing import Protocol

import torch

from kvcli.model.attention.native_int8 import INT8_ROW_EXTRA, INT8_STORAGE

#: --kv-cache-dtype -> the pool's element type ("auto" is the model's dtype: the engine's choice).
KV_CACHE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                   "float16": torch.float16, "int8": INT8_STORAGE}


def kv_cache_dtype_name(dtype: torch.dtype) -> str:
    """The --kv-cache-dtype name of a pool's element type (the disk cache keys by it)."""
    return next(name for name, value in KV_CACHE_DTYPES.items() if value == dtype)


def kv_storage_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's element type for ``--kv-cache-dtype name`` under a ``model_dtype`` model
    (ValueError: a combination no attention route reads)."""
    if name == "auto":
        return model_dtype
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype: expected auto or one of {', '.join(KV_CACHE_DTYPES)}, "
                         f"got {name!r}")
    dtype, model = KV_CACHE_DTYPES[name], str(model_dtype).removeprefix("torch.")
    # The native kernels compute in float32 and read float32, bfloat16 and int8 caches; the
    # torch routes read a cache in the model's dtype.
    if dtype == model_dtype or (model_dtype == torch.float32
                                and dtype in (INT8_STORAGE, torch.bfloat16)):
        return dtype
    others = ", bfloat16 or int8" if model_dtype == torch.float32 else " (int8 and bfloat16 " \
        "need --dtype float32)"
    raise ValueError(f"kv_cache_dtype: a {name} cache under a {model} model has no attention "
                     f"kernel; use auto (the model's dtype){others}")


class KVCacheSpec(Protocol):
    """Anything that knows the cache geometry: a loaded model or its ModelConfig."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def kv_row_elements(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of one (slot, KV head) row: ``head_dim``, plus the int8 cache's scale and zero
    point (a uint8 pool holds int8 rows, kvcli/model/attention/native_int8.py)."""
    return head_dim + INT8_ROW_EXTRA if dtype == INT8_STORAGE else head_dim


def kv_cache_bytes_per_block(spec: KVCacheSpec, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block costs across all layers (K and V), to size the pool from a byte budget."""
    element_size = torch.empty((), dtype=dtype).element_size()
    row = kv_row_elements(spec.head_dim, dtype)
    return spec.num_layers * 2 * block_size * spec.num_kv_heads * row * element_size


def allocate_kv_cache(
    spec: KVCacheSpec,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    # Zeroed rather than empty so that a bookkeeping bug reads zeros, not NaN garbage.
    shape = (spec.num_layers, 2, num_blocks * block_size, spec.num_kv_heads,
             kv_row_elements(spec.head_dim, dtype))
    # Not a lazily zeroed (calloc) pool: first-touch page faults then land inside decode steps,
    # one per new block and layer, and cost ~20 us each on a VM (32x slower KV writes, measured).
    # On CPU the pages are faulted in by a background thread instead (kv_pool.py): torch.zeros
    # of 1 GiB held start-up ~1.4 s.
    if torch.device(device).type == "cpu":
        from kvcli.model.kv_pool import zeroed_cpu_tensor

        return zeroed_cpu_tensor(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)

"""`kvcli audit --kv-cache-dir DIR`: blocks a persistent KV cache already holds count as hits.

A prompt's leading blocks that no earlier prompt produced may still be on disk from an
earlier `kvcli generate --kv-cache-dir DIR` run; the engine loads those instead of computing
them, so the audit counts them too. The store is found under the same model fingerprint
generate keys it by (kvcli/kvstore/fingerprint.py, torch-free): the model's config and
weight bytes, dtype, block size, layout, RoPE and quantization. The audit only stats
files: it never writes to DIR.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from pathlib import Path

from kvcli.hashing import BlockHash


def open_disk_hits(cache_dir: str, model_dir: Path, block_size: int, label: str,
                   quantization: str | None = None, dtype: str = "float32",
                   device_type: str = "cpu", kv_cache_dtype: str = "auto") -> Container[bytes]:
    """The hashes on disk for this model and setting (raises ValueError with a clear message)."""
    from kvcli.audit.capacity import model_config
    from kvcli.kvstore.directory import open_cache_dir
    from kvcli.kvstore.fingerprint import model_fingerprint
    from kvcli.kvstore.store import ModelStore
    from kvcli.paths import file_digests_dir

    root = open_cache_dir(cache_dir, create=False)
    # ``model_dir`` is the one generate runs: a GGUF's own directory under gguf and gguf-int
    # (the tokenizer's, resolved with the same mode: command.py), else the float model's.
    fingerprint = model_fingerprint(model_config(model_dir), model_dir, dtype, device_type,
                                    block_size, label, file_digests_dir(), quantization,
                                    kv_cache_dtype)
    return ModelStore(root, fingerprint.digest(), fingerprint.describe())


def with_disk(matched: int, hashes: Sequence[BlockHash], disk: Container[bytes] | None) -> int:
    """Leading blocks found in memory (``matched``), then on disk: the walk stops at the first
    block in neither, as the engine's (kvcli/engine/kv_cache.py) does."""
    if disk is None:
        return matched
    while matched < len(hashes) and hashes[matched] in disk:
        matched += 1
    return matched

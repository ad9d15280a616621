"""kvcli's persistent prefix cache: KV blocks on disk, keyed by model fingerprint + chain hash.

Torch-free. :mod:`format` is the file layout, :mod:`directory` a cache directory
(create, refuse, list, prune), :mod:`safety` what is refused in one (links, FIFOs,
other writers), :mod:`store` one model's blocks (read, verify, publish), :mod:`writer`
the write-behind thread, :mod:`fingerprint` the model key.
The engine side (copying blocks between files and the KV tensor) is
``kvcli/engine/kv_disk.py``.
"""

from __future__ import annotations

import logging
import os

from kvcli.kvstore.directory import (
    DEFAULT_MAX_BYTES,
    NotAKVCacheError,
    open_cache_dir,
    world_accessible,
)
from kvcli.kvstore.fingerprint import ModelFingerprint
from kvcli.kvstore.safety import check_trusted
from kvcli.kvstore.store import DiskStats, ModelStore
from kvcli.kvstore.writer import WriteBehind

__all__ = ["DEFAULT_MAX_BYTES", "DiskStats", "ModelFingerprint", "ModelStore",
           "NotAKVCacheError", "WriteBehind", "open_model_store"]

log = logging.getLogger("kvcli.kvstore")


def open_model_store(path: str | os.PathLike[str], fingerprint: ModelFingerprint,
                     insecure: bool = False) -> ModelStore:
    """The blocks of ``fingerprint`` in the cache directory ``path`` (created if new).

    Raises NotAKVCacheError for a directory that is not a kvcli cache, holds a link where
    a directory belongs, or that other users may write (unless ``insecure``). A read-only
    directory opens fine (hits are read; writing stops at the first attempt).
    """
    root = open_cache_dir(path)
    check_trusted(root, insecure)
    if world_accessible(root):
        log.warning("kvcli: KV cache %s is readable by other users; whoever can read it can "
                    "reconstruct what the cached prompts attended to (chmod 700 it)", root)
    return ModelStore(root, fingerprint.digest(), fingerprint.describe())

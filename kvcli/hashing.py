"""Block-hash chains: the one definition of "same prefix" shared by the engine and the audit.

A prompt's token ids are cut into blocks of ``block_size`` tokens. Only full blocks
are hashed, each chained on its parent::

    hash(block_i) = sha256(parent_i || u32le(n_tokens) || u32le(token_ids_i)...
                           || u32le(n_extra) || (u32le(len) || utf8(key))...)

``parent_0`` is :data:`ROOT_SEED` (fixed and documented, never random per
process, so separate runs and ``kvcli audit`` agree); ``parent_i`` is the digest
of block ``i-1``. Extra keys isolate tenants: a ``cache_salt`` is mixed into
block 0 only and the isolation flows down the chain, because every later block
hashes its parent. Torch-free: the audit imports this without the engine.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

#: Parent hash of block 0: sha256 of a fixed, versioned label.
ROOT_SEED: bytes = hashlib.sha256(b"kvcli/block-hash/v1").digest()
DEFAULT_BLOCK_SIZE = 16

BlockHash = bytes

_U32 = struct.Struct("<I")
_NO_EXTRA = _U32.pack(0)
assert array("I").itemsize == 4


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 bytes, in one C-level conversion."""
    arr = array("I", token_ids)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def serialize_extra_keys(extra_keys: Sequence[str]) -> bytes:
    """Length-prefixed UTF-8 strings, so ("ab", "c") and ("a", "bc") differ."""
    if not extra_keys:
        return _NO_EXTRA
    parts = [_U32.pack(len(extra_keys))]
    for key in extra_keys:
        raw = key.encode("utf-8", "surrogatepass")
        parts.append(_U32.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def block_extra_keys(block_index: int, cache_salt: str | None) -> tuple[str, ...]:
    """Extra keys of one block: the salt goes into block 0 only (it flows down the chain)."""
    if block_index == 0 and cache_salt:
        return ("salt:" + cache_salt,)
    return ()


def hash_block(
    parent: BlockHash, token_ids: Sequence[int], extra_keys: Sequence[str] = ()
) -> BlockHash:
    """The hash of one full block given its parent's hash."""
    raw = _token_bytes(token_ids)
    return _hash_raw(parent, raw, len(token_ids), serialize_extra_keys(extra_keys))


def _hash_raw(parent: bytes, raw_tokens: bytes, n_tokens: int, extra: bytes) -> bytes:
    h = hashlib.sha256(parent)
    h.update(_U32.pack(n_tokens))
    h.update(raw_tokens)
    h.update(extra)
    return h.digest()


def hash_token_blocks(
    token_ids: Sequence[int],
    block_size: int = DEFAULT_BLOCK_SIZE,
    cache_salt: str | None = None,
    parent: BlockHash = ROOT_SEED,
    start_block: int = 0,
) -> list[BlockHash]:
    """Hashes of every full block of ``token_ids`` (a trailing partial block is skipped).

    ``parent``/``start_block`` continue an existing chain: ``token_ids`` then
    begins at block ``start_block`` of the sequence.
    """
    raw = _token_bytes(token_ids)
    width = 4 * block_size
    hashes: list[BlockHash] = []
    for i in range(len(token_ids) // block_size):
        extra = serialize_extra_keys(block_extra_keys(start_block + i, cache_salt))
        parent = _hash_raw(parent, raw[i * width : (i + 1) * width], block_size, extra)
        hashes.append(parent)
    return hashes


@dataclass(slots=True)
class BlockHasher:
    """The block-hash chain of one growing sequence, extended as tokens are appended.

    Hashes are computed once: ``update`` only hashes blocks that became full
    since the last call (decode fills blocks one token at a time).
    """

    block_size: int = DEFAULT_BLOCK_SIZE
    cache_salt: str | None = None
    root: BlockHash = ROOT_SEED
    hashes: list[BlockHash] = field(default_factory=list)

    def update(self, token_ids: Sequence[int]) -> list[BlockHash]:
        """Hash the newly full blocks of ``token_ids`` (the whole sequence so far)."""
        done = len(self.hashes)
        full = len(token_ids) // self.block_size
        if full <= done:
            return []
        parent = self.hashes[-1] if self.hashes else self.root
        start = done * self.block_size
        new = hash_token_blocks(
            token_ids[start : full * self.block_size],
            self.block_size,
            self.cache_salt,
            parent=parent,
            start_block=done,
        )
        self.hashes.extend(new)
        return new

    def truncate(self, num_blocks: int) -> None:
        del self.hashes[num_blocks:]

"""The on-disk layout of a kvcli KV cache directory and of one block file (torch-free).

::

    DIR/kvcli-kv-cache.json        marker: {"format": "kvcli-kv-cache", "version": 1}
    DIR/tmp/                       files being written (same file system: rename is atomic)
    DIR/models/<fingerprint>/model.json          what the fingerprint stands for (kvcli cache ls)
    DIR/models/<fingerprint>/<hh>/<block hash>   one file per block

A block file is a fixed header followed by the block's K/V bytes for every layer
(``[layers, 2, block_size, kv_heads, head_dim]`` in the model's dtype)::

    magic "KVCLIBLK" | u32 format version | u32 header size | 32 B fingerprint
    | 32 B block hash | u64 payload size | u32 crc32(header before it + payload)

The checksum catches torn and corrupt files (a crash between write and rename, a
bad disk, a truncated copy); it is not a defence against someone who can write
DIR, who can poison the cache anyway. CRC-32 runs at ~6 GB/s here, sha256 at ~2.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

FORMAT_NAME = "kvcli-kv-cache"
FORMAT_VERSION = 1
MARKER_NAME = "kvcli-kv-cache.json"
MAGIC = b"KVCLIBLK"

_HEAD = struct.Struct("<8sII32s32sQ")  # everything before the checksum
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEAD.size + _CRC.size


class CorruptBlockError(ValueError):
    """A block file that must not be used; the message says what is wrong with it."""


@dataclass(slots=True, frozen=True)
class BlockKey:
    fingerprint: bytes  # 32 bytes: the model and settings the K/V belong to
    block_hash: bytes  # 32 bytes: the chain hash of the block (kvcli/hashing.py)


def encode_header(key: BlockKey, payload: memoryview | bytes) -> bytes:
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, key.fingerprint, key.block_hash,
                      len(payload))
    return head + _CRC.pack(zlib.crc32(payload, zlib.crc32(head)))


def check_block(key: BlockKey, data: bytes | bytearray | memoryview) -> memoryview:
    """The payload of a whole block file ``data``; raises CorruptBlockError if it is not right."""
    if len(data) < HEADER_SIZE:
        raise CorruptBlockError(f"truncated header ({len(data)} bytes)")
    view = memoryview(data)
    magic, version, header_size, fingerprint, block_hash, size = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise CorruptBlockError("not a kvcli block file (bad magic)")
    if version != FORMAT_VERSION or header_size != HEADER_SIZE:
        raise CorruptBlockError(f"block format version {version}, this kvcli reads "
                                f"{FORMAT_VERSION}")
    if fingerprint != key.fingerprint or block_hash != key.block_hash:
        raise CorruptBlockError("header names another block or model")
    if len(data) != HEADER_SIZE + size:
        raise CorruptBlockError(f"{len(data) - HEADER_SIZE} payload bytes, header says {size}")
    payload = view[HEADER_SIZE:]
    (crc,) = _CRC.unpack_from(view, _HEAD.size)
    if zlib.crc32(payload, zlib.crc32(view[: _HEAD.size])) != crc:
        raise CorruptBlockError("checksum mismatch")
    return payload

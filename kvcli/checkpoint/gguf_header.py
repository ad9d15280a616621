"""A GGUF file's architecture and tensor types, read from its header (torch- and NumPy-free).

``--quantization auto`` (the default) runs a GGUF natively when kvcli's gguf mode can: a
llama-architecture file whose tensors are all of types the mode has kernels for. Deciding that
must be cheap and torch-free (`kvcli models` asks it for every listed model), so this walks the
header with ``struct`` only: metadata values are skipped by their lengths (the default model's
98,000 vocabulary and merge strings included, ~20 ms: one length read per string), tensor infos are read for their types.
Format: github.com/ggml-org/ggml, docs/gguf.md (little-endian, versions 2 and 3).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class GGUFHeaderError(ValueError):
    """Not a GGUF file kvcli can read the header of."""


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    architecture: str | None  # general.architecture
    tensor_types: frozenset[int]  # the GGML type ids of its tensors


def _skip_value(buf: mmap.mmap, pos: int, kind: int) -> int:
    if kind in _SCALAR_SIZE:
        return pos + _SCALAR_SIZE[kind]
    if kind == _STRING:
        return pos + 8 + _U64.unpack_from(buf, pos)[0]
    if kind != _ARRAY:
        raise GGUFHeaderError(f"unknown GGUF value type {kind}")
    item, count = _U32.unpack_from(buf, pos)[0], _U64.unpack_from(buf, pos + 4)[0]
    pos += 12
    if item in _SCALAR_SIZE:
        return pos + count * _SCALAR_SIZE[item]
    if item == _STRING:  # the vocabulary and merges: one length read per string, inlined
        unpack = _U64.unpack_from
        for _ in range(count):
            pos += 8 + unpack(buf, pos)[0]
        return pos
    for _ in range(count):  # nested arrays: walked by their lengths
        pos = _skip_value(buf, pos, item)
    return pos


def _string(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    size = _U64.unpack_from(buf, pos)[0]
    return buf[pos + 8 : pos + 8 + size].decode("utf-8", "replace"), pos + 8 + size


def _walk(buf: mmap.mmap) -> GGUFHeader:
    if buf[:4] != b"GGUF":
        raise GGUFHeaderError("not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise GGUFHeaderError(f"GGUF version {version} is not supported (2 or 3)")
    pos, arch = 24, None
    for _ in range(n_kv):
        key, pos = _string(buf, pos)
        kind = _U32.unpack_from(buf, pos)[0]
        if key == "general.architecture" and kind == _STRING:
            arch, pos = _string(buf, pos + 4)
        else:
            pos = _skip_value(buf, pos + 4, kind)
    types = set()
    for _ in range(n_tensors):
        pos = _string(buf, pos)[1]
        n_dims = _U32.unpack_from(buf, pos)[0]
        pos += 4 + 8 * n_dims
        types.add(_U32.unpack_from(buf, pos)[0])
        pos += 12  # type, offset
    return GGUFHeader(arch, frozenset(types))


def read_gguf_header(path: Path) -> GGUFHeader:
    """The architecture and tensor types of the GGUF at ``path`` (GGUFHeaderError, OSError)."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            return _walk(buf)
        except (struct.error, IndexError):
            raise GGUFHeaderError("truncated GGUF header") from None

"""The tensor directory of a GGUF file, read without parsing its metadata values.

``gguf.GGUFReader`` turns every metadata value into NumPy slices; for the default model (a
49,152-token vocabulary and its merges) that took 3.8 of the 5.7 s of a ``--quantization gguf``
load. This walks the key/value section with ``struct`` (skipping arrays by their lengths),
keeps the few scalars the loader needs, and returns each tensor as a view of one copy-on-write
memory map of the file (format: github.com/ggml-org/ggml, docs/gguf.md; little-endian files).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvcli.model.quant import QuantError

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}  # GGUF value type -> struct code
_STRING, _ARRAY = 8, 9
# bytes and elements per block of each tensor type kvcli reads (GGML type ids)
TYPE_SIZE = {0: (4, 1), 1: (2, 1), 2: (18, 32), 3: (20, 32), 8: (34, 32), 12: (144, 256),
             13: (176, 256), 14: (210, 256)}


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    name: str
    kind: int  # GGML type id
    shape: tuple[int, ...]  # GGUF order: shape[0] is the innermost (the input features)
    data: np.ndarray  # uint8 [rows, row bytes] for quantized types, float32/float16 otherwise


class _Cursor:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, code: str) -> int | float | bool:
        try:
            (value,) = struct.unpack_from("<" + code, self.buf, self.pos)
        except struct.error:
            raise QuantError(f"{self.path}: truncated GGUF file") from None
        self.pos += struct.calcsize(code)
        return value

    def string(self) -> str:
        size = int(self.take("Q"))
        self.pos += size
        return bytes(self.buf[self.pos - size : self.pos]).decode("utf-8", "replace")

    def skip_strings(self, count: int) -> None:
        """Past ``count`` strings, not decoded: the default model's vocabulary and merges are
        98,000 of them (decoding each took 0.3 s of start-up)."""
        buf, pos, unpack = self.buf, self.pos, struct.Struct("<Q").unpack_from
        try:
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
        except struct.error:
            raise QuantError(f"{self.path}: truncated GGUF file") from None
        self.pos = pos

    def value(self, kind: int) -> object:
        """A scalar or string; an array is skipped (None)."""
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = int(self.take("I")), int(self.take("Q"))
            if item == _STRING:
                self.skip_strings(count)
            elif item == _ARRAY:
                for _ in range(count):
                    self.value(item)
            elif item in _SCALARS:
                self.pos += count * struct.calcsize(_SCALARS[item])
            else:
                raise QuantError(f"{self.path}: unknown GGUF value type {item}")
            return None
        if kind not in _SCALARS:
            raise QuantError(f"{self.path}: unknown GGUF value type {kind}")
        return self.take(_SCALARS[kind])


def read_gguf(path: Path) -> tuple[dict[str, object], list[GGUFTensor]]:
    """(scalar metadata, tensors) of the GGUF at ``path``."""
    mapped = np.memmap(path, dtype=np.uint8, mode="c")  # writable views, the file untouched
    cur = _Cursor(memoryview(mapped), Path(path))
    if bytes(mapped[:4]) != b"GGUF":
        raise QuantError(f"{path}: not a GGUF file")
    cur.pos = 4
    version, n_tensors, n_kv = cur.take("I"), cur.take("Q"), cur.take("Q")
    if version not in (2, 3):
        raise QuantError(f"{path}: GGUF version {version} is not supported (2 or 3, little-endian)")
    meta = {}
    for _ in range(int(n_kv)):
        key = cur.string()
        meta[key] = cur.value(int(cur.take("I")))
    infos = []
    for _ in range(int(n_tensors)):
        name = cur.string()
        dims = tuple(int(cur.take("Q")) for _ in range(int(cur.take("I"))))
        infos.append((name, dims, int(cur.take("I")), int(cur.take("Q"))))
    align = int(meta.get("general.alignment") or 32)
    start = -(-cur.pos // align) * align
    return meta, [_tensor(mapped, start, info, path) for info in infos]


def _tensor(mapped: np.ndarray, start: int, info: tuple, path: Path) -> GGUFTensor:
    name, dims, kind, offset = info
    if kind not in TYPE_SIZE:
        raise QuantError(f"{path}: tensor {name!r} has GGML type {kind}, which kvcli cannot run")
    block_bytes, block_elems = TYPE_SIZE[kind]
    rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
    row_bytes = dims[0] // block_elems * block_bytes
    begin, end = start + offset, start + offset + rows * row_bytes
    if end > mapped.shape[0]:
        raise QuantError(f"{path}: truncated GGUF file (tensor {name!r} ends past the end)")
    raw = mapped[begin:end].reshape(rows, row_bytes)
    if kind in (0, 1):
        raw = raw.view(np.float32 if kind == 0 else np.float16)
    return GGUFTensor(name, kind, dims, raw)

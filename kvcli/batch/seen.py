"""Duplicate-id detection in little memory: explicit ids are fingerprints, line-number ids are bits.

Explicit ``id``/``custom_id`` values must be remembered to compare against. A
dict of id strings costs ~140 bytes per id (1.4 GB for 10M lines), so each id is
kept as a 64-bit fingerprint with its first line number in a flat open-addressing
table: 12 bytes a slot, 24-48 bytes per id. Two different ids sharing a
fingerprint (odds ~n²/2⁶⁵: one in 370,000 for 10M ids) only cost a spurious
duplicate warning; duplicates are never missed. A line without an id gets
``line-<N>``, unique by construction, so it only costs one bit, unless an
explicit id spells the same ``line-<N>``: both directions of that collision are
checked.
"""

from __future__ import annotations

import hashlib
import re
from array import array
from dataclasses import dataclass, field

from kvcli.batch.records import LineId

_LINE_ID = re.compile(r"line-([1-9][0-9]{0,17})")
_MAX_LINE = 2**32 - 1  # line numbers are stored as uint32 (a 4-billion-line file is ~100 GB)


def _fingerprint(key: str) -> int:
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") | 1  # never 0: 0 marks an empty slot


@dataclass(slots=True)
class _FirstLines:
    """Fingerprint -> first line number; linear probing, grows at half full."""

    _keys: array = field(default_factory=lambda: array("Q", bytes(8 * 1024)))
    _lines: array = field(default_factory=lambda: array("I", bytes(4 * 1024)))
    _used: int = 0

    def _slot(self, fp: int) -> int:
        keys, mask = self._keys, len(self._keys) - 1
        i = fp & mask
        while keys[i] not in (0, fp):
            i = (i + 1) & mask
        return i

    def get(self, fp: int) -> int | None:
        i = self._slot(fp)
        return self._lines[i] if self._keys[i] else None

    def setdefault(self, fp: int, line_no: int) -> int:
        i = self._slot(fp)
        if self._keys[i]:
            return self._lines[i]
        self._keys[i], self._lines[i] = fp, min(line_no, _MAX_LINE)
        self._used += 1
        if 2 * self._used > len(self._keys):
            self._grow()
        return line_no

    def _grow(self) -> None:
        old = zip(self._keys, self._lines, strict=True)
        size = 2 * len(self._keys)
        self._keys, self._lines = array("Q", bytes(8 * size)), array("I", bytes(4 * size))
        for fp, line_no in old:
            if fp:
                i = self._slot(fp)
                self._keys[i], self._lines[i] = fp, line_no


@dataclass(slots=True)
class SeenIds:
    _explicit: _FirstLines = field(default_factory=_FirstLines)  # id -> first line using it
    _auto: bytearray = field(default_factory=bytearray)  # bit N: line N used "line-N"

    def add(self, ident: LineId) -> int | None:
        """Remember ``ident``; the earlier line that used the same id, if any."""
        fp = _fingerprint(ident.key)
        if ident.field is None:
            earlier = self._explicit.get(fp)
            self._set(ident.line_no)
            return earlier
        earlier = self._explicit.setdefault(fp, ident.line_no)
        if earlier != min(ident.line_no, _MAX_LINE):
            return earlier
        match = _LINE_ID.fullmatch(ident.key)
        if match and self._has(int(match[1])):
            return int(match[1])
        return None

    def _set(self, n: int) -> None:
        byte = n >> 3
        if byte >= len(self._auto):
            self._auto.extend(bytes(max(byte + 1 - len(self._auto), len(self._auto))))
        self._auto[byte] |= 1 << (n & 7)

    def _has(self, n: int) -> bool:
        byte = n >> 3
        return byte < len(self._auto) and bool(self._auto[byte] & (1 << (n & 7)))

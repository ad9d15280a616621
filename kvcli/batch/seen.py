"""Duplicate-id detection in little memory: explicit ids are remembered, line-number ids are bits.

Explicit ``id``/``custom_id`` values must be kept to compare against (a dict of
id -> first line). A line without an id gets ``line-<N>``, unique by
construction, so it only costs one bit, unless an explicit id spells the same
``line-<N>``: both directions of that collision are checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvcli.batch.records import LineId

_LINE_ID = re.compile(r"line-([1-9][0-9]{0,17})")


@dataclass(slots=True)
class SeenIds:
    _explicit: dict[str, int] = field(default_factory=dict)  # id -> first line using it
    _auto: bytearray = field(default_factory=bytearray)  # bit N: line N used "line-N"

    def add(self, ident: LineId) -> int | None:
        """Remember ``ident``; the earlier line that used the same id, if any."""
        if ident.field is None:
            earlier = self._explicit.get(ident.key)
            self._set(ident.line_no)
            return earlier
        earlier = self._explicit.setdefault(ident.key, ident.line_no)
        if earlier != ident.line_no:
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

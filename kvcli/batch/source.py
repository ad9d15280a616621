"""Reading the input lazily: one line at a time, never the whole file, never a whole huge line.

A line longer than ``max_line_bytes`` is skipped without being held in memory
(it still yields a :class:`RawLine` so it gets its per-line error). Blank lines
are skipped but counted, so ``line-<N>`` ids stay the file's real line numbers.
"""

from __future__ import annotations

import bisect
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from kvcli.compression import open_decompressed, open_read

DEFAULT_MAX_LINE_BYTES = 16 << 20  # far above any prompt a context window can hold
_SKIP_CHUNK = 1 << 20
_BOM = b"\xef\xbb\xbf"


@dataclass(slots=True)
class RawLine:
    line_no: int  # 1-based
    data: bytes | None  # None: longer than the limit, skipped unread
    size: int  # bytes, without the line ending


def open_input(path: str) -> BinaryIO:
    """``-`` is stdin; anything else is opened for binary reading (raises OSError). Either is
    decompressed when its first bytes are gzip, bzip2, xz or zstd (kvcli/compression.py)."""
    if path == "-":
        return open_decompressed(sys.stdin.buffer)  # closing it leaves stdin open
    return open_read(path)  # the caller owns and closes it


def iter_lines(stream: BinaryIO, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[RawLine]:
    line_no = 0
    while True:
        chunk = stream.readline(max_line_bytes + 1)
        if not chunk:
            return
        line_no += 1
        if len(chunk) > max_line_bytes and not chunk.endswith(b"\n"):
            yield RawLine(line_no, None, len(chunk) + _skip_rest_of_line(stream))
            continue
        if line_no == 1 and chunk.startswith(_BOM):
            chunk = chunk[len(_BOM):]
        data = chunk.rstrip(b"\r\n")
        if not data.strip():
            continue
        yield RawLine(line_no, data, len(data))


def _skip_rest_of_line(stream: BinaryIO) -> int:
    skipped = 0
    while True:
        chunk = stream.readline(_SKIP_CHUNK)
        if not chunk:
            return skipped
        if chunk.endswith(b"\n"):
            return skipped + len(chunk.rstrip(b"\r\n"))
        skipped += len(chunk)


def count_lines(path: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> int | None:
    """Non-blank lines of a regular file (the progress bar's total); None for stdin or a pipe.

    Only a regular file can be read twice: counting a FIFO (``<(...)``) would eat the input.
    """
    try:
        if path == "-" or not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open_read(path) as f:
            return sum(1 for _ in iter_lines(f, max_line_bytes))
    except OSError:
        return None


class InputFiles:
    """Several INPUT files read as one input, in order (their concatenation, as `cat` gives it):
    ``line-<N>`` ids number the lines across all of them, so ids stay unique and a
    ``--resume`` with the same files in the same order finds them; :meth:`where` names a
    line's own file and line number for messages."""

    def __init__(self, paths: list[str], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.paths = paths
        self.max_line_bytes = max_line_bytes
        self._starts: list[int] = []  # global number of each opened file's line 0

    def __iter__(self) -> Iterator[RawLine]:
        offset = 0
        for path in self.paths:
            self._starts.append(offset)
            last = 0
            with open_read(path) as stream:
                for raw in iter_lines(stream, self.max_line_bytes):
                    last = raw.line_no
                    yield RawLine(offset + raw.line_no, raw.data, raw.size)
            offset += last  # the next file numbers on from this one's last request line

    def where(self, line_no: int) -> str:
        """``FILE:LINE`` of a global line number."""
        i = max(0, bisect.bisect_right(self._starts, line_no - 1) - 1)
        return f"{self.paths[i]}:{line_no - self._starts[i]}" if self._starts else f"?:{line_no}"


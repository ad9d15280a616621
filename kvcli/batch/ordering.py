"""``--input-order prefix``: run the whole input grouped by shared prompt prefix.

``--scheduling cache-aware`` can only reorder what is inside the admission window
(``--max-pending``); in a shuffled file larger than the window, requests sharing a system
prompt arrive far apart, and by the time the next one comes its blocks may have been evicted.
This reads the file twice. Pass 1 parses and tokenizes every line (as the job will) and keeps,
per line, only its byte offset and a key: the first :data:`KEY_BLOCKS` block hashes of its
prompt (``kvcli/hashing.py``, the chain the KV cache indexes, salt included), each cut to
:data:`DIGEST` bytes. Sorting by the keys is a depth-first walk of the block tree: lines
sharing a prefix are adjacent, longer shared prefixes nested inside shorter ones, ties in input
order. Pass 2 seeks to each offset in that order and yields the line. Memory: the key and four
integers per line (~350 B; 100,000 lines ~35 MB), never the lines.

Each yielded line carries its input position (``rank``); with ``--ordered`` the
:class:`RankedWriter` writes results in input order anyway. A finished line that must wait for
an earlier one goes to a temporary spill file (its offset is kept), so neither memory nor the
admission window fill up while the groups run in another order.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from kvcli.batch.encode import PromptEncoder
from kvcli.batch.parse import ParseOptions, parse_line
from kvcli.batch.records import FailedLine
from kvcli.batch.source import RawLine, iter_lines
from kvcli.batch.writer import ResultWriter
from kvcli.compression import is_compressed, seekable_copy
from kvcli.hashing import hash_token_blocks

#: Blocks of a prompt that decide its place (512 tokens at the default block size 16): lines
#: sharing more than that keep their input order among themselves.
KEY_BLOCKS = 32
#: Bytes kept of each block hash: 2^-64 collisions, a wrong neighbour at worst (no hit is faked:
#: the engine matches full hashes).
DIGEST = 8


@dataclass(slots=True)
class RankedLine(RawLine):
    rank: int = 0  # position among the input's non-blank lines


def prompt_key_fn(encoder: PromptEncoder, opts: ParseOptions, block_size: int
                  ) -> Callable[[RawLine], bytes]:
    """A line's sort key; lines that will fail (bad JSON, too long) get b"" and run first."""
    def key(raw: RawLine) -> bytes:
        parsed = parse_line(raw, opts)
        if isinstance(parsed, FailedLine):
            return b""
        try:
            ids = encoder.encode(parsed.prompt, raw.line_no)
        except Exception:  # noqa: BLE001 - LineError, or what the job's guard reports later
            return b""
        hashes = hash_token_blocks(ids[: KEY_BLOCKS * block_size], block_size, parsed.cache_salt)
        return b"".join(h[:DIGEST] for h in hashes)

    return key


def index_by_prefix(stream: BinaryIO, key: Callable[[RawLine], bytes], max_line_bytes: int
                    ) -> list[tuple[bytes, int, int, int]]:
    """Pass 1: (key, rank, line number, offset) per non-blank line, sorted by key (stable)."""
    entries = []
    lines = iter_lines(stream, max_line_bytes)
    while True:
        offset = stream.tell()  # a blank line skipped here is skipped again in pass 2
        raw = next(lines, None)
        if raw is None:
            break
        entries.append((key(raw), len(entries), raw.line_no, offset))
    entries.sort(key=lambda entry: entry[0])
    return entries


def lines_in_order(stream: BinaryIO, entries: list[tuple[bytes, int, int, int]],
                   max_line_bytes: int) -> Iterator[RankedLine]:
    """Pass 2: each line again, read at its offset, in the sorted order."""
    for _, rank, line_no, offset in entries:
        stream.seek(offset)
        raw = next(iter_lines(stream, max_line_bytes))
        yield RankedLine(line_no, raw.data, raw.size, rank)


def prefix_ordered_lines(path: str, encoder: PromptEncoder, opts: ParseOptions,
                         block_size: int, max_line_bytes: int) -> Iterator[RankedLine]:
    """Both passes over a regular file ``path`` (the caller checks it can be read twice). The
    offsets are the uncompressed bytes' : a compressed ``path`` is decompressed once into a
    temporary file and both passes read that (a compressed stream cannot seek back)."""
    if is_compressed(path):
        stream = seekable_copy(path)
    else:
        stream = open(path, "rb")  # noqa: SIM115 - closed when the generator ends
    try:
        entries = index_by_prefix(stream, prompt_key_fn(encoder, opts, block_size),
                                  max_line_bytes)
        yield from lines_in_order(stream, entries, max_line_bytes)
    finally:
        stream.close()


@dataclass(slots=True)
class RankedWriter(ResultWriter):
    """A ResultWriter for lines that arrive out of input order, each with its ``rank``.

    Unordered, it writes as results finish. Ordered, a result waits for every earlier rank
    (written, failed or skipped by --resume), in a spill file rather than in memory.
    """

    _spill: Any = None  # a temporary file, opened on the first held line
    _spill_end: int = 0
    _skipped: set[int] = field(default_factory=set)

    def reserve_rank(self, rank: int) -> int:
        self._next_seq = max(self._next_seq, rank + 1)
        return rank

    def skip(self, rank: int) -> None:
        """A line that gets no result (already in the output): later ranks need not wait."""
        if self.ordered:
            self._skipped.add(rank)
            self._drain()

    def submit(self, seq: int, line: bytes, tag: Any = None) -> None:
        if not self.ordered or seq == self._next_write:
            self._write(line, tag)
            if self.ordered:
                self._next_write += 1
                self._drain()
            return
        if self._spill is None:
            self._spill = tempfile.TemporaryFile(prefix="kvcli-ordered-")
        os.pwrite(self._spill.fileno(), line, self._spill_end)
        self._held[seq] = ((self._spill_end, len(line)), tag)
        self._spill_end += len(line)

    def _drain(self) -> None:
        while True:
            if self._next_write in self._skipped:
                self._skipped.discard(self._next_write)
            elif self._next_write in self._held:
                (offset, size), tag = self._held.pop(self._next_write)
                self._write(os.pread(self._spill.fileno(), size, offset), tag)
            else:
                break
            self._next_write += 1
        if not self._held and self._spill_end:  # nothing waits: reuse the file from the start
            self._spill.truncate(0)
            self._spill_end = 0

    @property
    def outstanding(self) -> int:
        """Held results are on disk, so they never close the admission window."""
        return 0

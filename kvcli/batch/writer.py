"""Writing result lines so that a run killed at any moment leaves only valid complete lines.

Each line goes out with one ``os.write`` of the whole line, newline included
(looping only if the kernel takes part of it), unbuffered: nothing sits in a
userspace buffer to be lost or half-flushed. Output files are opened with
O_APPEND, so a resumed run continues after what is there. A write that fails
part-way (a full disk) cuts the partial line off again where only this run
writes the file (it is locked, kvcli/batch/lock.py), so the file keeps whole
results only; the writer reports each line once it is really on disk.

:class:`ResultWriter` writes in completion order (streaming), or with
``ordered=True`` in input order, each line as soon as every earlier one is out.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol


class LineSink(Protocol):
    name: str

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class FdSink:
    fd: int
    name: str
    owns_fd: bool = True
    exclusive: bool = False  # a regular file no one else writes: a partial line may be cut off

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError:
            if self.exclusive and len(view) < len(data):
                self._cut(len(data) - len(view))
            raise

    def _cut(self, partial: int) -> None:
        """Remove the start of a line that got out before the write failed."""
        try:
            os.ftruncate(self.fd, os.lseek(self.fd, 0, os.SEEK_END) - partial)
        except OSError:
            pass  # the line stays cut short; --resume removes a partial last line

    def close(self) -> None:
        if self.owns_fd:
            os.close(self.fd)
            self.owns_fd = False


@dataclass(slots=True)
class StreamSink:
    """For a stdout without a file descriptor (click's CliRunner in tests)."""

    stream: BinaryIO
    name: str = "<stdout>"

    def write(self, data: bytes) -> None:
        self.stream.write(data)
        self.stream.flush()

    def close(self) -> None:
        self.stream.flush()


@dataclass(slots=True)
class CompressedSink:
    """``-o x.jsonl.gz`` (``.bz2``, ``.xz``, ``.zst``): lines go through one compressor into
    ``inner`` (kvcli/compression.py: gzip and zstd flush each line); the stream is finished on
    close, which every stop but ``kill -9`` reaches (Ctrl-C and SIGTERM end the job
    gracefully). A compressed stream cannot be cut back to its last whole line, so such an
    output cannot be resumed (kvcli/batch/preflight.py)."""

    inner: LineSink
    kind: str
    name: str = ""
    _compressor: Any = None

    def __post_init__(self) -> None:
        from kvcli.compression import LineCompressor

        self.name = self.name or self.inner.name
        self._compressor = LineCompressor(self.kind)

    def write(self, data: bytes) -> None:
        out = self._compressor.add(data)
        if out:
            self.inner.write(out)

    def close(self) -> None:
        if self._compressor is not None:
            tail, self._compressor = self._compressor.finish(), None
            try:
                self.inner.write(tail)
            finally:
                self.inner.close()


def open_sink(path: str | None, append: bool = False) -> LineSink:
    """``None`` / ``-`` is stdout; a path is created, or truncated unless ``append``."""
    if path in (None, "-"):
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, ValueError, io.UnsupportedOperation):
            return StreamSink(sys.stdout.buffer)
        sys.stdout.flush()
        return FdSink(fd, "<stdout>", owns_fd=False)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
    return FdSink(os.open(path, flags, 0o644), path)


@dataclass(slots=True)
class ResultWriter:
    sink: LineSink
    ordered: bool = False
    on_written: Callable[[Any], None] | None = None  # gets a line's tag once it is on disk
    written: int = 0
    lost: int = 0  # lines whose write failed (not on disk, or only a part of them)
    _next_seq: int = 0  # next input-order number to hand out
    _next_write: int = 0  # ordered: the number whose line must go out next
    _held: dict[int, tuple[bytes, Any]] = field(default_factory=dict)

    def reserve(self) -> int:
        """An input-order number for a request about to be admitted."""
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def submit(self, seq: int, line: bytes, tag: Any = None) -> None:
        """Write ``line`` (ordered: once every earlier one is out); ``tag`` goes to on_written."""
        if not self.ordered:
            self._write(line, tag)
            return
        self._held[seq] = (line, tag)
        while self._next_write in self._held:
            held, held_tag = self._held.pop(self._next_write)
            self._next_write += 1
            self._write(held, held_tag)

    @property
    def outstanding(self) -> int:
        """Ordered: numbers handed out whose lines are not written yet (admission window)."""
        return self._next_seq - self._next_write if self.ordered else 0

    @property
    def held(self) -> int:
        """Ordered: finished lines waiting for an earlier one (lost on interrupt)."""
        return len(self._held)

    @property
    def unwritten(self) -> int:
        """Finished lines that are not on disk: held back, or their write failed."""
        return len(self._held) + self.lost

    def _sink_for(self, tag: Any) -> LineSink:
        """Where a finished line goes; the server's writer sends failed lines to their own file."""
        return self.sink

    def _write(self, line: bytes, tag: Any) -> None:
        try:
            self._sink_for(tag).write(line)
        except OSError:
            self.lost += 1
            raise
        self.written += 1
        if self.on_written is not None:
            self.on_written(tag)

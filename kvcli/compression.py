"""Compressed inputs and outputs: gzip, bzip2 and xz (standard library), zstd with `zstandard`.

An input is recognised by its first bytes, never its name, so ``x.jsonl.gz``, a gzip file
named ``x.jsonl`` and ``zcat``-less pipes (``curl ... | kvcli generate -``) all read the same.
An output is compressed when its name ends in ``.gz``, ``.bz2``, ``.xz`` or ``.zst``. Read
errors of a damaged or cut stream (``EOFError``, ``lzma.LZMAError``...) become ``OSError``
with a message saying so, the one kind of error the readers handle. Ground floor: imports
nothing of kvcli.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import shutil
import tempfile
import zlib
from typing import IO, Any, BinaryIO

MAGIC = {"gzip": b"\x1f\x8b", "bzip2": b"BZh", "xz": b"\xfd7zXZ\x00", "zstd": b"\x28\xb5\x2f\xfd"}
SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd",
            ".zstd": "zstd"}
_HEAD = 6
_ZSTD_MISSING = ("this looks like zstd; install zstandard (pip install zstandard) or "
                 "decompress it first (zstd -d)")


class CompressionError(OSError):
    """A compressed stream kvcli cannot read or write (damaged, cut short, zstd without zstandard)."""


def sniff(head: bytes) -> str | None:
    """The compression format whose magic bytes start ``head``, else None."""
    for kind, magic in MAGIC.items():
        if head.startswith(magic):
            if kind == "bzip2" and not head[3:4].isdigit():  # "BZh" + block size 1-9
                continue
            return kind
    return None


def suffix_kind(path: str) -> str | None:
    """The format an output named ``path`` is written in (None: plain)."""
    return SUFFIXES.get(os.path.splitext(path)[1].lower())


def strip_suffix(name: str) -> str:
    """``x.jsonl.gz`` -> ``x.jsonl`` (the name the content would have uncompressed)."""
    base, ext = os.path.splitext(name)
    return base if ext.lower() in SUFFIXES else name


def _head(stream: BinaryIO) -> bytes:
    peek = getattr(stream, "peek", None)
    if peek is not None:
        return peek(_HEAD)[:_HEAD]
    if stream.seekable():
        where = stream.tell()
        head = stream.read(_HEAD)
        stream.seek(where)
        return head
    return b""  # cannot look ahead without losing bytes: read as it is


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError:
        raise CompressionError(_ZSTD_MISSING) from None
    return zstandard


def _reader(kind: str, stream: BinaryIO) -> IO[bytes]:
    if kind == "gzip":
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if kind == "bzip2":
        return bz2.BZ2File(stream, "rb")
    if kind == "xz":
        return lzma.LZMAFile(stream, "rb")
    import io

    reader = _zstandard().ZstdDecompressor().stream_reader(stream, read_across_frames=True)
    return io.BufferedReader(reader)


class Decompressed:
    """A decompressing reader (readline, read, iteration, close) whose errors are OSError."""

    def __init__(self, kind: str, stream: BinaryIO, owns: bool) -> None:
        self.kind, self._raw, self._owns = kind, stream, owns
        self._inner = _reader(kind, stream)

    def _guard(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except CompressionError:
            raise
        except EOFError:
            raise CompressionError(f"the {self.kind} data is cut short (it ends before its "
                                   "end-of-stream marker)") from None
        except (OSError, lzma.LZMAError, zlib.error, ValueError) as err:
            if isinstance(err, OSError) and not isinstance(err, gzip.BadGzipFile) \
                    and err.errno is not None:
                raise  # a real I/O error of the underlying file
            raise CompressionError(f"damaged {self.kind} data ({err})") from None
        except Exception as err:  # zstandard's ZstdError
            raise CompressionError(f"damaged {self.kind} data ({err})") from None

    def readline(self, limit: int = -1) -> bytes:
        return self._guard(self._inner.readline, limit)

    def read(self, size: int = -1) -> bytes:
        return self._guard(self._inner.read, size)

    def __iter__(self) -> Decompressed:
        return self

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self._inner.close()
        if self._owns:
            self._raw.close()

    def __enter__(self) -> Decompressed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_decompressed(stream: BinaryIO, owns: bool = False) -> BinaryIO:
    """``stream`` itself if plain, else a decompressing reader over it (closing ``stream``
    too when ``owns``)."""
    kind = sniff(_head(stream))
    if kind is None:
        return stream
    return Decompressed(kind, stream, owns)  # type: ignore[return-value]


def open_read(path: str) -> BinaryIO:
    """``path`` for reading, decompressed if its first bytes say it is compressed."""
    return open_decompressed(open(path, "rb"), owns=True)  # noqa: SIM115 - the caller closes


def is_compressed(path: str) -> bool:
    with open(path, "rb") as f:
        return sniff(f.read(_HEAD)) is not None


def seekable_copy(path: str) -> BinaryIO:
    """A plain, seekable copy of a compressed ``path`` in a temporary file (deleted on close),
    for readers that seek back to line offsets (``--input-order prefix``)."""
    spool = tempfile.TemporaryFile(prefix="kvcli-input-")  # noqa: SIM115 - the caller closes
    try:
        with open_read(path) as src:
            shutil.copyfileobj(src, spool, 1 << 20)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool


class LineCompressor:
    """``add(line)`` -> bytes to write now, ``finish()`` -> the stream's end. gzip and zstd
    flush every line (a few bytes each), so a file cut by ``kill -9`` still decompresses to
    every whole line before the cut (``zcat`` warns at its end); bzip2 and xz cannot flush
    part of a stream and hold lines until their block is full or the stream finishes."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._flush: Any = None
        if kind == "gzip":
            self._c: Any = zlib.compressobj(6, zlib.DEFLATED, 31)  # 31: gzip header, trailer
            self._flush = zlib.Z_SYNC_FLUSH
        elif kind == "bzip2":
            self._c = bz2.BZ2Compressor(9)
        elif kind == "xz":
            self._c = lzma.LZMACompressor(format=lzma.FORMAT_XZ)
        else:
            zstandard = _zstandard()
            self._c = zstandard.ZstdCompressor().compressobj()
            self._flush = zstandard.COMPRESSOBJ_FLUSH_BLOCK

    def add(self, data: bytes) -> bytes:
        out = self._c.compress(data)
        return out + self._c.flush(self._flush) if self._flush is not None else out

    def finish(self) -> bytes:
        return self._c.flush()


def check_writable_kind(kind: str | None) -> None:
    """Fail before anything runs when ``kind`` cannot be written here (zstd without zstandard)."""
    if kind == "zstd":
        try:
            _zstandard()
        except CompressionError:
            raise CompressionError("-o *.zst needs zstandard (pip install zstandard); or write "
                                   "plain JSONL and compress it after") from None

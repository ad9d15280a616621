"""The blocks of one model fingerprint in a cache directory: read, verify, publish (torch-free).

A read is one ``open``: a missing file is a miss. A file that fails its checks is
ignored (and removed, so the next run rewrites it), with one warning per process: that
includes a link, a FIFO or a device at a block path (opened without following or blocking)
and a file of the wrong size (checked before a byte is read, so a huge or sparse file
costs nothing).
A write goes to ``DIR/tmp`` and is renamed into place, so readers, in this process
or another, see a whole block or nothing. No fsync: after a power cut a renamed
file may hold garbage, which its checksum then rejects.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvcli.kvstore.directory import write_private
from kvcli.kvstore.format import (
    HEADER_SIZE,
    BlockKey,
    CorruptBlockError,
    check_block,
    encode_header,
)
from kvcli.kvstore.safety import NotARegularFileError, open_regular, require_dir

log = logging.getLogger("kvcli.kvstore")

RUNS_LOG = "runs.jsonl"
#: Largest block file read when the caller does not say the size (SmolLM2-135M: 0.7 MB).
MAX_BLOCK_FILE = 1 << 30


@dataclass(slots=True)
class DiskStats:
    """What the disk tier did in this process (blocks, bytes, seconds)."""

    hit_blocks: int = 0
    bytes_read: int = 0
    read_s: float = 0.0
    corrupt_blocks: int = 0
    written_blocks: int = 0
    bytes_written: int = 0
    write_s: float = 0.0
    dropped_blocks: int = 0  # not written: the write queue was full, or writing stopped
    evicted_blocks: int = 0
    write_error: str | None = None  # why writing stopped (disk full, read-only, ...)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["read_gb_s"] = round(self.bytes_read / self.read_s / 1e9, 3) if self.read_s else None
        d["write_gb_s"] = (round(self.bytes_written / self.write_s / 1e9, 3)
                           if self.write_s else None)
        d["read_s"], d["write_s"] = round(self.read_s, 4), round(self.write_s, 4)
        return d


class ModelStore:
    """Block files of one fingerprint under ``root/models/<fingerprint hex>``."""

    def __init__(self, root: Path, fingerprint: bytes, description: dict[str, Any]) -> None:
        self.root = root
        self.fingerprint = fingerprint
        self.dir = root / "models" / fingerprint.hex()
        self.description = description
        self.stats = DiskStats()
        self._warned_corrupt = False
        self._ready = False  # tmp/, the model directory and model.json exist
        self._shards: set[Path] = set()  # shard directories checked to be real ones
        # Reused by every read: a fresh bytearray per block costs a zero-fill and page faults
        # (its payload is copied into the pool before the next read).
        self._buf = bytearray()

    def path(self, block_hash: bytes) -> Path:
        name = block_hash.hex()
        return self.dir / name[:2] / name

    def contains(self, block_hash: bytes) -> bool:
        return self.path(block_hash).exists()

    def __contains__(self, block_hash: object) -> bool:
        """``hash in store``: a Container of the hashes on disk (for hit predictions)."""
        return isinstance(block_hash, bytes) and self.contains(block_hash)

    # -------------------------------------------------------------------- read
    def read(self, block_hash: bytes, payload_size: int | None = None) -> memoryview | None:
        """The block's verified payload, or None: not there or not usable.

        ``payload_size``: the size a block of this model has; a file of another size is
        damaged, refused before it is read. The payload is writable memory valid until the
        next ``read`` (one thread reads).
        """
        path = self.path(block_hash)
        t0 = time.perf_counter()
        try:
            fd, st = open_regular(path)
        except FileNotFoundError:
            return None
        except NotARegularFileError as err:
            self._corrupt(path, err.strerror, remove=True)
            return None
        except OSError as err:
            self._corrupt(path, f"unreadable: {err.strerror or err}", remove=False)
            return None
        with open(fd, "rb", buffering=0) as f:
            if (why := _size_problem(st.st_size, payload_size)) is not None:
                self._corrupt(path, why, remove=True)
                return None
            try:
                got = self._read_into(f, st.st_size)
                payload = check_block(BlockKey(self.fingerprint, block_hash),
                                      memoryview(self._buf)[:got])
            except OSError as err:
                self._corrupt(path, f"unreadable: {err.strerror or err}", remove=False)
                return None
            except CorruptBlockError as err:
                self._corrupt(path, str(err), remove=True)
                return None
            _touch(f.fileno())
        self.stats.read_s += time.perf_counter() - t0
        self.stats.hit_blocks += 1
        self.stats.bytes_read += got
        return payload

    def _read_into(self, f: Any, size: int) -> int:
        """Read up to ``size`` bytes into the reused buffer (a raw read may be short)."""
        if len(self._buf) < size:
            self._buf = bytearray(size)
        view = memoryview(self._buf)[:size]
        got = 0
        while got < size and (n := f.readinto(view[got:])):
            got += n
        return got

    def _corrupt(self, path: Path, why: str, remove: bool) -> None:
        self.stats.corrupt_blocks += 1
        if not self._warned_corrupt:
            self._warned_corrupt = True
            log.warning("kvcli: ignoring a damaged KV cache block %s (%s); it is recomputed "
                        "(further damaged blocks are ignored silently)", path, why)
        if remove:
            try:
                path.unlink()
            except OSError:  # read-only directory: it stays ignored
                pass

    # ------------------------------------------------------------------- write
    def write(self, block_hash: bytes, payload: memoryview) -> int:
        """Publish one block atomically; bytes written (0 if it was already there). OSError
        (disk full, read-only) propagates: the caller stops writing."""
        final = self.path(block_hash)
        if final.exists():
            return 0
        t0 = time.perf_counter()
        if not self._ready:
            self._prepare()
            self._ready = True
        if final.parent not in self._shards:  # never write through a link to elsewhere
            final.parent.mkdir(mode=0o700, exist_ok=True)
            require_dir(final.parent)
            self._shards.add(final.parent)
        tmp = self.root / "tmp" / f"{block_hash.hex()}.{os.getpid()}.{time.monotonic_ns()}"
        header = encode_header(BlockKey(self.fingerprint, block_hash), payload)
        write_private(tmp, payload, header)
        try:
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.stats.write_s += time.perf_counter() - t0
        self.stats.written_blocks += 1
        self.stats.bytes_written += len(header) + len(payload)
        return len(header) + len(payload)

    def record_run(self) -> None:
        """Append this process's hit and write counts to the model's ``runs.jsonl`` (what
        ``kvcli cache stats`` sums). One short O_APPEND write: concurrent runs never interleave."""
        s = self.stats
        if not (s.hit_blocks or s.written_blocks) or not self.dir.exists():
            return
        line = json.dumps({"time": round(time.time(), 3), "hit_blocks": s.hit_blocks,
                           "bytes_read": s.bytes_read, "written_blocks": s.written_blocks,
                           "bytes_written": s.bytes_written}) + "\n"
        try:
            fd, _ = open_regular(self.dir / RUNS_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:  # read-only, full, or not a regular file: the counts are informative
            pass

    def _prepare(self) -> None:
        """Create what a write needs; NotAKVCacheError if a link took a directory's place."""
        for d in (self.root / "tmp", self.root / "models", self.dir):
            d.mkdir(mode=0o700, exist_ok=True)
            require_dir(d)
        meta = self.dir / "model.json"
        if not meta.exists():
            tmp = self.root / "tmp" / f"model.json.{os.getpid()}.{time.monotonic_ns()}"
            write_private(tmp, json.dumps(self.description, indent=1, sort_keys=True).encode())
            os.replace(tmp, meta)


def _size_problem(size: int, payload_size: int | None) -> str | None:
    """Why a block file of ``size`` bytes cannot be the block (never read to find out)."""
    if payload_size is not None and size != HEADER_SIZE + payload_size:
        return f"{size:,} bytes, a block of this model has {HEADER_SIZE + payload_size:,}"
    if size > MAX_BLOCK_FILE:
        return f"{size:,} bytes, more than any block"
    return None


def _touch(fd: int) -> None:
    """Mark a hit as the block's last use (eviction order); a read-only directory keeps the old.
    Through the open file, so it is the very file just read."""
    try:
        os.utime(fd)
    except OSError:
        pass

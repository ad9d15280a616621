"""A kvcli KV cache directory: open or create it, refuse what is not one, list and prune it.

Torch-free (``kvcli cache`` uses it without loading the engine). Several processes may
share a directory: every file appears by an atomic rename, deletions race harmlessly
(a reader holding an open file keeps reading it), and "last use" is a file's mtime,
which a hit refreshes, so eviction order is shared by every process without a lock.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvcli.kvstore.format import FORMAT_NAME, FORMAT_VERSION, MARKER_NAME

#: Default bound of a cache directory (``--kv-cache-dir-max-bytes``), all models together.
DEFAULT_MAX_BYTES = 8 << 30
PRUNE_TO = 0.9  # prune down to this fraction of the bound, so a full cache is not pruned per write
STALE_TMP_S = 3600.0  # a temp file this old belongs to a writer that died
_MARKER_TMP = "." + MARKER_NAME + "."  # the marker's own temp files, seen during creation


class NotAKVCacheError(ValueError):
    """The directory exists, holds files and is not a kvcli KV cache: refused, never written."""


@dataclass(slots=True, frozen=True)
class BlockFile:
    path: Path
    fingerprint: str  # hex, the models/ subdirectory
    size: int
    last_use: float  # mtime: written or last hit


def open_cache_dir(path: str | os.PathLike[str], create: bool = True) -> Path:
    """The validated cache directory; created (0700, with its marker) when new or empty."""
    root = Path(path).expanduser()
    if root.exists() and not root.is_dir():
        raise NotAKVCacheError(f"{root}: not a directory")
    marker = root / MARKER_NAME
    if marker.exists():
        _check_marker(marker)
        return root
    if root.exists() and any(not n.startswith(_MARKER_TMP) for n in os.listdir(root)):
        raise NotAKVCacheError(f"{root}: not a kvcli KV cache (no {MARKER_NAME}) and not empty; "
                               "refusing to write into it: name a new or empty directory")
    if not create:
        raise NotAKVCacheError(f"{root}: no kvcli KV cache here")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION}).encode()
    tmp = root / f"{_MARKER_TMP}{os.getpid()}.{time.monotonic_ns()}"
    write_private(tmp, body)
    os.replace(tmp, marker)  # a concurrent creator writes the same bytes
    return root


def _check_marker(marker: Path) -> None:
    try:
        meta = json.loads(marker.read_bytes())
    except (OSError, ValueError) as err:
        raise NotAKVCacheError(f"{marker}: unreadable cache marker ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise NotAKVCacheError(f"{marker}: not a kvcli KV cache marker")
    if meta.get("version") != FORMAT_VERSION:
        raise NotAKVCacheError(f"{marker.parent}: cache format version {meta.get('version')!r}, "
                               f"this kvcli uses {FORMAT_VERSION}; use another directory")


def write_private(path: Path, data: bytes | memoryview, header: bytes = b"") -> None:
    """Create ``path`` (0600, must not exist) holding ``header + data``; removed on failure."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            for part in (header, data):
                view = memoryview(part)
                while view:  # a raw write may be short
                    view = view[f.write(view):]
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def world_accessible(root: Path) -> bool:
    """True when group or others may read or enter ``root`` (the README explains why it matters)."""
    return bool(root.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def iter_block_files(root: Path) -> Iterator[BlockFile]:
    """Every block file under ``root/models`` (files vanishing meanwhile are skipped)."""
    models = root / "models"
    for model in _scandir(models):
        if not model.is_dir(follow_symlinks=False):
            continue
        for shard in _scandir(Path(model.path)):
            if not shard.is_dir(follow_symlinks=False):
                continue
            for entry in _scandir(Path(shard.path)):
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield BlockFile(Path(entry.path), model.name, st.st_size, st.st_mtime)


def _scandir(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def total_bytes(root: Path) -> int:
    return sum(f.size for f in iter_block_files(root))


@dataclass(slots=True)
class PruneResult:
    removed_files: int = 0
    removed_bytes: int = 0
    kept_bytes: int = 0


def prune(root: Path, max_bytes: int, fraction: float = PRUNE_TO) -> PruneResult:
    """Delete least recently used blocks until at most ``fraction * max_bytes`` remain (if over
    ``max_bytes``), and temp files of dead writers."""
    _remove_stale_tmp(root)
    files = sorted(iter_block_files(root), key=lambda f: f.last_use)
    result = PruneResult(kept_bytes=sum(f.size for f in files))
    if result.kept_bytes <= max_bytes:
        return result
    target = int(max_bytes * fraction)
    for f in files:
        if result.kept_bytes <= target:
            break
        try:
            f.path.unlink()
        except FileNotFoundError:  # another process pruned it first
            pass
        result.removed_files += 1
        result.removed_bytes += f.size
        result.kept_bytes -= f.size
    return result


def _remove_stale_tmp(root: Path) -> None:
    now = time.time()
    for entry in _scandir(root / "tmp"):
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime > STALE_TMP_S:
                os.unlink(entry.path)
        except FileNotFoundError:
            pass

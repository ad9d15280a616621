"""A kvcli KV cache directory: open or create it, refuse what is not one, list and prune it.

Torch-free (``kvcli cache`` uses it without loading the engine). Several processes may
share a directory: every file appears by an atomic rename, deletions race harmlessly
(a reader holding an open file keeps reading it), and "last use" is a file's mtime,
which a hit refreshes, so eviction order is shared by every process without a lock.
Nothing here follows a symbolic link inside the directory (kvcli/kvstore/safety.py).
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
from kvcli.kvstore.safety import NotAKVCacheError, check_layout, read_limited

__all__ = ["DEFAULT_MAX_BYTES", "BlockFile", "NotAKVCacheError", "PruneResult", "iter_block_files",
           "open_cache_dir", "prune", "remove_stale_tmp", "total_bytes", "world_accessible",
           "write_private"]

#: Default bound of a cache directory (``--kv-cache-dir-max-bytes``), all models together.
DEFAULT_MAX_BYTES = 8 << 30
PRUNE_TO = 0.9  # prune down to this fraction of the bound, so a full cache is not pruned per write
STALE_TMP_S = 3600.0  # a temp file this old belongs to a writer that died (or a reused pid)
DEAD_TMP_S = 60.0  # a temp file this old whose writer's pid is gone: a kill -9 mid-write
_MARKER_LIMIT = 4096  # the marker is a few dozen bytes
_MARKER_TMP = "." + MARKER_NAME + "."  # the marker's own temp files, seen during creation


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
    if os.path.lexists(marker):
        _check_marker(marker)
        check_layout(root)
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
        meta = json.loads(read_limited(marker, _MARKER_LIMIT))
    except (OSError, ValueError) as err:
        raise NotAKVCacheError(f"{marker}: unreadable cache marker ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise NotAKVCacheError(f"{marker}: not a kvcli KV cache marker")
    if meta.get("version") != FORMAT_VERSION:
        raise NotAKVCacheError(f"{marker.parent}: cache format version {meta.get('version')!r}, "
                               f"this kvcli uses {FORMAT_VERSION}; use another directory")


def write_private(path: Path, data: bytes | memoryview, header: bytes = b"") -> None:
    """Create ``path`` (0600, must not exist) holding ``header + data``; removed on failure."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
    if models.is_symlink():  # refused when the cache was opened; never followed
        return
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
    remove_stale_tmp(root)
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


def remove_stale_tmp(root: Path, now: float | None = None) -> int:
    """Delete temp files of writers that died (kill -9 between create and rename): older
    than a minute when the pid in their name is gone, older than an hour in any case.
    Never follows a link: a ``tmp`` that is one is left alone (and refused on open)."""
    now = time.time() if now is None else now
    removed = 0
    places = [(root, _MARKER_TMP)]
    if not (root / "tmp").is_symlink():
        places.append((root / "tmp", ""))
    for place, prefix in places:
        for entry in _scandir(place):
            if not entry.name.startswith(prefix) or entry.name == MARKER_NAME:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) or not _stale(entry.name, now - st.st_mtime):
                    continue
                os.unlink(entry.path)
                removed += 1
            except OSError:  # gone already, or not ours to delete
                pass
    return removed


def _stale(name: str, age: float) -> bool:
    if age > STALE_TMP_S:
        return True
    pid = _writer_pid(name)
    return age > DEAD_TMP_S and pid is not None and not _alive(pid)


def _writer_pid(name: str) -> int | None:
    """The pid in a temp file's name, ``<what>.<pid>.<monotonic ns>`` (kvcli/kvstore/store.py)."""
    parts = name.rsplit(".", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() and int(parts[1]) > 0:
        return int(parts[1])
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True

"""What kvcli refuses in a KV cache directory: links, files that are not regular, other writers.

Torch-free. A cache directory is kvcli's own tree, so nothing in it is ever followed out of
it: every file is opened with ``O_NOFOLLOW`` (a link is not a block) and ``O_NONBLOCK`` (a
FIFO or device at a block path cannot hang ``open``), then ``fstat``-checked to be a regular
file of a bounded size before a byte is read. A directory of the layout (``tmp``,
``models``, a model's directory, a shard) that is a symbolic link refuses the whole cache:
writes and pruning would otherwise land outside it. A directory that every user may write,
or that another user owns, is refused too, as ssh refuses such key files: whoever can write
it can plant K/V that a run would serve as its own (``--kv-cache-dir-insecure`` accepts it).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

# O_NONBLOCK changes nothing for regular files; it makes opening a FIFO return at once.
_SAFE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
INSECURE_FLAG = "--kv-cache-dir-insecure"


class NotAKVCacheError(ValueError):
    """The directory is not a kvcli KV cache, or not one kvcli may trust: refused, never
    written. The message names the path and what is wrong with it."""


class NotARegularFileError(OSError):
    """A path in the cache that is a link, FIFO, device or directory where a file belongs."""


def open_regular(path: Path, flags: int = os.O_RDONLY,
                 mode: int = 0o600) -> tuple[int, os.stat_result]:
    """An fd of ``path`` and its fstat, refusing anything but a regular file (never blocks,
    never follows a link). FileNotFoundError passes through; the caller closes the fd."""
    try:
        fd = os.open(path, flags | _SAFE_FLAGS, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise NotARegularFileError(errno.ELOOP, "a symbolic link", str(path)) from None
        if err.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise NotARegularFileError(errno.ENXIO, "a FIFO", str(path)) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotARegularFileError(errno.EINVAL, f"not a regular file ({_kind(st.st_mode)})",
                                   str(path))
    return fd, st


def read_limited(path: Path, limit: int) -> bytes:
    """The bytes of a small regular file (a marker, ``model.json``); OSError past ``limit``."""
    fd, st = open_regular(path)
    with os.fdopen(fd, "rb", buffering=0) as f:
        if st.st_size > limit:
            raise NotARegularFileError(errno.EFBIG, f"{st.st_size:,} bytes, at most {limit:,} "
                                       "expected", str(path))
        return f.read(limit + 1)[:limit]


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "something else"


def require_dir(path: Path) -> os.stat_result:
    """lstat of a directory of the layout; NotAKVCacheError if it is a link or not a directory."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise NotAKVCacheError(f"{path}: a symbolic link inside the KV cache; kvcli never "
                               "follows links there (writes and pruning would land outside "
                               "it): remove the link or use another directory")
    if not stat.S_ISDIR(st.st_mode):
        raise NotAKVCacheError(f"{path}: {_kind(st.st_mode)} where the KV cache keeps a "
                               "directory; remove it or use another directory")
    return st


def layout_dirs(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every directory of the layout under ``root`` with its lstat (``tmp``, ``models``, each
    model's directory and its shards), refusing links; block files themselves are not listed
    (a link or FIFO there is a damaged block, handled when read)."""
    for name in ("tmp", "models"):
        path = root / name
        if os.path.lexists(path):
            yield path, require_dir(path)
    for model in _subdirs(root / "models"):
        yield model, require_dir(model)
        for shard in _subdirs(model):
            yield shard, require_dir(shard)


def _subdirs(path: Path) -> list[Path]:
    """Entries of ``path`` that are directories or links (links are what the caller refuses)."""
    try:
        with os.scandir(path) as it:
            return [Path(e.path) for e in it if e.is_symlink() or e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def check_layout(root: Path) -> None:
    """Refuse a cache holding a link (or a stray file) where a directory of its layout is."""
    for _ in layout_dirs(root):
        pass


def untrusted_reason(root: Path) -> str | None:
    """Why ``root`` (or a directory under it) must not be trusted, or None: writable by every
    user, or owned by someone other than this user (or root)."""
    me = os.geteuid()
    for path, st in [(root, os.stat(root)), *layout_dirs(root)]:
        if st.st_mode & stat.S_IWOTH:
            return f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o})"
        if st.st_uid not in (me, 0):
            return f"{path} is owned by another user (uid {st.st_uid}, this process runs as {me})"
    return None


def check_trusted(root: Path, insecure: bool = False) -> None:
    """NotAKVCacheError unless only this user can write ``root`` (``insecure`` skips it)."""
    if insecure:
        return
    reason = untrusted_reason(root)
    if reason:
        raise NotAKVCacheError(f"{reason}: whoever can write a KV cache can plant keys and "
                               "values that kvcli would serve as this model's, changing its "
                               f"outputs. chmod 700 it and use your own directory, or pass "
                               f"{INSECURE_FLAG} to use it anyway")

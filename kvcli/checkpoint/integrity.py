"""Checksums of kvcli's converted models: recorded when kvcli writes them, checked before use.

A damaged converted file (a disk error, a stray `dd`) used to load without a word and give
NaN logits, so empty completions with exit 0. Each conversion records every file's size,
mtime and SHA-256. Before use each file is only stat'ed: the same size and mtime as when it
was last verified means it is trusted (a few stat calls). A changed mtime means the file is
hashed again (the default model's 538 MB: about 0.9 s on the 2-core EPYC development
machine) and, if it still matches, the new mtime is recorded so the next run is cheap again.
A different size or hash is damage. Torch-free: only hashlib and os.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

FileRecords = dict[str, dict[str, Any]]  # file name -> {"size", "mtime_ns", "sha256"}
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def describe_files(directory: Path, exclude: frozenset[str]) -> FileRecords:
    """Size, mtime and SHA-256 of every regular, not hidden file directly in `directory`."""
    records: FileRecords = {}
    for path in sorted(directory.iterdir()):
        if path.name in exclude or path.name.startswith(".") or not path.is_file():
            continue
        stat = path.stat()
        records[path.name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                              "sha256": sha256_file(path)}
    return records


def _check_one(path: Path, expected: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return f"{path.name} is missing", expected
    if stat.st_size != expected["size"]:
        return (f"{path.name} is {stat.st_size:,} bytes, kvcli wrote {expected['size']:,} "
                "(truncated or overwritten)"), expected
    if stat.st_mtime_ns == expected["mtime_ns"]:
        return None, expected  # verified at this size and mtime before
    if sha256_file(path) != expected["sha256"]:
        return (f"{path.name} was modified after kvcli wrote it: its SHA-256 no longer matches "
                "the one recorded then"), expected
    return None, {**expected, "mtime_ns": stat.st_mtime_ns}


def check_files(directory: Path, files: FileRecords) -> tuple[str | None, FileRecords]:
    """The first damage found (None if none) and the records with re-verified mtimes."""
    checked: FileRecords = {}
    for name, expected in files.items():
        problem, checked[name] = _check_one(directory / name, expected)
        if problem:
            return problem, files
    return None, checked


def write_atomically(path: Path, text: str) -> bool:
    """Replace `path` in one rename (readers see the old or the new file, never half);
    False where the directory is read-only (the caller then simply verifies again)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(text, encoding="utf-8")
        os.replace(temp, path)
    except OSError:
        temp.unlink(missing_ok=True)
        return False
    return True

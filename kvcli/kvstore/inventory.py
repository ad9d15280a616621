"""What a cache directory holds, per model: blocks, bytes, last use, hits (torch-free).

Backs ``kvcli cache stats|ls|clear``. Hit and write counts come from each model's
``runs.jsonl`` (one line per run that read or wrote a block). A record that cannot be
read (a torn line, a hand edit, another tool's file) is skipped with one message naming
the file and line; it never stops the listing.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcli.kvstore.directory import PruneResult, iter_block_files
from kvcli.kvstore.safety import open_regular, read_limited
from kvcli.kvstore.store import RUNS_LOG

log = logging.getLogger("kvcli.kvstore")

_MODEL_JSON_LIMIT = 1 << 20  # a few hundred bytes when kvcli writes it
_COUNTS = ("hit_blocks", "written_blocks")

Warn = Callable[[str], None]


@dataclass(slots=True)
class ModelSummary:
    fingerprint: str
    description: dict[str, Any] = field(default_factory=dict)  # model.json
    blocks: int = 0
    bytes: int = 0
    last_use: float | None = None
    runs: int = 0
    hit_blocks: int = 0
    written_blocks: int = 0

    @property
    def label(self) -> str:
        d = self.description
        return str(d.get("label") or d.get("architecture") or "?")


def summarize(root: Path, warn: Warn = log.warning) -> list[ModelSummary]:
    """One summary per model directory, most recently used first; ``warn`` gets one message
    per unreadable file (naming it, and the first bad line of a ``runs.jsonl``)."""
    models: dict[str, ModelSummary] = {}
    for model_dir in _model_dirs(root):
        models[model_dir.name] = _read_model(model_dir, warn)
    for f in iter_block_files(root):
        m = models.setdefault(f.fingerprint, ModelSummary(f.fingerprint))
        m.blocks += 1
        m.bytes += f.size
        m.last_use = f.last_use if m.last_use is None else max(m.last_use, f.last_use)
    return sorted(models.values(), key=lambda m: -(m.last_use or 0))


def _model_dirs(root: Path) -> list[Path]:
    try:
        with os.scandir(root / "models") as it:
            return sorted(Path(e.path) for e in it if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _read_model(model_dir: Path, warn: Warn) -> ModelSummary:
    summary = ModelSummary(model_dir.name)
    path = model_dir / "model.json"
    try:
        description = json.loads(read_limited(path, _MODEL_JSON_LIMIT))
        if not isinstance(description, dict):
            raise ValueError(f"a JSON {type(description).__name__}, not an object")
        summary.description = description
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as err:
        warn(f"{path}: unreadable, model shown as '?' ({_why(err)})")
    bad: list[int] = []
    for number, run in _runs(model_dir / RUNS_LOG, warn):
        counts = _counts(run)
        if counts is None:
            bad.append(number)
            continue
        summary.runs += 1
        summary.hit_blocks += counts[0]
        summary.written_blocks += counts[1]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        warn(f"{model_dir / RUNS_LOG}: line {bad[0]}{more} skipped (not a run record)")
    return summary


def _runs(path: Path, warn: Warn) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON or None) of each line; a line that is not JSON gives None."""
    try:
        fd, _ = open_regular(path)
    except FileNotFoundError:
        return
    except OSError as err:
        warn(f"{path}: unreadable, run counts left out ({_why(err)})")
        return
    with os.fdopen(fd, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                yield number, json.loads(raw)
            except ValueError:  # a line torn by a crash, or not text
                yield number, None


def _counts(run: Any) -> tuple[int, int] | None:
    """(hit blocks, written blocks) of one record, or None if it is not a run record."""
    if not isinstance(run, dict):
        return None
    values = [run.get(k, 0) for k in _COUNTS]
    if not all(type(v) is int and v >= 0 for v in values):
        return None
    return values[0], values[1]


def _why(err: BaseException) -> str:
    return (err.strerror if isinstance(err, OSError) and err.strerror else None) or str(err)


def clear(root: Path, fingerprint_prefix: str = "") -> PruneResult:
    """Delete every block (of the models whose fingerprint starts with the prefix)."""
    result = PruneResult()
    for f in iter_block_files(root):
        if not f.fingerprint.startswith(fingerprint_prefix):
            result.kept_bytes += f.size
            continue
        try:
            f.path.unlink()
        except FileNotFoundError:
            continue
        result.removed_files += 1
        result.removed_bytes += f.size
    return result

"""What a cache directory holds, per model fingerprint: blocks, bytes, last use, hits (torch-free).

Backs ``kvcli cache stats|ls|clear``. Hit and write counts come from each model's
``runs.jsonl`` (one line per run that read or wrote a block).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcli.kvstore.directory import PruneResult, iter_block_files
from kvcli.kvstore.store import RUNS_LOG


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


def summarize(root: Path) -> list[ModelSummary]:
    """One summary per model directory, most recently used first."""
    models: dict[str, ModelSummary] = {}
    for model_dir in sorted((root / "models").glob("*")):
        if model_dir.is_dir():
            models[model_dir.name] = _read_model(model_dir)
    for f in iter_block_files(root):
        m = models.setdefault(f.fingerprint, ModelSummary(f.fingerprint))
        m.blocks += 1
        m.bytes += f.size
        m.last_use = f.last_use if m.last_use is None else max(m.last_use, f.last_use)
    return sorted(models.values(), key=lambda m: -(m.last_use or 0))


def _read_model(model_dir: Path) -> ModelSummary:
    summary = ModelSummary(model_dir.name)
    try:
        summary.description = json.loads((model_dir / "model.json").read_text())
    except (OSError, ValueError):
        pass
    try:
        lines = (model_dir / RUNS_LOG).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            run = json.loads(line)
        except ValueError:  # a line torn by a crash: skip it
            continue
        summary.runs += 1
        summary.hit_blocks += int(run.get("hit_blocks", 0))
        summary.written_blocks += int(run.get("written_blocks", 0))
    return summary


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

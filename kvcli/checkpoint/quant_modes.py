"""Which ``--quantization`` modes a model directory accepts (torch-free: `kvcli models` asks).

int8 for any loadable model; gguf where a GGUF file is behind it (a gguf-mode directory's
link, or the source a conversion recorded).
"""

from __future__ import annotations

from pathlib import Path

from kvcli.checkpoint.convert import read_record
from kvcli.checkpoint.gguf_meta import linked_gguf

MODES = ("int8", "gguf", "gguf-int")
# The modes that run a GGUF file's own tensors (gguf-int: repacked for the integer kernels).
GGUF_MODES = ("gguf", "gguf-int")


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file behind a model directory (a gguf-mode one, or a conversion), if it still
    exists."""
    linked = linked_gguf(Path(model_dir))
    if linked is not None:
        return linked
    record = read_record(Path(model_dir))
    source = Path(record.source) if record is not None else None
    return source if source is not None and source.is_file() else None


def available_modes(model_dir: Path | None, gguf_file: Path | None = None) -> list[str]:
    """What ``--quantization`` accepts for a model: int8 for any loadable model, gguf and
    gguf-int where a GGUF file is behind it."""
    has_gguf = gguf_file is not None or (model_dir is not None and gguf_source(model_dir))
    return ["int8", *GGUF_MODES] if has_gguf else ["int8"]

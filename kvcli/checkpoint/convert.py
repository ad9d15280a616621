"""Convert a GGUF file once into a float32 safetensors Hugging Face directory.

transformers and gguf are imported inside the functions: importing this module stays cheap.
The tensors themselves are written by the caller's ``write_tensors`` (the torch step,
kvcli/model/gguf_convert.py), so this package never imports torch. The conversion is
written into a hidden temporary directory beside the destination and renamed into place only when complete (the marker
file is its last write), so a killed conversion never leaves a half model that
later runs would trust. Each file's size, mtime and SHA-256 go into the marker, and every
use checks them first (kvcli/checkpoint/integrity.py), so a file damaged later is an error that
names the directory, never silent garbage.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from kvcli import startup
from kvcli.checkpoint.integrity import (
    FileRecords,
    check_files,
    describe_files,
    sha256_file,
    write_atomically,
)
from kvcli.checkpoint.progress import ModelProgress

MARKER = "kvcli_model.json"
_TEMP_PREFIX = ".tmp-"
_UNCHECKED = frozenset({MARKER})  # the marker holds the checksums; hidden temp files skipped


#: Writes a GGUF's config, float32 weights and tokenizer into a directory (the torch step).
TensorWriter = Callable[[Path, Path], None]


class ModelResolveError(ValueError):
    """A --model spec cannot be turned into a usable model directory."""


@dataclass(slots=True)
class ConversionRecord:
    """What kvcli_model.json records about a converted model."""

    name: str
    source: str
    source_size: int
    source_mtime_ns: int
    seconds: float
    transformers_version: str
    created: str
    source_sha256: str | None = None  # None in conversions made before checksums
    files: FileRecords = field(default_factory=dict)  # name -> size, mtime_ns, sha256


def is_converted(directory: Path) -> bool:
    return (directory / MARKER).is_file() and (directory / "config.json").is_file()


def read_record(directory: Path) -> ConversionRecord | None:
    try:
        return ConversionRecord(**json.loads((directory / MARKER).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def _write_record(directory: Path, record: ConversionRecord) -> bool:
    return write_atomically(directory / MARKER, json.dumps(asdict(record), indent=2))


def damaged_hint(directory: Path) -> str:
    """What to do about a damaged conversion: which directory to delete, and what follows."""
    record = read_record(directory)
    source = Path(record.source) if record else None
    then = (f"the next run converts {source} again" if source and source.is_file()
            else "then convert the GGUF again (kvcli models convert FILE.gguf)")
    return f"delete the directory {directory} (rm -r '{directory}'); {then}"


def verify_conversion(directory: Path) -> Path:
    """`directory` if its files are the ones kvcli wrote; ModelResolveError naming it if not.

    Cheap when nothing changed (a stat per file). Conversions from before checksums get
    theirs recorded now, from the files as they are."""
    record = read_record(directory)
    if record is None:
        raise ModelResolveError(f"{directory / MARKER}: unreadable; {damaged_hint(directory)}")
    if not record.files:
        _write_record(directory, replace(record, files=describe_files(directory, _UNCHECKED)))
        return directory
    problem, files = check_files(directory, record.files)
    if problem:
        raise ModelResolveError(f"{directory}: kvcli's converted model is damaged: {problem}; "
                                f"{damaged_hint(directory)}")
    if files != record.files:  # verified again after an mtime change: cheap next time
        _write_record(directory, replace(record, files=files))
    return directory


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temp_dirs(parent: Path) -> None:
    """Delete temp dirs left by conversions whose process is gone (killed mid-way)."""
    for entry in parent.glob(_TEMP_PREFIX + "*"):
        pid_text = entry.name.removeprefix(_TEMP_PREFIX).split("-", 1)[0]
        if entry.is_dir() and pid_text.isdigit() and not _pid_alive(int(pid_text)):
            shutil.rmtree(entry, ignore_errors=True)


@contextmanager
def staged_directory(dest: Path, quiet: bool,
                     is_done: Callable[[Path], bool]) -> Iterator[tuple[Path, ModelProgress]]:
    """(a new hidden directory beside ``dest``, progress) to write ``dest``'s files into; renamed
    onto ``dest`` when the block ends (unless a concurrent writer finished first: ``is_done``),
    removed if it fails or is interrupted. Temporary directories of dead processes go first."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_dirs(dest.parent)
    temp = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-{dest.name}-",
                                 dir=dest.parent))
    progress = ModelProgress(quiet)
    try:
        with startup.removed_if_interrupted(temp), progress.library_output():
            yield temp, progress
            try:
                os.rename(temp, dest)
            except OSError:
                if not is_done(dest):
                    raise
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def gguf_chat_template(gguf_path: Path) -> str | None:
    """The tokenizer.chat_template string stored in a GGUF's metadata, if any."""
    import gguf

    field = gguf.GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    value = field.contents()
    return value if isinstance(value, str) and value else None


def _ensure_chat_template(gguf_path: Path, out: Path, require_chatml: bool) -> None:
    from kvcli.tokenizer import Tokenizer

    template = Tokenizer.from_dir(out).chat_template
    if template is None:
        template = gguf_chat_template(gguf_path)
        if template is not None:
            (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    if require_chatml and "<|im_start|>" not in (template or ""):
        raise ModelResolveError(f"{gguf_path}: converted model has no ChatML chat template")


def convert_gguf(gguf_path: Path, dest: Path, *, label: str, write_tensors: TensorWriter | None,
                 require_chatml: bool = False, quiet: bool = False) -> Path:
    """Convert `gguf_path` into `dest` unless already there (then verified); return `dest`.

    ``write_tensors`` is the torch step (kvcli/model/gguf_convert.py): this package stays
    torch-free, so a caller that may convert passes it; None when it never should."""
    if is_converted(dest):
        return verify_conversion(dest)
    if write_tensors is None:
        raise ModelResolveError(f"{gguf_path}: converting a GGUF needs the model layer "
                                "(kvcli.model.gguf_convert.resolve_model converts)")
    if dest.exists():
        raise ModelResolveError(
            f"{dest} exists but is not a finished kvcli conversion (no {MARKER}); remove it and retry"
        )
    started = time.monotonic()
    with staged_directory(dest, quiet, is_converted) as (temp, progress):
        progress.phase(f"converting {label} ({gguf_path.name}) to float32 safetensors in {dest} "
                       "(first use only; this takes a while)")
        progress.phase("de-quantizing the tensors and writing model.safetensors")
        write_tensors(gguf_path, temp)
        _ensure_chat_template(gguf_path, temp, require_chatml)
        progress.phase("recording the checksums of the converted files")
        record = _conversion_record(gguf_path, temp, dest.name, started)
        (temp / MARKER).write_text(json.dumps(asdict(record), indent=2), encoding="utf-8")
    progress.phase(f"converted {label} in {time.monotonic() - started:.1f} s")
    return dest


def _conversion_record(gguf_path: Path, out: Path, name: str, started: float) -> ConversionRecord:
    import transformers

    stat = gguf_path.stat()
    return ConversionRecord(
        name=name,
        source=str(gguf_path),
        source_size=stat.st_size,
        source_mtime_ns=stat.st_mtime_ns,
        seconds=round(time.monotonic() - started, 1),
        transformers_version=transformers.__version__,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        source_sha256=sha256_file(gguf_path),
        files=describe_files(out, _UNCHECKED),
    )

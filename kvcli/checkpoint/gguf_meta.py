"""The model directory ``--quantization gguf`` runs from: a GGUF's config and tokenizer, no weights.

A float32 conversion (convert.py) de-quantizes every tensor: 45 s and a 538 MB copy for the
default model. The gguf mode needs none of that, only what the engine reads beside the weights:
config.json, generation_config.json, tokenizer.json, tokenizer_config.json and the chat template.
They are derived once per GGUF with transformers (the same code the conversion runs, so the
files are the conversion's byte for byte) into ``$KVCLI_HOME/gguf/<name>-<key>``, keyed like a
conversion by the GGUF's path, size and mtime; ``model.gguf`` there links to the file itself,
which is what the weights are memory-mapped from (and what a disk KV cache fingerprints).
Deriving takes seconds (transformers parses the vocabulary, once: ``_one_gguf_parse``); later
runs only stat the file, and a byte-identical GGUF elsewhere (a copy, or the file moved or
touched) reuses them by the SHA-256 its directory records.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvcli.checkpoint.convert import ModelResolveError, gguf_chat_template, staged_directory
from kvcli.checkpoint.integrity import sha256_file

LINK = "model.gguf"
_DONE = "kvcli_gguf.json"  # written last: a directory without it is unfinished
_REFUSED = 3  # the child's exit status for a GGUF it cannot derive a model from (its message)


def linked_gguf(model_dir: Path) -> Path | None:
    """The GGUF a gguf-mode directory runs, if ``model_dir`` is one and the file exists."""
    link = Path(model_dir) / LINK
    return link.resolve() if (Path(model_dir) / _DONE).is_file() and link.is_file() else None


@contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """transformers parses a llama GGUF's whole metadata (gguf's GGUFReader: a NumPy slice per
    vocabulary string, ~3 s of the default model's first use) for AutoConfig, and again inside
    AutoTokenizer for the config it picks the tokenizer class by. Within this block the second
    parse is a copy of the first's result: the same function, the same file, the same output."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    real = gguf_utils.load_gguf_checkpoint
    parsed: dict[str, Any] = {}

    def once(path: str, return_tensors: bool = False, **kwargs: Any) -> Any:
        if return_tensors or kwargs:
            return real(path, return_tensors, **kwargs)
        if str(path) not in parsed:
            parsed[str(path)] = real(path, return_tensors=False)
        return copy.deepcopy(parsed[str(path)])  # callers may change what they are given

    gguf_utils.load_gguf_checkpoint = once
    try:
        yield
    finally:
        gguf_utils.load_gguf_checkpoint = real


def _write_metadata(gguf_path: Path, out: Path, require_chatml: bool) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from kvcli.tokenizer import Tokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    with _one_gguf_parse():
        try:
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
        except (ValueError, KeyError) as err:
            raise ModelResolveError(f"{gguf_path}: cannot read this GGUF's config: {err}") from err
        # What a saved model adds to its config (the conversion's config.json has both).
        config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type, "")]
        config.dtype = "float32"  # saved as torch.float32 is (the same bytes), without torch
        config.save_pretrained(out)
        GenerationConfig.from_model_config(config).save_pretrained(out)
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
    template = Tokenizer.from_dir(out).chat_template or gguf_chat_template(gguf_path)
    if template is not None and not (out / "chat_template.jinja").is_file():
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    if require_chatml and "<|im_start|>" not in (template or ""):
        raise ModelResolveError(f"{gguf_path}: the GGUF has no ChatML chat template")


def _derive(gguf_path: Path, out: Path, require_chatml: bool) -> None:
    """:func:`_write_metadata` in a child process: transformers' parse of the vocabulary grows
    the heap by ~700 MB that the job would keep (a fresh ``KVCLI_HOME``'s peak RSS was 2.0 GB
    against 1.4 GB warm); the job keeps only the files it wrote."""
    root = str(Path(__file__).resolve().parents[2])  # the child imports this very kvcli
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
    cmd = [sys.executable, "-m", "kvcli.checkpoint.gguf_meta", str(gguf_path), str(out),
           "chatml" if require_chatml else "any"]
    # stdin closed: `kvcli generate -` reads its job from it, which the child must never take.
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env)
    if done.returncode == _REFUSED:
        raise ModelResolveError(done.stdout.strip())
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ModelResolveError(f"{gguf_path}: reading its config and tokenizer failed "
                                f"(exit {done.returncode}): {tail}")


def _main(gguf: str, out: str, template: str) -> int:
    from kvcli.checkpoint.progress import ModelProgress

    try:
        with ModelProgress(quiet=True).library_output():
            _write_metadata(Path(gguf), Path(out), require_chatml=template == "chatml")
    except ModelResolveError as err:
        print(err)
        return _REFUSED
    return 0


def _same_content(root: Path, digest: str) -> Path | None:
    """A finished directory under ``root`` made from a GGUF with this SHA-256: its metadata
    files are this file's (they are derived from its bytes alone)."""
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            done = json.loads((entry / _DONE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(done, dict) and done.get("sha256") == digest:
            return entry
    return None


def gguf_model_dir(gguf_path: Path, dest: Path, *, label: str, require_chatml: bool = False,
                   quiet: bool = False) -> Path:
    """``dest``, holding ``gguf_path``'s metadata files and a link to it (made on first use)."""
    if linked_gguf(dest) is not None:
        return dest
    if dest.exists():  # unfinished (killed while writing) or the GGUF moved: made again
        shutil.rmtree(dest, ignore_errors=True)
    started = time.monotonic()
    with staged_directory(dest, quiet, lambda d: linked_gguf(d) is not None) as (temp, progress):
        digest = sha256_file(gguf_path)
        same = _same_content(dest.parent, digest)
        if same is not None:  # a copy of this file (or it, moved or touched) was read before
            for file in same.iterdir():
                if file.name not in (LINK, _DONE) and file.is_file() and not file.is_symlink():
                    shutil.copy2(file, temp / file.name)
        else:
            progress.phase(f"reading the config and tokenizer of {label} ({gguf_path.name}) "
                           "for --quantization gguf (first use only)")
            _derive(gguf_path, temp, require_chatml)
        (temp / LINK).symlink_to(gguf_path.resolve())
        done = {"source": str(gguf_path.resolve()), "sha256": digest}
        (temp / _DONE).write_text(json.dumps(done) + "\n", encoding="utf-8")
    progress.phase(f"ready in {time.monotonic() - started:.1f} s")
    return dest


if __name__ == "__main__":  # _derive's child
    sys.exit(_main(*sys.argv[1:]))

"""The model directory ``--quantization gguf`` runs from: a GGUF's config and tokenizer, no weights.

A float32 conversion (convert.py) de-quantizes every tensor: 45 s and a 538 MB copy for the
default model. The gguf mode needs none of that, only what the engine reads beside the weights:
config.json, generation_config.json, tokenizer.json, tokenizer_config.json and the chat template.
They are derived once per GGUF with transformers (the same code the conversion runs, so the
files are the conversion's byte for byte) into ``$KVCLI_HOME/gguf/<name>-<key>``, keyed like a
conversion by the GGUF's path, size and mtime; ``model.gguf`` there links to the file itself,
which is what the weights are memory-mapped from (and what a disk KV cache fingerprints).
Deriving takes seconds (transformers parses the vocabulary); later runs only stat the file.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from kvcli.checkpoint.convert import ModelResolveError, gguf_chat_template, staged_directory

LINK = "model.gguf"
_DONE = "kvcli_gguf.json"  # written last: a directory without it is unfinished


def linked_gguf(model_dir: Path) -> Path | None:
    """The GGUF a gguf-mode directory runs, if ``model_dir`` is one and the file exists."""
    link = Path(model_dir) / LINK
    return link.resolve() if (Path(model_dir) / _DONE).is_file() and link.is_file() else None


def _write_metadata(gguf_path: Path, out: Path, require_chatml: bool) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from kvcli.tokenizer import Tokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
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


def gguf_model_dir(gguf_path: Path, dest: Path, *, label: str, require_chatml: bool = False,
                   quiet: bool = False) -> Path:
    """``dest``, holding ``gguf_path``'s metadata files and a link to it (made on first use)."""
    if linked_gguf(dest) is not None:
        return dest
    if dest.exists():  # unfinished (killed while writing) or the GGUF moved: made again
        shutil.rmtree(dest, ignore_errors=True)
    started = time.monotonic()
    with staged_directory(dest, quiet, lambda d: linked_gguf(d) is not None) as (temp, progress):
        progress.phase(f"reading the config and tokenizer of {label} ({gguf_path.name}) "
                       "for --quantization gguf (first use only)")
        _write_metadata(gguf_path, temp, require_chatml)
        (temp / LINK).symlink_to(gguf_path.resolve())
        (temp / _DONE).write_text(json.dumps({"source": str(gguf_path.resolve())}) + "\n",
                                  encoding="utf-8")
    progress.phase(f"ready in {time.monotonic() - started:.1f} s")
    return dest

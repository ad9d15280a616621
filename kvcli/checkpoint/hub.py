"""`--model ORG/NAME`: a Hugging Face hub repo, as vLLM takes it.

The snapshot in the local hub cache is used when it has what kvcli needs (config.json,
tokenizer.json, safetensors weights). Otherwise kvcli downloads those files (and only those:
no pickle weights unless --allow-pickle, no ONNX or GGUF copies) when online, saying so in
one line; with HF_HUB_OFFLINE set, a missing or incomplete snapshot is an error that says
what is missing and how to get it. huggingface_hub is imported only here, when a repo id is
used.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvcli.checkpoint.convert import ModelResolveError
from kvcli.checkpoint.model_dir import missing_model_files, validate_model_dir
from kvcli.checkpoint.progress import ModelProgress
from kvcli.paths import hub_cache_dir

# What a model directory needs besides weights; the hub download fetches only these.
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "additional_chat_templates/*"]


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _cached_snapshot(repo_id: str, cache: Path) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except Exception:  # any miss means "not cached"; what is missing is reported by the caller
        return None


def _offline_error(repo_id: str, cache: Path, local: Path | None, allow_pickle: bool) -> str:
    where = "no snapshot"
    if local is not None:
        where = f"snapshot {local} has {'; '.join(missing_model_files(local, allow_pickle))}"
    return (f"--model {repo_id}: no such local directory, and as a Hugging Face repo it is not "
            f"usable from the cache {cache} ({where}) while HF_HUB_OFFLINE is set; unset "
            "HF_HUB_OFFLINE to let kvcli download it, download it where there is network "
            "(huggingface-cli download), or pass a local directory")


def resolve_hub_model(repo_id: str, allow_pickle: bool = False, quiet: bool = False) -> Path:
    """The repo's snapshot from the local cache, downloaded first if absent and online."""
    from huggingface_hub import snapshot_download

    cache = hub_cache_dir()
    local = _cached_snapshot(repo_id, cache)
    if local is not None and not missing_model_files(local, allow_pickle):
        return validate_model_dir(local, allow_pickle)
    if hub_offline():
        raise ModelResolveError(_offline_error(repo_id, cache, local, allow_pickle))
    patterns = _HUB_PATTERNS + (["*.bin"] if allow_pickle else [])
    endpoint = os.environ.get("HF_ENDPOINT") or None
    progress = ModelProgress(quiet)
    why = "its cached snapshot is incomplete" if local else "not in the local cache"
    progress.phase(f"downloading {repo_id} from the Hugging Face hub into {cache} ({why}; "
                   "set HF_HUB_OFFLINE=1 to forbid downloads)")
    try:
        with progress.library_output(transformers=False):
            fetched = Path(snapshot_download(repo_id, cache_dir=cache, allow_patterns=patterns,
                                             endpoint=endpoint))
    except Exception as err:  # network, auth and not-found errors all end here
        where = f"cached snapshot {local} is incomplete" if local else f"not in the cache {cache}"
        raise ModelResolveError(
            f"--model {repo_id}: no such local directory, and as a Hugging Face repo it is "
            f"{where}, and downloading failed: {err}"
        ) from err
    progress.phase(f"downloaded {repo_id} to {fetched}")
    return validate_model_dir(fetched, allow_pickle)

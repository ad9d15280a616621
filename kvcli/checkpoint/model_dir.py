"""What makes a directory a usable model: config, tokenizer and weights kvcli may load.

Shared by the resolver (a local directory) and the hub (a cached or downloaded snapshot).
"""

from __future__ import annotations

from pathlib import Path

from kvcli.checkpoint.convert import ModelResolveError
from kvcli.tokenizer import TokenizerError, read_json


def _weights_problem(directory: Path, allow_pickle: bool) -> str | None:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = set(read_json(index).get("weight_map", {}).values())
        absent = sorted(s for s in shards if not (directory / s).is_file())
        return f"missing safetensors shards {', '.join(absent)}" if absent else None
    if any(directory.glob("*.safetensors")):
        return None
    pickles = sorted(p.name for p in directory.glob("*.bin"))
    if pickles and allow_pickle:
        return None
    if pickles:
        return (
            f"only PyTorch pickle weights ({', '.join(pickles)}); unpickling can run arbitrary code, "
            "so kvcli refuses them unless you pass --allow-pickle"
        )
    return "no weights (model.safetensors or *.safetensors shards)"


def missing_model_files(directory: Path, allow_pickle: bool = False) -> list[str]:
    """What keeps `directory` from being a loadable model, as short phrases."""
    problems = [
        f"no {name}"
        for name in ("config.json", "tokenizer.json")
        if not (directory / name).is_file()
    ]
    weights = _weights_problem(directory, allow_pickle)
    return problems + ([weights] if weights else [])


def validate_model_dir(directory: Path, allow_pickle: bool = False) -> Path:
    """Check a local model directory and return it resolved; clear errors otherwise."""
    problems = missing_model_files(directory, allow_pickle)
    if problems:
        raise ModelResolveError(f"{directory}: not a usable model directory: {'; '.join(problems)}")
    try:
        config = read_json(directory / "config.json")
    except TokenizerError as err:
        raise ModelResolveError(str(err)) from err
    if config.get("auto_map"):
        raise ModelResolveError(
            f"{directory / 'config.json'}: field auto_map asks for the model's own Python code "
            "(trust_remote_code); kvcli never runs remote code"
        )
    return directory.resolve()

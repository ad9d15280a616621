"""Build a kvcli model from a Hugging Face model directory (config.json + safetensors weights).

Weights are copied tensor by tensor from the (memory-mapped) checkpoint straight into the
model's parameters, so no second full copy of the model is ever held. Downloaded code
(``auto_map`` / trust_remote_code) is never run, and pickle checkpoints are refused unless the
caller explicitly allows them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from kvcli.checkpoint.config import ModelConfig, load_config_json, parse_model_config, read_field
from kvcli.model.layers import Linear, use_input_major_layout
from kvcli.model.packed import pack_narrow_weights
from kvcli.model.registry import choose_architecture, model_class, supported_architectures

# (source file, checkpoint name, tensor)
CheckpointTensor = tuple[str, str, torch.Tensor]


class ModelLoadError(ValueError):
    """Weights that do not fit the model; the message names the file and tensor."""


def read_model_config(model_dir: Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    raw = load_config_json(path)
    if "auto_map" in raw:
        raise ModelLoadError(
            f"{path}: field 'auto_map': this model needs Python code from its repository "
            f"(trust_remote_code), which kvcli never runs; supported architectures: "
            f"{', '.join(supported_architectures())}"
        )
    return parse_model_config(raw, str(path), choose_architecture(raw, str(path)))


def read_eos_token_ids(model_dir: Path) -> tuple[int, ...]:
    """End-of-sequence ids from generation_config.json, falling back to config.json."""
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if not path.is_file():
            continue
        value = read_field(load_config_json(path), str(path), "eos_token_id", (int, list), None)
        if value is None:
            continue
        ids = [value] if isinstance(value, int) else value
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ModelLoadError(f"{path}: field 'eos_token_id': expected token ids, got {value!r}")
        return tuple(ids)
    return ()


def _shard_files(model_dir: Path, index_name: str, pattern: str) -> list[Path]:
    index = model_dir / index_name
    if not index.is_file():
        return sorted(model_dir.glob(pattern))
    weight_map = read_field(load_config_json(index), str(index), "weight_map", dict)
    files = [model_dir / name for name in sorted(set(weight_map.values()))]
    for file in files:
        if not file.is_file():
            raise ModelLoadError(f"{index}: field 'weight_map': shard {file.name} is missing")
    return files


def checkpoint_tensors(model_dir: Path, allow_pickle: bool = False) -> Iterator[CheckpointTensor]:
    """Every tensor of the checkpoint, one at a time (safetensors preferred)."""
    model_dir = Path(model_dir)
    files = _shard_files(model_dir, "model.safetensors.index.json", "*.safetensors")
    if files:
        from safetensors import SafetensorError, safe_open

        for file in files:
            try:
                with safe_open(str(file), framework="pt", device="cpu") as handle:
                    names = list(handle.keys())
                # One mapping per tensor: a mapping's pages count in this process's RSS until
                # it is closed, so one open for the whole file held all of it beside the
                # model's copy (the float32 default model's load peaked at twice its weights).
                for name in names:
                    with safe_open(str(file), framework="pt", device="cpu") as handle:
                        tensor = handle.get_tensor(name)
                    yield file.name, name, tensor
                    del tensor
            except SafetensorError as err:
                _raise_if_converted(model_dir, file, err)
                raise
        return
    pickles = _shard_files(model_dir, "pytorch_model.bin.index.json", "*.bin")
    pickles = [f for f in pickles if f.name != "training_args.bin"]
    if not pickles:
        raise ModelLoadError(f"{model_dir}: no weights found (expected *.safetensors)")
    if not allow_pickle:
        raise ModelLoadError(
            f"{pickles[0]}: pickle checkpoints (.bin) can run code when loaded and are refused; "
            "convert the model to safetensors, or allow pickle for a source you trust"
        )
    for file in pickles:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        for name, tensor in state.items():
            yield file.name, name, tensor
        del state


def _raise_if_converted(model_dir: Path, file: Path, err: Exception) -> None:
    """A damaged file in kvcli's own conversion cache: say which directory to delete."""
    from kvcli.checkpoint.convert import MARKER, damaged_hint

    if (model_dir / MARKER).is_file():
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
        raise ModelLoadError(f"{file}: unreadable ({type(err).__name__}: {first}); "
                             f"{damaged_hint(model_dir)}") from None


def _destination(model: nn.Module, name: str) -> tuple[str, int | None]:
    """Our parameter name for a checkpoint name, and the stacked shard it fills (q/k/v, gate/up)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        for fused, members in model.packed_modules.items():
            if part in members:
                parts[i] = fused
                return ".".join(parts), members.index(part)
    return name, None


def _expected_pieces(model: nn.Module) -> set[tuple[str, int | None]]:
    pieces: set[tuple[str, int | None]] = set()
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            shards = len(module.output_sizes) if isinstance(module, Linear) else 1
            if shards == 1:
                pieces.add((full, None))
            else:
                pieces.update((full, shard) for shard in range(shards))
    return pieces


@torch.no_grad()
def load_weights(model: nn.Module, tensors: Iterable[CheckpointTensor]) -> None:
    """Copy checkpoint tensors into ``model``; missing or unexpected names are an error."""
    params = dict(model.named_parameters())
    expected, loaded, unexpected = _expected_pieces(model), set(), []
    for file, name, tensor in tensors:
        if name.endswith(model.ignored_checkpoint_suffixes):
            continue
        target, shard = _destination(model, name)
        param = params.get(target)
        if param is None:
            unexpected.append(f"{file}:{name}")
            continue
        dest = param
        if shard is not None:
            rows = model.get_submodule(target.rsplit(".", 1)[0]).shard_rows(shard)
            dest = param[rows]
        if dest.shape != tensor.shape:
            raise ModelLoadError(
                f"{file}: tensor '{name}': shape {tuple(tensor.shape)} does not match the "
                f"config's {tuple(dest.shape)} (for {target})"
            )
        dest.copy_(tensor)
        loaded.add((target, shard))
    if unexpected:
        raise ModelLoadError(
            f"unexpected weights (not part of {type(model).__name__}): {', '.join(unexpected[:8])}"
            + (f" and {len(unexpected) - 8} more" if len(unexpected) > 8 else "")
        )
    missing = sorted(n if s is None else f"{n}[shard {s}]" for n, s in expected - loaded)
    if missing:
        raise ModelLoadError(
            f"weights missing from the checkpoint: {', '.join(missing[:8])}"
            + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        )


def build_model(
    config: ModelConfig, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> nn.Module:
    """An uninitialised model for ``config``; fill it with ``load_weights``."""
    return model_class(config.architecture)(config, dtype=dtype, device=device)


def load_model(
    model_dir: Path,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    allow_pickle: bool = False,
) -> nn.Module:
    model_dir = Path(model_dir)
    model = build_model(read_model_config(model_dir), dtype, device)
    weights = getattr(getattr(model, "platform", None), "weights", torch.float32)
    if torch.device(device).type == "cpu":
        # Before loading: weights go straight in, in the dtype the model multiplies them in.
        use_input_major_layout(model, copy=False, weights=weights)
    tensors = checkpoint_tensors(model_dir, allow_pickle)
    load_weights(model, headless_names(tensors) if getattr(model, "headless", False) else tensors)
    if torch.device(device).type == "cpu" and weights != torch.float32:
        pack_narrow_weights(model)  # oneDNN's layout once, not per call (model/packed.py)
    if hasattr(model, "enable_fast_decode"):
        model.enable_fast_decode()
    release_free_heap()
    return model.eval()


def headless_names(tensors: Iterable[CheckpointTensor]) -> Iterator[CheckpointTensor]:
    """A headless checkpoint's tensors (``layers.0...``, ``embed_tokens.weight``) under the
    names of the ``model.*`` submodule they fill; names already under it stay."""
    for file, name, tensor in tensors:
        yield file, name if name.startswith("model.") else f"model.{name}", tensor


def release_free_heap() -> None:
    """Hand the loader's freed scratch memory back to the OS (glibc keeps it otherwise:
    ~27 MB of peak RSS for SmolLM2-135M). A no-op where there is no glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


__all__ = [
    "ModelLoadError",
    "build_model",
    "checkpoint_tensors",
    "headless_names",
    "load_model",
    "load_weights",
    "read_eos_token_ids",
    "read_model_config",
    "release_free_heap",
]

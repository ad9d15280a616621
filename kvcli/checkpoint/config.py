"""Model hyper-parameters read from a Hugging Face ``config.json`` (torch-free).

Kept free of torch so that commands such as ``kvcli models`` can inspect a model directory
without paying for the torch import.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# RoPE variants whose frequencies we reproduce exactly (transformers' modeling_rope_utils).
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")

_REQUIRED = object()


class ModelConfigError(ValueError):
    """A config.json that kvcli cannot use; the message names the file and the field."""


@dataclass(slots=True, frozen=True)
class RopeConfig:
    rope_type: str
    theta: float
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 0
    # Fraction of each head that is rotated (Phi-3 / Phi-4-mini); families without it refuse != 1.
    partial_rotary_factor: float = 1.0
    # LongRoPE (Phi-3): per-frequency divisors below / from the original context, cos/sin scale.
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0


@dataclass(slots=True, frozen=True)
class ModelConfig:
    path: str  # the config.json this came from, for error messages
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    hidden_act: str
    rope: RopeConfig
    raw: dict[str, Any]  # the whole file, for family-specific fields (sliding windows, ...)

    def field(self, name: str, kind: type | tuple[type, ...], default: Any = _REQUIRED) -> Any:
        return read_field(self.raw, self.path, name, kind, default)


def read_field(
    raw: dict, path: str, name: str, kind: type | tuple[type, ...], default: Any = _REQUIRED
) -> Any:
    """``raw[name]`` checked against ``kind``; a missing or null field yields ``default``."""
    value = raw.get(name)
    if value is None:
        if default is _REQUIRED:
            raise ModelConfigError(f"{path}: field '{name}': required but missing")
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # JSON has no int/float split we can trust ("factor": 8), and bool is an int in Python.
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
        names = " or ".join(k.__name__ for k in kinds)
        raise ModelConfigError(f"{path}: field '{name}': expected {names}, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        raise ModelConfigError(f"{path}: field '{name}': must not be negative, got {value!r}")
    return value


def load_config_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelConfigError(
            f"{path}: not found (a model directory needs a config.json)"
        ) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path}: line {exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{path}: expected a JSON object at the top level")
    return raw


def parse_rope(raw: dict, path: str, max_position_embeddings: int) -> RopeConfig:
    """Both spellings: transformers 5's ``rope_parameters`` and the older top-level
    ``rope_theta`` plus ``rope_scaling`` (whose type key is ``rope_type`` or ``type``)."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    key = "rope_parameters" if raw.get("rope_parameters") else "rope_scaling"
    if not isinstance(params, dict):
        raise ModelConfigError(f"{path}: field '{key}': expected an object, got {params!r}")
    where = f"{path}: field '{key}'"
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "su" or (rope_type == "yarn" and raw.get("model_type") == "phi3"):
        rope_type = "longrope"  # early Phi-3 configs' names for LongRoPE, as Phi3Config maps them
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelConfigError(
            f"{where}: rope type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    partial = read_field(params, where, "partial_rotary_factor", float, None)
    if partial is None:
        partial = read_field(raw, path, "partial_rotary_factor", float, 1.0)
    theta = read_field(params, where, "rope_theta", float, None)
    if theta is None:
        theta = read_field(raw, path, "rope_theta", float, 10000.0)
    if rope_type == "default":
        return RopeConfig("default", theta, partial_rotary_factor=partial)
    original = read_field(params, where, "original_max_position_embeddings", int, None)
    if original is None:
        original = read_field(
            raw, path, "original_max_position_embeddings", int, max_position_embeddings
        )
    if rope_type == "longrope":
        return parse_longrope(params, where, theta, partial, original, max_position_embeddings)
    factor = read_field(params, where, "factor", float)
    if rope_type == "linear":
        return RopeConfig("linear", theta, factor, partial_rotary_factor=partial)
    return RopeConfig(
        "llama3",
        theta,
        factor,
        partial_rotary_factor=partial,
        low_freq_factor=read_field(params, where, "low_freq_factor", float),
        high_freq_factor=read_field(params, where, "high_freq_factor", float),
        original_max_position_embeddings=original,
    )


def parse_longrope(params: dict, where: str, theta: float, partial: float, original: int,
                   max_position_embeddings: int) -> RopeConfig:
    """transformers' ``_compute_longrope_parameters``: ``factor`` defaults to the context ratio,
    ``attention_factor`` to sqrt(1 + ln(factor) / ln(original)) (1 when factor <= 1)."""
    factors = []
    for name in ("short_factor", "long_factor"):
        value = read_field(params, where, name, list)
        if not all(isinstance(f, int | float) and not isinstance(f, bool) for f in value):
            raise ModelConfigError(f"{where}: field '{name}': expected a list of numbers")
        factors.append(tuple(float(f) for f in value))
    factor = read_field(params, where, "factor", float, None)
    if factor is None:
        factor = max_position_embeddings / original
    attention = read_field(params, where, "attention_factor", float, None)
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeConfig("longrope", theta, factor, original_max_position_embeddings=original,
                      partial_rotary_factor=partial, short_factor=factors[0],
                      long_factor=factors[1], attention_factor=attention)


def parse_model_config(raw: dict[str, Any], path: str, architecture: str) -> ModelConfig:
    def get(name: str, kind: type | tuple[type, ...], default: Any = _REQUIRED) -> Any:
        return read_field(raw, path, name, kind, default)

    hidden = get("hidden_size", int)
    heads = get("num_attention_heads", int)
    if heads == 0 or hidden == 0:
        raise ModelConfigError(
            f"{path}: fields 'hidden_size'/'num_attention_heads' must be positive"
        )
    kv_heads = get("num_key_value_heads", int, heads)
    if kv_heads == 0 or heads % kv_heads:
        raise ModelConfigError(
            f"{path}: field 'num_key_value_heads': {kv_heads} does not divide num_attention_heads {heads}"
        )
    model_type = get("model_type", str, "")
    # Qwen3Config's class default is 128 rather than hidden/heads; every other family derives it.
    head_dim = get("head_dim", int, 128 if model_type == "qwen3" else hidden // heads)
    max_pos = get("max_position_embeddings", int)
    return ModelConfig(
        path=path,
        architecture=architecture,
        model_type=model_type,
        vocab_size=get("vocab_size", int),
        hidden_size=hidden,
        intermediate_size=get("intermediate_size", int),
        num_layers=get("num_hidden_layers", int),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=get("rms_norm_eps", float, 1e-6),
        max_position_embeddings=max_pos,
        tie_word_embeddings=get("tie_word_embeddings", bool, False),
        attention_bias=get("attention_bias", bool, False),
        mlp_bias=get("mlp_bias", bool, False),
        hidden_act=get("hidden_act", str, "silu"),
        rope=parse_rope(raw, path, max_pos),
        raw=raw,
    )

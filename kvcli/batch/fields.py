"""Typed access to one line's fields: sampling overrides on top of the CLI defaults, ids, strings.

Every check raises :class:`LineError` naming the field, so a bad line becomes a
per-line error result instead of stopping the batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from typing import Any

from kvcli.batch.records import LineError, clip
from kvcli.engine.request import SamplingParams

#: Every SamplingParams field may be set per line (plain lines and OpenAI bodies alike).
SAMPLING_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SamplingParams))


def present(obj: dict[str, Any]) -> dict[str, Any]:
    """The fields that are set: JSON ``null`` means "use the default", as in OpenAI's API."""
    return {k: v for k, v in obj.items() if v is not None}


def unknown_fields(obj: dict[str, Any], known: Iterable[str], strict: bool,
                   prefix: str = "") -> list[str]:
    """Fields this line sets that kvcli does not know; an error under ``--strict``."""
    known_set = set(known)
    unknown = [f"{prefix}{k}" for k in obj if k not in known_set]
    if unknown and strict:
        raise LineError(unknown[0], "unknown field (--strict)")
    return unknown


def get_str(obj: dict[str, Any], name: str, *, prefix: str = "") -> str | None:
    """An optional non-empty string field."""
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise LineError(prefix + name, f"expected a non-empty string, got {show_value(value)}")
    return value


def sampling_overrides(obj: dict[str, Any], names: Iterable[str] = SAMPLING_FIELDS,
                       prefix: str = "") -> dict[str, Any]:
    """The sampling fields a line sets; ``stop`` may be one string, as in OpenAI's API."""
    out = {name: obj[name] for name in names if obj.get(name) is not None}
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    if "ignore_eos" in out and not isinstance(out["ignore_eos"], bool):
        raise LineError(prefix + "ignore_eos", f"expected true or false, got {show_value(out['ignore_eos'])}")
    return out


def build_params(defaults: SamplingParams, overrides: dict[str, Any], key: str, run_seed: int,
                 prefix: str = "") -> SamplingParams:
    """CLI defaults, then the line's fields; a missing seed is derived from the run seed and id.

    Deriving the seed from the id (not from arrival order) makes a sampled result
    the same in a clean run and in a ``--resume``-d one.
    """
    params = dataclasses.replace(defaults, **overrides)
    for name in ("stop", "stop_token_ids"):
        value = getattr(params, name)
        if isinstance(value, list):
            setattr(params, name, list(value))  # never share the defaults' list
    try:
        params.validate()
    except ValueError as err:
        parsed = LineError.from_value_error(err)
        raise LineError(prefix + (parsed.field or ""), parsed.message) from None
    if params.seed is None:
        params.seed = derive_seed(run_seed, key)
    return params


def derive_seed(run_seed: int, key: str) -> int:
    digest = hashlib.sha256(f"{run_seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:6], "little")


def show_value(value: Any) -> str:
    """A short rendering of a bad value for an error message (a line may hold megabytes)."""
    return clip(repr(value), 60)

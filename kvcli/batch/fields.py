"""A line's sampling fields on top of the CLI defaults (generate only: the audit samples nothing).

Reading the fields is the shared request model's job (kvcli/inputs); here they
become validated :class:`SamplingParams`, errors naming the field.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from kvcli.inputs import LineError
from kvcli.sampling_params import SamplingParams


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

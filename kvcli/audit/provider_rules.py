"""--provider-rules FILE: per-model minimums and input prices that override the tables in the code.

The tables (profiles.ANTHROPIC_MINIMUMS, timing.INPUT_USD_PER_MTOK) carry their sources and the
date they were copied; providers change them. A rules file replaces or adds entries by model id
prefix (the longest matching prefix wins, a file's entry over the table's for the same prefix):

    {"as_of": "2026-11-01", "source": "platform.claude.com pricing page",
     "models": {"claude-sonnet-4-6": {"min_tokens": 2048, "input_usd_per_mtok": 3.0},
                "gpt-5.1": {"input_usd_per_mtok": 1.25},
                "gpt-5.7": {"breakpoints": true}}}

`breakpoints` (OpenAI profile): whether the model takes `prompt_cache_breakpoint` (the table,
profiles.OPENAI_BREAKPOINT_MODELS, has gpt-5.6; false takes a model prefix out again).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from kvcli.audit.profiles import Profile
from kvcli.audit.sources import InputError
from kvcli.audit.timing import INPUT_USD_PER_MTOK, PRICES_AS_OF

KEYS = ("min_tokens", "input_usd_per_mtok", "breakpoints")


def _number(where: str, value: Any, integer: bool) -> float:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < 0:
        raise InputError(f"{where}: expected a non-negative {'integer' if integer else 'number'}, got {value!r}")
    return value


def load_rules(path: str) -> dict[str, Any]:
    """The file, checked: every problem names the file and the field."""
    try:
        data = orjson.loads(Path(path).read_bytes())
    except OSError as err:
        raise InputError(f"--provider-rules {path}: {err.strerror or err}") from err
    except orjson.JSONDecodeError as err:
        raise InputError(f"--provider-rules {path}: invalid JSON: {err}") from err
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise InputError(f"{path}: models: expected an object of model id prefix -> rules")
    for prefix, rules in models.items():
        if not isinstance(rules, dict) or not rules or set(rules) - set(KEYS):
            raise InputError(f"{path}: models.{prefix}: expected an object with {' and/or '.join(KEYS)}")
        for key in rules:
            where = f"{path}: models.{prefix}.{key}"
            if key == "breakpoints":
                if not isinstance(rules[key], bool):
                    raise InputError(f"{where}: expected true or false, got {rules[key]!r}")
                continue
            rules[key] = _number(where, rules[key], key == "min_tokens")
    return {"as_of": str(data.get("as_of") or "?"), "source": str(data.get("source") or path), "models": models}


def with_rules(profile: Profile, rules: dict[str, Any]) -> Profile:
    """The profile with the file's minimums and prices over the code's tables."""
    models = rules["models"]
    minimums = dict(profile.model_min_tokens)
    minimums.update({p: int(r["min_tokens"]) for p, r in models.items() if "min_tokens" in r})
    prices = dict(profile.input_prices or INPUT_USD_PER_MTOK.get(profile.name, ()))
    prices.update({p: float(r["input_usd_per_mtok"]) for p, r in models.items() if "input_usd_per_mtok" in r})
    points = dict(profile.breakpoint_models)
    if profile.name == "openai":  # Anthropic's models all take cache_control
        points.update({p: r["breakpoints"] for p, r in models.items() if "breakpoints" in r})
    where = f"{rules['source']} (--provider-rules, as of {rules['as_of']})"
    return replace(profile, model_min_tokens=tuple(minimums.items()), input_prices=tuple(prices.items()),
                   breakpoint_models=tuple(points.items()),
                   prices_as_of=f"{PRICES_AS_OF} with {where}", source=f"{profile.source}; {where}")

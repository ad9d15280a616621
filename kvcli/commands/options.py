"""Engine options on the command line, derived from EngineConfig's fields, and back.

As vLLM's ``engine/arg_utils.py``: a command names the EngineConfig fields it takes, each
becomes the click option its field describes (kvcli/engine/config.py: type and default
from the field, ``--name``, help, metavar and choices from its ``Flag``), and
:func:`engine_config` turns the parsed values back into an ``EngineConfig``. So a flag,
its default and its help are written once, in the config, for every command.

Only click, the standard library and the torch-free config are imported (``kvcli --help``
builds these options); what a flag's check needs is imported when it runs.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from dataclasses import Field, fields
from typing import Any

import click

from kvcli.engine.config import EngineConfig, Flag

Decorator = Callable[[Any], Any]


def flag_fields(config: type) -> dict[str, Field[Any]]:
    """A settings dataclass's fields that are flags, in its order (their order in --help)."""
    return {f.name: f for f in fields(config) if "flag" in f.metadata}


ENGINE_FIELDS = flag_fields(EngineConfig)
ALL_ENGINE_OPTIONS = tuple(ENGINE_FIELDS)  # what generate and serve take


def size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """A SIZE such as 2GiB, in bytes (kvcli/batch/sizes.py)."""
    if value is None:
        return None
    from kvcli.batch.sizes import parse_size

    try:
        return parse_size(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def _cache_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a directory that is not a kvcli KV cache, or not one only this user can write,
    before the (slow) model load (``--kv-cache-dir-insecure`` is eager: already parsed)."""
    if not value:
        return None
    from kvcli.kvstore.directory import NotAKVCacheError, open_cache_dir
    from kvcli.kvstore.safety import check_trusted

    try:
        root = open_cache_dir(value)
        check_trusted(root, bool(ctx.params.get("kv_cache_dir_insecure")))
    except (NotAKVCacheError, OSError) as err:
        raise click.BadParameter(str(err)) from None
    return str(root)


def _chat_template(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """vLLM's --chat-template: a file's template, or the template itself on one line."""
    if value is None:
        return None
    from pathlib import Path

    path = Path(value)
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise click.BadParameter(f"cannot read {value}: {err}") from None
    if "{{" in value or "{%" in value:
        return value
    raise click.BadParameter(f"{value}: no such file (and not a template: no {{{{ or {{%)")


def _zero_is_none(ctx: click.Context, param: click.Parameter, value: float | None
                  ) -> float | None:
    return value or None  # 0: no limit


_PARSERS = {"size": size, "kv_cache_dir": _cache_dir, "chat_template": _chat_template,
            "zero_is_none": _zero_is_none}


_HINTS: dict[type, dict[str, Any]] = {}  # each settings class's evaluated annotations


def _value_type(config: type, name: str) -> type:
    """The field's type without its None (``int | None`` -> int)."""
    if config not in _HINTS:
        _HINTS[config] = typing.get_type_hints(config)
    hint = _HINTS[config][name]
    return next((a for a in typing.get_args(hint) if a is not type(None)), hint)


def _click_type(flag: Flag, kind: type) -> Any:
    if flag.parse == "size":
        return click.STRING  # the callback parses it
    if flag.choices:
        return click.Choice(flag.choices)
    if flag.min is not None and kind is int:
        return click.IntRange(min=int(flag.min), min_open=flag.min_open)
    if flag.min is not None:
        return click.FloatRange(min=flag.min, min_open=flag.min_open)
    return kind


def engine_option(name: str, note: str | None = None) -> Decorator:
    """The click option of EngineConfig field ``name``; ``note``: a sentence one command adds
    to its help."""
    return config_option(EngineConfig, name, note)


def config_option(config: type, name: str, note: str | None = None) -> Decorator:
    """The click option of field ``name`` of the settings dataclass ``config``."""
    f = flag_fields(config)[name]
    flag: Flag = f.metadata["flag"]
    kind = _value_type(config, name)
    kw: dict[str, Any] = {"help": " ".join(t for t in (flag.help, note) if t) or None,
                          "metavar": flag.metavar, "envvar": flag.envvar, "is_eager": flag.eager,
                          "callback": _PARSERS[flag.parse] if flag.parse else None}
    if kind is bool:  # a flag: given, the field is the opposite of its default
        kw.update(is_flag=True, flag_value=not f.default, default=f.default)
    else:
        kw.update(type=_click_type(flag, kind), default=f.default,
                  show_default=f.default is not None)
    return click.option(flag.name or "--" + name.replace("_", "-"), name, **kw)


def engine_options(*names: str, notes: Mapping[str, str] | None = None) -> Decorator:
    """The options of these EngineConfig fields, in this order in --help; ``notes``: a
    sentence this command adds to a field's help."""
    return config_options(EngineConfig, *names, notes=notes)


def config_options(config: type, *names: str, notes: Mapping[str, str] | None = None
                   ) -> Decorator:
    """The options of these fields of the settings dataclass ``config``, in this order."""
    options = [config_option(config, name, (notes or {}).get(name)) for name in names]

    def decorate(f: Any) -> Any:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def engine_config(params: Mapping[str, Any], **run: Any) -> EngineConfig:
    """The EngineConfig of a command's parsed params (its engine options; the others are
    ignored); ``run``: fields the command sets from options of its own (seed, quiet)."""
    given = {name: params[name] for name in ENGINE_FIELDS if name in params}
    return EngineConfig(**given, **run)

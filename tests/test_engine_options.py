"""Engine options are written once, in EngineConfig: every command's engine flags are derived
from its fields (kvcli/commands/options.py), parse back to the same EngineConfig, and LLM()
takes the same names (refusing others)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from kvcli.cli import main
from kvcli.commands.options import (
    ALL_ENGINE_OPTIONS,
    ENGINE_FIELDS,
    engine_config,
    engine_option,
    flag_fields,
)
from kvcli.engine.config import EngineConfig, make_engine_config

ROOT = Path(__file__).resolve().parent.parent
# The engine options each command takes (generate and serve: all of them).
COMMAND_OPTIONS = {
    "generate": set(ALL_ENGINE_OPTIONS),
    "serve": set(ALL_ENGINE_OPTIONS),
    "perplexity": {"model", "quantization", "max_num_batched_tokens", "precision", "dtype",
                   "kv_cache_dtype", "device"},
    "bench": {"model", "quantization", "max_num_batched_tokens", "precision", "dtype",
              "kv_cache_dtype"},
}


def _options(command: str) -> dict[str, click.Option]:
    return {p.name: p for p in main.commands[command].params if isinstance(p, click.Option)}


def _flag_names() -> dict[str, str]:
    return {engine_option(name)(lambda: None).__click_params__[0].opts[0]: name
            for name in ALL_ENGINE_OPTIONS}


@pytest.mark.parametrize("command", sorted(COMMAND_OPTIONS))
def test_every_engine_flag_is_derived_from_engine_config(command: str) -> None:
    options = _options(command)
    flags = _flag_names()
    # No command writes an engine flag of its own: each one it has is a derived option.
    taken = {flags[o] for p in options.values() for o in p.opts if o in flags}
    assert taken == COMMAND_OPTIONS[command]
    for name in taken:
        derived = engine_option(name)(lambda: None).__click_params__[0]
        got = options[name]
        field = ENGINE_FIELDS[name]
        assert got.opts == derived.opts and got.name == name
        expected_default = field.default
        assert got.default == expected_default == getattr(EngineConfig(), name)
        assert got.help is None or got.help.startswith(field.metadata["flag"].help or "")
        assert repr(got.type) == repr(derived.type) and got.metavar == derived.metavar


def test_a_default_changed_in_engine_config_changes_every_command() -> None:
    """One edit of a field's default reaches generate, serve, perplexity and bench."""
    code = """
import dataclasses, json
import kvcli.engine.config as config
for f in dataclasses.fields(config.EngineConfig):
    if f.name in ("max_num_batched_tokens", "model"):
        f.default = {"max_num_batched_tokens": 777, "model": "other-model"}[f.name]
from kvcli.cli import main
print(json.dumps({name: {p.name: p.default for p in cmd.params
                         if p.name in ("max_num_batched_tokens", "model")}
                  for name, cmd in main.commands.items()
                  if name in ("generate", "serve", "perplexity", "bench")}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    defaults = json.loads(out.stdout)
    assert defaults == {name: {"max_num_batched_tokens": 777, "model": "other-model"}
                        for name in ("generate", "serve", "perplexity", "bench")}


def _args(config: EngineConfig) -> list[str]:
    """The command line that asks for ``config`` (its fields that differ from the defaults)."""
    args: list[str] = []
    for name, field in ENGINE_FIELDS.items():
        value = getattr(config, name)
        if value == field.default:
            continue
        flag = field.metadata["flag"]
        option = flag.name or "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args.append(option)
        else:
            args += [option, "0" if value is None and flag.parse == "zero_is_none" else str(value)]
    return args


def _parse(command: str, args: list[str]) -> dict[str, Any]:
    with main.commands[command].make_context(command, args) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_parsed_options_round_trip_to_the_same_engine_config(command: str,
                                                             tmp_path: Path) -> None:
    every = EngineConfig(
        model=str(tmp_path), chat_template="{{ messages }}", block_size=4, num_blocks=9,
        kv_cache_memory=3 << 20, max_num_batched_tokens=99, max_num_seqs=3,
        enable_prefix_caching=False, scheduling="cache-aware", device="cuda:1", dtype="bfloat16",
        precision="fast", kv_cache_dtype="int8",
        allow_pickle=True, quantization="int8", kv_cache_dir=str(tmp_path / "kv"),
        kv_cache_dir_max_bytes=5 << 20, kv_cache_dir_insecure=True,
        structured_compile_timeout=None, seed=7, quiet=True)
    unchanged = [f.name for f in dataclasses.fields(EngineConfig)
                 if getattr(every, f.name) == f.default]
    assert unchanged == []  # a new field joins `every` here, so its flag is round-tripped too
    extra = ["x.jsonl"] if command == "generate" else []
    params = _parse(command, [*extra, *_args(every), "--seed", "7", "-q"])
    assert engine_config(params, seed=params["seed"], quiet=params["quiet"]) == every
    defaults = _parse(command, extra)
    assert engine_config(defaults, seed=defaults["seed"], quiet=defaults["quiet"]) == EngineConfig()


def test_perplexity_and_bench_take_their_subset_with_the_engine_defaults() -> None:
    params = _parse("perplexity", ["t.txt", "--dtype", "float16", "--quantization", "gguf"])
    assert engine_config(params) == EngineConfig(dtype="float16", quantization="gguf")
    bench = _parse("bench", ["--workload", "decode-1", "--compare", "none"])
    assert (bench["model"], bench["max_num_batched_tokens"]) == (
        EngineConfig().model, EngineConfig().max_num_batched_tokens)


def test_unknown_engine_options_are_refused_by_name() -> None:
    from kvcli import LLM

    with pytest.raises(TypeError, match=r"unknown engine option\(s\): 'blok_size' \(did you "
                                        r"mean 'block_size'\?\), 'colour'"):
        LLM("never-loaded", blok_size=4, colour="red")  # refused before any model is read
    assert make_engine_config(block_size=4) == EngineConfig(block_size=4)


def test_the_ray_flags_are_derived_from_ray_options() -> None:
    from kvcli.distributed.options import RayOptions

    options = _options("generate")
    ray_fields = flag_fields(RayOptions)
    assert list(ray_fields) == ["workers", "worker_cpus", "worker_gpus"]
    for name, field in ray_fields.items():
        assert options[name].default == field.default == getattr(RayOptions(), name)
        assert options[name].help == field.metadata["flag"].help
    params = _parse("generate", ["x.jsonl", "--worker-cpus", "2.5"])
    assert params["worker_cpus"] == 2.5 and params["workers"] is None
    with pytest.raises(click.BadParameter):
        _parse("generate", ["x.jsonl", "--worker-cpus", "0"])  # min_open: more than 0

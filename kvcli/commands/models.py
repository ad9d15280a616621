"""`kvcli models`: list the default and converted models; `kvcli models convert SPEC`."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click


def _human_size(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def _status_line(info: Any) -> str:
    if info.status == "converted":
        return f"converted at {info.path}"
    if info.status == "not installed":
        return f"not installed ({info.source})"
    return info.status


def _quantization(info: Any) -> list[str]:
    """--quantization modes for the model: gguf where a GGUF file is behind it (kvcli/model/quant)."""
    from pathlib import Path

    from kvcli.checkpoint.quant_modes import available_modes

    source = Path(info.source) if info.source and info.source.endswith(".gguf") else None
    return available_modes(Path(info.path) if info.path else None, source)


def _mode(info: Any) -> str | None:
    """What the model runs in under the default --quantization auto: "gguf" (the GGUF's own
    tensor types) for the default model where the gguf mode can run it, "none" (float) for
    conversions (kvcli/checkpoint/quant_modes.py); None for a model not installed."""
    from kvcli.checkpoint.quant_modes import auto_mode, spec_gguf

    if not info.default:
        return "none"
    gguf = spec_gguf(None)
    return None if gguf is None else auto_mode(gguf)


def _print_table(infos: list[Any]) -> None:
    rows = [("NAME", "SIZE", "MODE", "QUANTIZATION", "STATUS")]
    for info in infos:
        name = info.name + (" (default)" if info.default else "")
        mode = {"none": "float32", None: "-"}.get(_mode(info), _mode(info))
        rows.append((name, _human_size(info.size_bytes), mode, ",".join(_quantization(info)),
                     _status_line(info)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for name, size, mode, quant, status in rows:
        click.echo(f"{name:<{widths[0]}}  {size:>{widths[1]}}  {mode:<{widths[2]}}  "
                   f"{quant:<{widths[3]}}  {status}")


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.pass_context
def models(ctx: click.Context, as_json: bool) -> None:
    """List the default model and the models converted into $KVCLI_HOME.

    Every command that runs a model takes --model DIR|FILE.gguf|ORG/NAME|smollm2-135m:
    a local Hugging Face directory, a GGUF file (converted once into the cache), a
    Hugging Face repo id (from the local hub cache, downloaded when missing unless
    HF_HUB_OFFLINE=1), the default model, or any NAME this command lists.
    """
    if ctx.invoked_subcommand is not None:
        return
    from kvcli.checkpoint.resolve import SPEC_HELP, list_models
    from kvcli.model.registry import supported_architectures
    from kvcli.paths import kvcli_home

    infos = list_models()
    if as_json:
        listed = [{**asdict(info), "mode": _mode(info), "quantization": _quantization(info)}
                  for info in infos]
        payload = {"home": str(kvcli_home()), "models": listed,
                   "architectures": supported_architectures()}
        click.echo(json.dumps(payload, indent=2))
        return
    _print_table(infos)
    click.echo(f"\nCache: {kvcli_home()} (set KVCLI_HOME to move it).")
    click.echo(f"Choose a model for any command with {SPEC_HELP}, or a NAME listed above.")
    click.echo(f"Supported architectures: {', '.join(supported_architectures())}.")


@models.command("convert")
@click.argument("spec", required=False)
@click.option("--allow-pickle", is_flag=True, help="Accept PyTorch .bin (pickle) weights.")
@click.option("-q", "--quiet", is_flag=True, help="No conversion or download progress.")
def convert(spec: str | None, allow_pickle: bool, quiet: bool) -> None:
    """Resolve SPEC (default: smollm2-135m), converting a GGUF once; print its directory."""
    from kvcli.checkpoint.resolve import ModelResolveError
    from kvcli.model.gguf_convert import resolve_model

    try:
        path = resolve_model(spec, allow_pickle=allow_pickle, quiet=quiet)
    except ModelResolveError as err:
        raise click.ClickException(str(err)) from err
    click.echo(str(path))

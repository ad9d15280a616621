"""`kvcli cache stats|ls|prune|clear DIR`: inspect and trim a --kv-cache-dir (torch-free)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from kvcli.commands.options import size


def _open(path: str) -> Path:
    from kvcli.kvstore.directory import NotAKVCacheError, open_cache_dir

    try:
        return open_cache_dir(path, create=False)
    except NotAKVCacheError as err:
        raise click.ClickException(str(err)) from None


def _warn(message: str) -> None:
    """A record summarize skipped: said on stderr, the listing goes on."""
    click.echo(f"kvcli cache: warning: {message}", err=True)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _ago(t: float | None) -> str:
    if t is None:
        return "-"
    s = max(0.0, time.time() - t)
    for unit, width in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= width:
            return f"{s / width:.0f} {unit} ago"
    return f"{s:.0f} s ago"


_DIR = click.argument("directory", metavar="DIR")
_JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


@click.group()
def cache() -> None:
    """Inspect and trim a persistent prefix cache (kvcli generate --kv-cache-dir DIR)."""


@cache.command()
@_DIR
@_JSON
def stats(directory: str, as_json: bool) -> None:
    """Totals: models, blocks, bytes, hits and writes over all runs."""
    from kvcli.kvstore.inventory import summarize

    root = _open(directory)
    models = summarize(root, _warn)
    totals = {k: sum(getattr(m, k) for m in models)
              for k in ("blocks", "bytes", "runs", "hit_blocks", "written_blocks")}
    if as_json:
        click.echo(json.dumps({"dir": str(root), "models": len(models), **totals}))
        return
    click.echo(f"{root}: {len(models)} model(s), {totals['blocks']:,} blocks, "
               f"{_mb(totals['bytes'])}")
    click.echo(f"  {totals['runs']:,} runs read {totals['hit_blocks']:,} blocks and wrote "
               f"{totals['written_blocks']:,}")


@cache.command(name="ls")
@_DIR
@_JSON
def list_models(directory: str, as_json: bool) -> None:
    """One line per model fingerprint: what it is, how big, last use, hits."""
    from kvcli.kvstore.inventory import summarize

    models = summarize(_open(directory), _warn)
    if as_json:
        for m in models:
            click.echo(json.dumps(asdict(m)))
        return
    for m in models:
        d: dict[str, Any] = m.description
        kv = f" KV {d['kv_cache_dtype']}" if d.get("kv_cache_dtype") else ""  # int8, bfloat16
        click.echo(f"{m.fingerprint[:12]}  {m.label}  {d.get('dtype', '?')}{kv} "
                   f"block {d.get('block_size', '?')} on {d.get('device_type', '?')}  "
                   f"{m.blocks:,} blocks {_mb(m.bytes)}  used {_ago(m.last_use)}  "
                   f"{m.hit_blocks:,} hits in {m.runs:,} runs")


@cache.command()
@_DIR
@click.option("--max-bytes", callback=size, metavar="SIZE", required=True,
              help="Delete least recently used blocks until DIR holds at most SIZE.")
def prune(directory: str, max_bytes: int) -> None:
    """Delete least recently used blocks down to --max-bytes."""
    from kvcli.kvstore.directory import prune as prune_dir

    result = prune_dir(_open(directory), max_bytes, fraction=1.0)
    click.echo(f"removed {result.removed_files:,} blocks ({_mb(result.removed_bytes)}), "
               f"{_mb(result.kept_bytes)} kept")


@cache.command()
@_DIR
@click.option("--model", "prefix", default="", metavar="FINGERPRINT",
              help="Only this model's blocks (a prefix of the fingerprint `ls` shows).")
def clear(directory: str, prefix: str) -> None:
    """Delete every block (the directory stays a cache)."""
    from kvcli.kvstore.inventory import clear as clear_dir

    result = clear_dir(_open(directory), prefix)
    click.echo(f"removed {result.removed_files:,} blocks ({_mb(result.removed_bytes)})")

"""`kvcli serve`: the OpenAI Files + Batches API on a local model (the web stack is imported lazily).

Only click and the standard library are imported here, so `kvcli --help` never pays for
Starlette, uvicorn or torch; kvcli/server/ is imported when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kvcli.commands.generate import (  # the same options and derivation as generate's
    _SAMPLING_OPTIONS,
    _apply,
    _names,
    _sampling_defaults,
)
from kvcli.commands.options import ALL_ENGINE_OPTIONS, engine_config, engine_options, size

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> int | None:
    text = value.strip().lower()
    if text == "never" and param.name == "file_retention":
        return None
    unit = _DURATION_UNITS.get(text[-1:]) if text[-1:].isalpha() else 1
    number = text[:-1] if text[-1:].isalpha() else text
    if unit is None or not number.isdigit() or int(number) <= 0:
        raise click.BadParameter(f"expected a duration like 24h, 90m or 3600s, got {value!r}")
    return int(number) * unit


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback needs --api-key.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Files, results and the SQLite database (default: $KVCLI_HOME/serve).")
@click.option("--api-key", envvar="KVCLI_API_KEY",
              help="Clients must send `Authorization: Bearer KEY` (env KVCLI_API_KEY).")
@click.option("--served-model-name", "served_model_names", multiple=True, metavar="NAME",
              callback=_names,
              help="The model's id in /v1/models, which lines give as body.model (repeatable or "
                   "comma-separated, as for generate; the first is the one results report). "
                   "Default: --model.")
@click.option("--max-file-bytes", default="200MB", show_default=True, callback=size,
              metavar="SIZE", help="Largest upload (refused before it is stored).")
@click.option("--max-lines", type=click.IntRange(min=1), default=50_000, show_default=True,
              help="Most requests in one batch input file.")
@click.option("--expire-after", default="24h", show_default=True, callback=_duration,
              metavar="DURATION", help="A batch not finished this long after its creation "
                                       "expires (its unanswered requests get batch_expired).")
@click.option("--file-retention", default="30d", show_default=True, callback=_duration,
              metavar="DURATION|never", help="Uploads and results are deleted this long after "
                                             "their creation (OpenAI's default for batch files).")
@click.option("--max-pending", type=click.IntRange(min=1), default=256, show_default=True,
              help="Requests admitted to the engine at once.")
@click.option("--max-line-bytes", default="16MiB", show_default=True, callback=size,
              metavar="SIZE", help="Longer input lines fail validation.")
@click.option("-q", "--quiet", is_flag=True, help="No log lines (batch state changes, start-up).")
@_apply(_SAMPLING_OPTIONS)
@engine_options(*ALL_ENGINE_OPTIONS)
@click.pass_context
def serve(ctx: click.Context, **opts: Any) -> None:
    """Serve OpenAI's Batch API (Files, Batches, Models) on the loaded model.

    \b
    Point the official SDK at it:
      client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="...")
    Batches run one at a time, oldest first; a server killed and restarted on the same
    --data-dir resumes them, each request answered exactly once.
    """
    from kvcli.server.auth import is_loopback

    if not opts["api_key"] and not is_loopback(opts["host"]):
        raise click.UsageError(f"--host {opts['host']} is not loopback: give --api-key "
                               "(or KVCLI_API_KEY) so only your clients can use the server")
    from kvcli.batch.config import GenerateConfig
    from kvcli.paths import kvcli_home
    from kvcli.server.main import ServeConfig, ServeError, run_server

    gen = GenerateConfig(input="-", max_pending=opts["max_pending"],
                         max_line_bytes=opts["max_line_bytes"], quiet=opts["quiet"],
                         sampling=_sampling_defaults(opts), seed=opts["seed"],
                         clamp_max_tokens=opts["clamp_max_tokens"],
                         engine=engine_config(opts, seed=opts["seed"], quiet=opts["quiet"]),
                         served_model_names=opts["served_model_names"])
    cfg = ServeConfig(
        host=opts["host"], port=opts["port"],
        data_dir=opts["data_dir"] or kvcli_home() / "serve", api_key=opts["api_key"] or None,
        model_names=gen.model_names,
        max_file_bytes=opts["max_file_bytes"], max_lines=opts["max_lines"],
        expire_after_s=opts["expire_after"], file_retention_s=opts["file_retention"],
        quiet=opts["quiet"], generate=gen)
    try:
        ctx.exit(run_server(cfg))
    except ServeError as err:
        click.echo(f"kvcli serve: {err}", err=True)
        ctx.exit(2)

"""`kvcli generate`: run a JSONL batch through the engine, one JSON result line per request.

Only click and the standard library are imported here; the batch layer and the
engine (torch) are imported when the command runs, so `kvcli --help` stays fast.
"""

from __future__ import annotations

from typing import Any

import click

from kvcli.commands.options import (
    ALL_ENGINE_OPTIONS,
    config_options,
    engine_config,
    engine_options,
    size,
)
from kvcli.distributed.options import RayOptions  # Ray-free: the settings only

EXIT_INTERRUPTED = 130


def _names(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
           ) -> tuple[str, ...]:
    names = tuple(n.strip() for v in value for n in v.split(","))
    if any(not n for n in names):
        raise click.BadParameter("expected non-empty names, e.g. gpt-4o-mini,my-model")
    return names


_JOB_OPTIONS = [
    click.option("-o", "--output", metavar="FILE",
                 help="Write results here (default: stdout). Refuses to replace a non-empty "
                      "file unless --resume or --overwrite."),
    click.option("--resume", is_flag=True,
                 help="Skip requests whose id is already in -o FILE and append the rest."),
    click.option("--overwrite", is_flag=True, help="Replace -o FILE if it has results."),
    click.option("--ordered", is_flag=True,
                 help="Write results in input order (still streamed) instead of as they finish."),
    click.option("--input-order", type=click.Choice(["given", "prefix"]), default="given",
                 show_default=True,
                 help="prefix: read the file twice and run it grouped by shared prompt prefix "
                      "(the whole file, not only the --max-pending window); --ordered still "
                      "writes in input order."),
    click.option("--token-ids", is_flag=True,
                 help="Add token_ids (completion) and prompt_token_ids to each result."),
    click.option("--deterministic-ids", is_flag=True,
                 help="OpenAI Batch lines get ids derived from custom_id + prompt instead of "
                      "random ones, and created = $SOURCE_DATE_EPOCH (else 0): the same input "
                      "and seeds give byte-identical files."),
    click.option("--strict", is_flag=True,
                 help="A line's unknown field, or a \"model\" other than the loaded one "
                      "(--served-model-name), is that line's error (vLLM refuses both)."),
    click.option("--served-model-name", "served_model_names", multiple=True, metavar="NAME",
                 callback=_names,
                 help="A name lines may give as \"model\" for the loaded model (repeatable or "
                      "comma-separated; the first is the name results report). Default: --model."),
    click.option("--reasoning-parser", type=click.Choice(["auto", "none", "qwen3", "deepseek_r1"]),
                 default="auto", show_default=True,
                 help="Split a reasoning model's <think>...</think> from the answer of chat "
                      "lines (message.reasoning_content and .reasoning). auto: from the chat "
                      "template (Qwen3, DeepSeek-R1 and its distills, any <think> template); "
                      "none: replies as written."),
    click.option("--debug", is_flag=True,
                 help="Print the full traceback when a line fails on an unexpected error."),
    click.option("--fail-fast", is_flag=True, help="Stop at the first failed request."),
    click.option("--max-pending", type=click.IntRange(min=1), default=256, show_default=True,
                 help="Requests admitted to the engine (or awaiting output) at once."),
    click.option("--max-line-bytes", default="16MiB", show_default=True, callback=size,
                 metavar="SIZE", help="Longer input lines are skipped with an error result."),
    click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary."),
    click.option("--progress", is_flag=True,
                 help="Show the progress bar even when stderr is not a terminal."),
    click.option("--stats", "stats_path", metavar="FILE", help="Write the run summary as JSON."),
]

_SAMPLING_OPTIONS = [
    click.option("--max-tokens", type=int, default=256, show_default=True,
                 help="Default max new tokens of a line without max_tokens (capped at what "
                      "its prompt leaves of the context)."),
    click.option("--clamp-max-tokens", is_flag=True,
                 help="A line's max_tokens past the model's context is capped at the context "
                      "instead of being that line's error."),
    click.option("--temperature", type=float, default=0.0, show_default=True,
                 help="Default temperature (0 = greedy)."),
    click.option("--top-p", type=float, default=1.0, show_default=True),
    click.option("--top-k", type=int, default=0, show_default=True, help="0 = off."),
    click.option("--min-p", type=float, default=0.0, show_default=True),
    click.option("--repetition-penalty", type=float, default=1.0, show_default=True),
    click.option("--stop", multiple=True, metavar="TEXT", help="Default stop string (repeatable)."),
    click.option("--ignore-eos", is_flag=True, help="Do not stop at end-of-sequence tokens."),
    click.option("--seed", type=click.IntRange(-(1 << 63), (1 << 63) - 1), default=0,
                 show_default=True,
                 help="Run seed: a request without a seed samples from one derived from this "
                      "and its id, so reruns and resumed runs give the same text."),
]

_RAY_OPTIONS = [
    click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
                 metavar="[ADDRESS]",
                 help="Run on a Ray cluster: ADDRESS as Ray takes it (auto, HOST:6379, "
                      "ray://HOST:10001); alone, or 'local', start a local Ray instance. "
                      "Put INPUT before it. Needs: pip install 'kvcli[ray]'."),
    config_options(RayOptions, "workers", "worker_cpus", "worker_gpus"),
]


def _apply(options: list[Any]) -> Any:
    def decorate(f: Any) -> Any:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


@click.command()
@click.argument("input_paths", metavar="INPUT...", nargs=-1, required=True)
@_apply(_JOB_OPTIONS)
@_apply(_SAMPLING_OPTIONS)
@engine_options(*ALL_ENGINE_OPTIONS)
@_apply(_RAY_OPTIONS)
@click.pass_context
def generate(ctx: click.Context, input_paths: tuple[str, ...], **opts: Any) -> None:
    """Generate a completion for every request in the JSONL file INPUT (- for stdin).

    Several INPUT files are read as one input, in order (as `cat` would join them):
    line-<N> ids count across them, messages name each file and its own line.

    \b
    Input lines (one JSON object each):
      {"id": "q1", "prompt": "..."}            plain text (BOS added)
      {"messages": [{"role": ..., "content": ...}], "tools": [...]}   chat template
      {"prompt_token_ids": [1, 2, 3]}
      {"custom_id": ..., "method": "POST", "url": "/v1/chat/completions", "body": {...}}
    Any SamplingParams field (max_tokens, temperature, seed, stop, n, logprobs...) and
    cache_salt may be set per line; flags give the defaults. A plain line without an id
    gets "line-<N>" (its 1-based line number); an OpenAI Batch line needs its custom_id.

    \b
    Exit status: 0 all ok (or no request lines), 1 some requests failed, 2 bad usage or
    unreadable input, 130/143 interrupted (SIGINT/SIGTERM; continue with --resume),
    141 broken pipe.
    """
    from kvcli.batch.run import GenerateConfig, run_generate

    cfg = GenerateConfig(
        input=input_paths[0], more_inputs=input_paths[1:], output=opts["output"],
        resume=opts["resume"],
        overwrite=opts["overwrite"], ordered=opts["ordered"], token_ids=opts["token_ids"],
        deterministic_ids=opts["deterministic_ids"],
        input_order=opts["input_order"],
        strict=opts["strict"], fail_fast=opts["fail_fast"], max_pending=opts["max_pending"],
        max_line_bytes=opts["max_line_bytes"], quiet=opts["quiet"], progress=opts["progress"],
        stats_path=opts["stats_path"], sampling=_sampling_defaults(opts), seed=opts["seed"],
        clamp_max_tokens=opts["clamp_max_tokens"],
        engine=engine_config(opts, seed=opts["seed"], quiet=opts["quiet"]),
        served_model_names=opts["served_model_names"], debug=opts["debug"],
        reasoning_parser=opts["reasoning_parser"],
    )
    try:
        if opts["ray_address"] is None:
            _refuse_ray_options_without_ray(ctx)
            code = run_generate(cfg)
        else:
            from kvcli import startup

            startup.release()  # Ray starts processes of its own and handles Ctrl-C itself
            code = _run_on_ray(cfg, opts)
    except KeyboardInterrupt:  # a second Ctrl-C: stop without waiting for the engine step
        code = EXIT_INTERRUPTED
    ctx.exit(code)


def _refuse_ray_options_without_ray(ctx: click.Context) -> None:
    for name in ("workers", "worker_cpus", "worker_gpus"):
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError(f"--{name.replace('_', '-')} needs --ray")


def _run_on_ray(cfg: Any, opts: dict[str, Any]) -> int:
    """``--ray``: the same job over Ray actors; Ray is imported only here (an optional extra)."""
    from kvcli.distributed.options import RayMissingError, require_ray

    try:
        require_ray()
    except RayMissingError as err:
        raise click.UsageError(str(err)) from None
    from kvcli.distributed.run import run_generate_on_ray

    ray_opts = RayOptions(address=opts["ray_address"], workers=opts["workers"],
                          worker_cpus=opts["worker_cpus"], worker_gpus=opts["worker_gpus"])
    return run_generate_on_ray(cfg, ray_opts)


def _sampling_defaults(opts: dict[str, Any]) -> Any:
    from kvcli.sampling_params import SamplingParams

    params = SamplingParams(
        max_tokens=opts["max_tokens"], temperature=opts["temperature"], top_p=opts["top_p"],
        top_k=opts["top_k"], min_p=opts["min_p"], repetition_penalty=opts["repetition_penalty"],
        stop=list(opts["stop"]), ignore_eos=opts["ignore_eos"],
    )
    try:
        params.validate()
    except ValueError as err:
        name, _, reason = str(err).partition(": ")
        raise click.UsageError(f"--{name.replace('_', '-')}: {reason}") from None
    return params

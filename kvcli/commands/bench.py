"""`kvcli bench`: kvcli against transformers on synthetic workloads, same token ids.

Only click and the standard library are imported here; kvcli.bench (torch,
transformers) is imported when the command runs.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from kvcli.commands.options import engine_options

WORKLOAD_CHOICES = ("shared-prefix", "chat-sessions", "distinct", "decode-1", "all")


def _compare(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    from kvcli.bench.suite import parse_compare  # torch-free

    try:
        return parse_compare(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


@click.command()
@click.option("--workload", "workloads", multiple=True,
              type=click.Choice(WORKLOAD_CHOICES),
              help="Workload to run (repeatable; 'all' runs every one). Required unless --calibrate.")
@click.option("--calibrate", is_flag=True,
              help="Measure this machine's prefill and decode rate for --model and --dtype and store "
                   "it (under $KVCLI_HOME/calibration): `kvcli audit --model` then states time saved.")
@engine_options("model", "quantization", "dtype",
                notes={"quantization": "Here: kvcli's own row's weights (none: float32).",
                       "dtype": "For kvcli's own row (the reference; --compare kvcli-bf16 is a "
                                "row of its own) and the dtype --calibrate measures "
                                "(default float32)."})
@click.option("--compare", default="hf-generate", show_default=True, callback=_compare,
              help="Comma-separated peers: hf-generate, hf-generate-batch, kvcli-no-cache, "
                   "vllm, openvino (float32 forced), openvino-default, openvino-int8, "
                   "openvino-int4 (OpenVINO's own CPU defaults on its fp32 / int8 / int4 "
                   "weight exports), llamacpp (llama-server on the same GGUF), kvcli-gguf, "
                   "kvcli-gguf-int, kvcli-int8 "
                   "(kvcli on quantized weights), kvcli-bf16, kvcli-fast (kvcli at --dtype "
                   "bfloat16 / --precision fast), kvcli-int8kv, kvcli-bf16kv (kvcli with an "
                   "int8 / bfloat16 KV cache): the inexact ones' greedy agreement with kvcli "
                   "is reported ('none' for kvcli alone).")
@click.option("--llamacpp-server", type=click.Path(dir_okay=False, path_type=Path),
              envvar="KVCLI_LLAMACPP_SERVER",
              help="--compare llamacpp: a llama-server binary (scripts/build_llama_server.sh "
                   "builds one; env KVCLI_LLAMACPP_SERVER).")
@click.option("--vllm-python", type=click.Path(dir_okay=False, path_type=Path),
              envvar="KVCLI_VLLM_PYTHON",
              help="--compare vllm: the python of a venv with vLLM's CPU backend "
                   "(env KVCLI_VLLM_PYTHON).")
@click.option("--openvino-python", type=click.Path(dir_okay=False, path_type=Path),
              envvar="KVCLI_OPENVINO_PYTHON",
              help="--compare openvino*: the python of a venv with openvino-genai and "
                   "optimum-intel (env KVCLI_OPENVINO_PYTHON).")
@click.option("--num-prompts", type=click.IntRange(min=1),
              help="Requests per workload (default: shared-prefix 32, chat-sessions 16, "
                   "distinct 32; decode-1 is always 1).")
@click.option("--max-tokens", type=click.IntRange(min=1),
              help="New tokens per request (default: the workload's, 32-128).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Alternating timed runs per system; best and median are reported.")
@click.option("--seed", type=int, default=0, show_default=True, help="Workload text seed.")
@click.option("--scale", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="Multiply the workload's prompt lengths (smoke tests).")
@click.option("--threads", type=click.IntRange(min=1),
              help="torch threads for every system (default: torch's, from OMP_NUM_THREADS).")
@click.option("--hf-batch-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="hf-generate: prompts per padded generate() call.")
@click.option("--hf-page-size", type=click.IntRange(min=4), default=32, show_default=True,
              help="hf-generate-batch: tokens per page of its paged cache.")
@engine_options("max_num_batched_tokens", "precision", "kv_cache_dtype",
                notes={"max_num_batched_tokens": "Also hf-generate-batch's.",
                       "precision": "For kvcli's own row, the reference the others are "
                                    "compared with; --compare kvcli-fast measures fast against "
                                    "kvcli's float32 in the same run instead.",
                       "kv_cache_dtype": "For kvcli's own row too (--compare kvcli-int8kv, "
                                         "kvcli-bf16kv run those beside it in the same run)."})
@click.option("--isolate/--no-isolate", default=None,
              help="Run kvcli's row and each kvcli-* row in a process of its own, as the "
                   "peers run, so its peak RSS is that engine's alone (default: on when "
                   "--compare names a kvcli-* row). Load stays untimed and every run starts "
                   "from an empty prefix cache either way; --no-isolate loads them all in the "
                   "bench's process, whose peak RSS they then share.")
@click.option("--no-warmup", is_flag=True, help="Skip the untimed warm-up run of each system.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a bar chart of output tokens/s (needs matplotlib).")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@click.pass_context
def bench(ctx: click.Context, workloads: tuple[str, ...], compare: list[str], as_json: bool,
          plot_path: Path | None, quiet: bool, no_warmup: bool, calibrate: bool, dtype: str | None,
          **opts: Any) -> None:
    """Time kvcli and its peers on the same prompts (same token ids), greedy, EOS ignored.

    \b
    Workloads (deterministic from --seed, rendered with the model's chat template):
      shared-prefix  one ~400-token system prompt + distinct ~40-token questions, 32 new
      chat-sessions  append-only conversations (4 turns each), 32 new
      distinct       unrelated prompts of 50-500 tokens, 64 new
      decode-1       one short prompt, 128 new
    Progress goes to stderr; the table (or --json) to stdout. Exit status: 0 ok,
    1 a system failed, 2 bad usage.

    --calibrate measures kvcli alone (prefill and decode tokens/s, no prefix cache) once per
    model, CPU and dtype, and stores it for `kvcli audit`.
    """
    from kvcli.bench.suite import OPENVINO_PEERS, BenchConfig, expand_workloads

    if calibrate:
        _calibrate(ctx, workloads, dtype or "float32", as_json, quiet, opts)
        return
    if not workloads:
        raise click.UsageError("give --workload NAME (or --calibrate)")

    if plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise click.UsageError("--plot needs matplotlib: pip install 'kvcli[bench]' "
                               "(or pip install matplotlib)")
    if "vllm" in compare and opts.get("vllm_python") is None:
        from kvcli.bench.vllm_system import INSTALL_HINT

        raise click.UsageError(f"--compare vllm needs --vllm-python PATH; {INSTALL_HINT}")
    openvino = [name for name in compare if name in OPENVINO_PEERS]
    if openvino and opts.get("openvino_python") is None:
        from kvcli.bench.openvino_system import INSTALL_HINT as OPENVINO_HINT

        raise click.UsageError(f"--compare {openvino[0]} needs --openvino-python PATH; "
                               f"{OPENVINO_HINT}")
    if "llamacpp" in compare and opts.get("llamacpp_server") is None:
        from kvcli.bench.llamacpp_system import INSTALL_HINT as LLAMACPP_HINT

        raise click.UsageError(f"--compare llamacpp needs --llamacpp-server PATH; {LLAMACPP_HINT}")
    cfg = BenchConfig(workloads=expand_workloads(list(workloads)), compare=compare,
                      warmup=not no_warmup, dtype=dtype, **opts)
    report = _run(cfg, quiet)
    _emit(report, as_json, plot_path)


# Options --calibrate reads; any other given with it is an error, never silently ignored.
CALIBRATE_READS = {"model", "threads", "num_prompts", "max_tokens", "seed", "scale"}


def _calibrate(ctx: click.Context, workloads: tuple[str, ...], dtype: str, as_json: bool, quiet: bool,
               opts: dict[str, Any]) -> None:
    from kvcli.bench.calibrate import PROMPT_TOKENS, CalibrateConfig, calibrate
    from kvcli.calibration import save_calibration
    from kvcli.checkpoint.resolve import ModelResolveError

    given = {p.name for p in ctx.command.params
             if p.name and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE}
    extra = sorted(given - CALIBRATE_READS - {"calibrate", "dtype", "as_json", "quiet"})
    if workloads or extra:
        names = ", ".join("--" + n.replace("_", "-") for n in (["workload"] if workloads else []) + extra)
        raise click.UsageError(f"--calibrate measures kvcli alone: {names} not read with it")
    cfg = CalibrateConfig(model=opts["model"], dtype=dtype, threads=opts["threads"], seed=opts["seed"],
                          prompt_tokens=max(2, round(PROMPT_TOKENS * opts["scale"])))
    if opts["num_prompts"]:
        cfg.prompts = opts["num_prompts"]
    if opts["max_tokens"]:
        cfg.decode_tokens = opts["max_tokens"]
    try:
        cal = calibrate(cfg, lambda m: None if quiet else click.echo(m, err=True))
    except (ModelResolveError, ValueError) as err:
        raise click.UsageError(str(err)) from None
    path = save_calibration(cal)
    if as_json:
        click.echo(json.dumps({**asdict(cal), "path": str(path)}, indent=2))
        return
    click.echo(f"{Path(cal.model).name} ({cal.dtype}) on {cal.cpu}: prefill {cal.prefill_tok_s:,.1f} tokens/s "
               f"({cfg.prompts} prompts of {cal.prompt_tokens} tokens), decode {cal.decode_tok_s:,.2f} tokens/s; "
               f"stored in {path}")


def _run(cfg: Any, quiet: bool) -> dict[str, Any]:
    from kvcli.bench.suite import run_bench
    from kvcli.bench.workloads import BenchConfigError
    from kvcli.checkpoint.resolve import ModelResolveError

    def progress(message: str) -> None:
        if not quiet:
            click.echo(message, err=True)

    try:
        return run_bench(cfg, progress)
    except (ModelResolveError, BenchConfigError) as err:
        raise click.UsageError(str(err)) from None
    except RuntimeError as err:  # includes PeerUnavailable (vllm, openvino)
        raise click.ClickException(str(err)) from None


def _emit(report: dict[str, Any], as_json: bool, plot_path: Path | None) -> None:
    from kvcli.bench.report import documents, format_table, write_plot

    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo("\n\n".join(format_table(doc) for doc in documents(report)))
    if plot_path is not None:
        try:
            write_plot(report, plot_path)
        except RuntimeError as err:
            raise click.ClickException(str(err)) from None
        click.echo(f"wrote {plot_path}", err=True)

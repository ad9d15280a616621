"""`kvcli perplexity FILE`: a model's perplexity on a text, as llama.cpp's llama-perplexity.

Only click and the standard library are imported here; the engine (torch) is imported
when the command runs.
"""

from __future__ import annotations

import json
from typing import Any

import click

from kvcli.commands.options import engine_config, engine_options
from kvcli.engine import engine_class


@click.command()
@click.argument("text_file", metavar="FILE")
@engine_options("model", "quantization")
@click.option("--context", type=click.IntRange(min=4), default=512, show_default=True,
              help="Tokens per window; the second half of each window is scored.")
@engine_options("max_num_batched_tokens", "precision", "dtype", "kv_cache_dtype", "device")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def perplexity(text_file: str, as_json: bool, **opts: Any) -> None:
    """Perplexity of a model on the UTF-8 text in FILE.

    \b
    The text's tokens are cut into non-overlapping windows of --context tokens (a shorter
    tail is dropped); in each window the tokens after its first half are scored from the
    engine's own logits (float32 log-softmax). PPL = exp(mean negative log-likelihood);
    "+/-" is one standard error, as llama.cpp prints it. Exit status: 0 ok, 1 the text
    cannot be scored, 2 bad usage or an unreadable file.
    """
    from kvcli.bench.perplexity import PerplexityError, read_text

    try:
        text = read_text(text_file)
    except PerplexityError as err:
        raise click.UsageError(str(err)) from None
    try:
        result, mode, precision, kv = _measure(text, opts)
    except PerplexityError as err:
        raise click.ClickException(str(err)) from None
    doc = {"file": text_file, "model": opts["model"], "quantization": mode or "none",
           "precision": precision, "kv_cache_dtype": kv,
           **result.to_dict()}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"{text_file}: {doc['text_tokens']} tokens, {doc['windows']} windows of "
               f"{doc['context']}, {doc['tokens_scored']} scored in {doc['seconds']:.1f} s")
    click.echo(f"PPL = {doc['ppl']:.4f} +/- {doc['ppl_error']:.5f}  "
               f"(model {doc['model']}, quantization {doc['quantization']}, "
               f"{doc['precision']}, KV cache {doc['kv_cache_dtype']})")


def _measure(text: str, opts: dict[str, Any]) -> tuple[Any, str | None, str, str]:
    """The perplexity, the weights that ran (``auto`` resolved: gguf, int8 or None), the
    precision the engine ran at (Backend.precision_label) and its KV cache (auto, or the one
    the preset chose)."""
    LLMEngine = engine_class()  # before anything imports torch: as `kvcli generate` imports it
    from kvcli.bench.perplexity import perplexity

    try:
        engine = LLMEngine.from_config(engine_config(opts))
    except (OSError, ValueError) as err:  # as generate: a model it cannot use is exit 2
        raise click.UsageError(f"cannot load model {opts['model']!r}: {err}") from None
    return (perplexity(engine, text, opts["context"]), engine.config.quantization,
            engine.runner.backend.precision_label, engine.config.kv_cache_dtype)

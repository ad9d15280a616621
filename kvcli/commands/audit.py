"""`kvcli audit PATH...`: why prompts miss the prefix cache, and exactly where.

Only click and the standard library are imported here; the audit itself
(kvcli.audit) is imported when the command runs, and never imports torch.
"""

from __future__ import annotations

from pathlib import Path

import click

from kvcli.audit.profiles import PROFILES  # data only (the package resolves the rest lazily)
from kvcli.engine.config import QUANTIZATIONS  # torch-free (built for --help)

ENCODING_NAMES = ("o200k_base", "cl100k_base")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, metavar="PATH...")
@click.option(
    "--profile",
    type=click.Choice(tuple(PROFILES)),
    default="kvcli",
    show_default=True,
    help="Cache rules: this engine, vLLM (the same block rule), SGLang (token-granular radix tree), "
    "llama.cpp (per-slot longest common prefix), "
    "OpenAI (1024-token minimum, 128-token steps) or Anthropic (breakpoints).",
)
@click.option(
    "--tokenizer",
    "encoding",
    type=click.Choice(ENCODING_NAMES),
    default="o200k_base",
    show_default=True,
    help="tiktoken encoding (offline) when --model is not given.",
)
@click.option(
    "--model",
    metavar="DIR|NAME",
    default=None,
    help="Use this model's tokenizer and chat template: predicts what `kvcli generate` reuses.",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    default=None,
    help="Block size in tokens [default: the profile's; kvcli: 16].",
)
@click.option(
    "--min-tokens",
    type=click.IntRange(min=0),
    default=None,
    help="Override the profile's minimum cacheable prefix.",
)
@click.option(
    "--slots",
    type=click.IntRange(min=1),
    default=None,
    help="llamacpp profile: llama-server's parallel slots (-np) [default: 1].",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(("text", "json", "jsonl")),
    default="text",
    show_default=True,
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write a self-contained HTML report to this file.",
)
@click.option(
    "--show-blocks",
    is_flag=True,
    help="List each prompt's block chain: hash, token range, hit/miss.",
)
@click.option(
    "--diff",
    nargs=2,
    metavar="A B",
    default=None,
    help="Compare two prompts side by side: two files, or the ids (or 0-based indexes) of two prompts in PATH.",
)
@click.option(
    "--fail-on",
    type=click.Choice(("error", "warning", "info", "never")),
    default="error",
    show_default=True,
    help="Exit 1 when a finding at or above this severity exists.",
)
@click.option("--strict", is_flag=True, help="Stop with exit 2 at the first malformed record.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Findings shown per rule in the text report.",
)
@click.option(
    "--cache-size",
    metavar="SIZE",
    default=None,
    help="Replay through kvcli's block pool of this size: tokens (8192), blocks (512blocks), or bytes "
    "with --model (1GiB, the model's KV layout). Adds the hit rate there and the capacity curve.",
)
@click.option(
    "--kv-cache-dir",
    metavar="DIR",
    default=None,
    help="Blocks a `kvcli generate --kv-cache-dir DIR` run left on disk count as hits (needs --model).",
)
@click.option(
    "--quantization",
    type=click.Choice(QUANTIZATIONS),
    default="auto",
    show_default=True,
    help="The generate run's --quantization: with --kv-cache-dir the blocks are keyed by it (and "
    "with --model, auto reads a GGUF's tokenizer without converting it).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Prompts in flight during the --cache-size replay (running prompts pin their blocks) [default: 1].",
)
@click.option(
    "--time-field",
    metavar="NAME",
    default=None,
    help="The request time field (Unix seconds or ISO 8601; a.b for nested) [default: created, else timestamp].",
)
@click.option(
    "--cache-ttl",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds a cached prefix lives after its last use, for timed requests [default: the provider's: "
    "openai 300, anthropic 300; engines: none].",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default="float32",
    show_default=True,
    help="With --model: the `kvcli generate --dtype` the KV cache is allocated in (sizes in bytes, "
    "the default pool, --kv-cache-dir's key).",
)
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16", "int8"]),
    default="auto",
    show_default=True,
    help="With --model: the `kvcli generate --kv-cache-dtype` (auto: --dtype); int8 counts each token's "
    "codes plus their float32 scale and zero point per layer and KV head.",
)
@click.option(
    "--responses",
    metavar="FILE",
    default=None,
    help="A batch output file (OpenAI or Anthropic) joined with PATH by custom_id: the provider's actual "
    "cached tokens beside the prediction.",
)
@click.option(
    "--provider-rules",
    metavar="FILE",
    default=None,
    help="JSON of per-model minimum cacheable tokens and input prices over the built-in tables "
    '({"as_of", "source", "models": {PREFIX: {"min_tokens", "input_usd_per_mtok"}}}).',
)
@click.option(
    "--prefill-tok-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="RATE",
    help="Prefill tokens per second of the target (an estimate): the report gives the prefill time the cache saves.",
)
@click.option(
    "--fix",
    metavar="OUT",
    default=None,
    help="Write PATH (one JSONL file) to OUT with the fixes that keep the meaning (--fix-rules), each "
    "re-simulated and kept only when the replay gets no worse; lists every change by line and field.",
)
@click.option(
    "--fix-rules",
    metavar="RULES",
    default=None,
    help="Comma-separated: json, tools, whitespace (the default: canonicalisations) and volatile "
    "(opt-in: moves timestamps/ids from the system text to the end of the last message); or all.",
)
@click.option(
    "--trace-block-size",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="PATH is a hash-id trace ({timestamp, input_length, output_length, hash_ids} lines, one id per "
    "N-token block: Mooncake 512, Alibaba Bailian 16): replay it through the same cache models.",
)
@click.option(
    "--trace-time-unit",
    type=click.Choice(("ms", "s")),
    default="ms",
    show_default=True,
    help="The trace's timestamp unit (Mooncake: ms since the first request).",
)
@click.option(
    "--write-baseline",
    metavar="FILE",
    default=None,
    help="Record each prompt's stable prefix (system, tools, schema) as block hashes, per prompt id.",
)
@click.option(
    "--baseline",
    metavar="FILE",
    default=None,
    help="Exit 1 when a prompt's stable prefix moved since --write-baseline FILE (names the block and why).",
)
@click.option(
    "--color/--no-color",
    default=None,
    help="Color the text report [default: when stdout is a terminal].",
)
@click.pass_context
def audit(ctx: click.Context, **options: object) -> None:
    """Audit prompts for prefix-cache misses: where each prompt leaves the longest
    prefix seen before, why (rules with fixes), and the hit rate a cache would get.

    PATH is a JSONL/JSON file of requests ({"prompt"}, chat {"messages", "tools"},
    or OpenAI Batch API lines), a .txt/.md prompt, a directory of those, or - for stdin.
    Exit status: 0 clean, 1 findings at or above --fail-on, 2 bad usage or unreadable input.
    """
    from kvcli.audit.command import AuditOptions, run_audit

    ctx.exit(run_audit(AuditOptions(**options, write_tensors=_write_tensors)))  # type: ignore[arg-type]


def _write_tensors(gguf_path: Path, out: Path) -> None:
    """A GGUF --model not yet converted is converted as generate would (the one torch step)."""
    from kvcli.model.gguf_convert import write_hf_checkpoint

    write_hf_checkpoint(gguf_path, out)

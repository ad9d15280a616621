"""Every engine option, written once: its type, default and command-line flag (torch-free).

:class:`EngineConfig` is the one source of truth. A field whose metadata holds a
:class:`Flag` is an engine option on the command line: kvcli/commands/options.py derives
the click option from the field (name ``--field-name``, type and default from the field,
help text, metavar and choices from the flag, as vLLM's ``engine/arg_utils.py`` does) and
turns the parsed values back into an ``EngineConfig``; ``LLM()`` takes the same fields as
keyword arguments. A new engine option is one field here (see docs/ARCHITECTURE.md).

Only the standard library and ``kvcli.paths`` are imported: ``kvcli --help`` reads this
module to build its options.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from kvcli.paths import DEFAULT_MODEL_NAME

DEFAULT_KV_CACHE_MEMORY = 1 << 30  # 1 GiB
MAX_DEFAULT_BLOCKS = 32768
DTYPES = ("float32", "bfloat16", "float16")
DTYPE_CHOICES = (*DTYPES, "auto")  # auto: the checkpoint's dtype where it is fast here
PRECISIONS = ("exact", "fast")
QUANTIZATIONS = ("auto", "none", "int8", "gguf", "gguf-int")  # = quant_modes.py's CHOICES
# auto: what the model computes in; int8: kvcli/model/attention/native_int8.py (kv_cache.py)
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")
SCHEDULINGS = ("fcfs", "cache-aware")


@dataclass(frozen=True, slots=True)
class Flag:
    """How a field is given on the command line; the rest (type, default) is the field's.
    (The settings of ``--ray``, kvcli/distributed/options.py, use it too.)"""

    help: str | None = None
    name: str | None = None  # default: --field-name; a bool's flag sets the opposite of its default
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    min: float | None = None  # the lowest value a number may take
    min_open: bool = False  # ... but not min itself
    # "size": a SIZE such as 2GiB; "kv_cache_dir", "chat_template": checked or read at parse
    # time; "zero_is_none": 0 means no limit (None). kvcli/commands/options.py implements each.
    parse: str | None = None
    envvar: str | None = None
    eager: bool = False  # parsed before the others (a later option's check reads it)


def option(default: Any, **flag: Any) -> Any:
    """A field with this default that is an engine option on the command line."""
    return field(default=default, metadata={"flag": Flag(**flag)})


@dataclass(slots=True)
class EngineConfig:
    # Fields with a flag are listed in the order `kvcli generate --help` shows them.
    model: str | None = option(
        DEFAULT_MODEL_NAME,  # None: the default model too (checkpoint/resolve.py)
        help="smollm2-135m, a NAME from `kvcli models`, a local Hugging Face directory, a .gguf "
             "file, or ORG/NAME on the hub (downloaded when not in the local cache, unless "
             "HF_HUB_OFFLINE=1).")
    chat_template: str | None = option(  # a Jinja template replacing the model's
        None, parse="chat_template", metavar="FILE",
        help="Render chat lines with this Jinja chat template instead of the model's (a file, "
             "or the template itself), as vLLM's flag; its tool-call format is the one replies "
             "are parsed with (samples/hermes_tools.jinja).")
    block_size: int = option(16, min=1, help="Tokens per KV block (and per prefix-cache hash).")
    num_blocks: int | None = option(None, min=1,
                                    help="KV blocks in the pool (overrides --kv-cache-memory).")
    kv_cache_memory: int | None = option(  # bytes; None: DEFAULT_KV_CACHE_MEMORY
        None, parse="size", metavar="SIZE", help="KV cache budget, e.g. 2GiB (default 1GiB).")
    max_num_batched_tokens: int = option(1024, min=1, help="Token budget of one engine step.")
    max_num_seqs: int = option(64, min=1, help="Requests running at once.")
    enable_prefix_caching: bool = option(True, name="--no-prefix-caching",
                                         help="Disable automatic prefix caching.")
    scheduling: str = option("fcfs", choices=SCHEDULINGS,
                             help="cache-aware admits requests sharing a prefix together.")
    device: str = option("cpu")
    precision: str = option(
        "exact", choices=PRECISIONS,
        help="exact: float32, greedy outputs equal transformers'; fast: the fastest measured "
             "combination on this CPU (float weights: int8 on the integer kernels, else "
             "bfloat16 where native, else float32; with "
             "--quantization its weights; an int8 KV cache where the native kernels run); "
             "--stats names the choice "
             "(kvcli/model/precision.py).")
    dtype: str | None = option(  # None: the precision's choice (exact: float32)
        None, choices=DTYPE_CHOICES,
        help="The matmul weights' dtype; on the CPU activations, norms, softmax, sampling and "
             "the KV cache stay float32. Refused where the CPU has no native bfloat16 / "
             "float16; auto: the checkpoint's where fast here. Overrides --precision's choice. "
             "Default: --precision's (exact: float32).")
    kv_cache_dtype: str = option(  # the KV pool's element type; auto: see the help
        "auto", choices=KV_CACHE_DTYPES,
        help="The KV cache's element type: auto = what the model computes in (float32 on the "
             "CPU; exact), int8 under --precision fast where the native kernels run; int8 = "
             "per token and KV head uint8 codes with a float32 scale and zero point, read in "
             "place by the native CPU kernels (~3.6x the tokens in --kv-cache-memory, a decode "
             "attention kernel 2.5-2.8x faster; outputs close to, not equal to, float32's); "
             "bfloat16 = half the bytes, the same kernels. Both need the native kernels and a "
             "float32-computing model.")
    allow_pickle: bool = option(
        False, help="Allow pickle (.bin/.pt) checkpoints, loaded with torch.load(weights_only=True).")
    # "auto": a GGUF model in its own types, else float (checkpoint/quant_modes.py resolves it;
    # from_config stores the result); others: kvcli/model/quant; None or "none": float
    quantization: str | None = option(
        "auto", choices=QUANTIZATIONS,
        help="Weights: auto runs a GGUF model (the default model included) in its own tensor "
             "types on CPU (= gguf, no float32 conversion) and anything else in float; none "
             "converts a GGUF to float32; int8 quantizes at load (per output channel; integer "
             "dot products where the CPU has AVX2); gguf runs a GGUF model's own tensor types, "
             "memory-mapped; gguf-int the same weights repacked, activations quantized to int8 "
             "per 32 values, integer dot products (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K).")
    kv_cache_dir: str | None = option(  # persistent prefix cache on disk (kvcli/kvstore)
        None, parse="kv_cache_dir", metavar="DIR", envvar="KVCLI_KV_CACHE_DIR",
        help="Persistent prefix cache: full KV blocks are kept in DIR across runs and processes, "
             "and prefixes missing in memory are loaded from it (env KVCLI_KV_CACHE_DIR).")
    kv_cache_dir_max_bytes: int | None = option(  # None: kvstore.DEFAULT_MAX_BYTES
        None, parse="size", metavar="SIZE",
        help="Bound of --kv-cache-dir, least recently used blocks deleted first (default 8GiB).")
    kv_cache_dir_insecure: bool = option(  # kvstore.safety; eager: --kv-cache-dir's check reads it
        False, eager=True,
        help="Use a --kv-cache-dir that every user may write, or that another user owns (refused "
             "by default: whoever writes it can plant K/V this run would serve).")
    structured_compile_timeout: float | None = option(  # per constraint; None: no limit
        30.0, min=0, parse="zero_is_none", metavar="SECONDS",
        help="Time one output constraint's grammar may take to compile; the lines using it fail "
             "past it, the others run meanwhile (0 = no limit).")
    # Not flags of their own: commands set them from their run options (--seed, -q).
    seed: int = 0
    quiet: bool = False  # no model conversion or download progress on stderr


def make_engine_config(**options: Any) -> EngineConfig:
    """An EngineConfig from keyword options (``LLM()``'s); an unknown name is a TypeError that
    names it, the closest known option, and the options there are."""
    known = [f.name for f in fields(EngineConfig)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"unknown engine option(s): {', '.join(_guess(n, known) for n in unknown)}"
                        f"; the options are EngineConfig's fields: {', '.join(known)}")
    return EngineConfig(**options)


def _guess(name: str, known: list[str]) -> str:
    import difflib  # only for the error

    close = difflib.get_close_matches(name, known, n=1)
    return f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)


def budget_num_blocks(config: EngineConfig, bytes_per_block: int) -> int:
    """The pool's blocks when ``num_blocks`` is not given: ``kv_cache_memory`` (default 1 GiB)
    over the bytes of one block, at most MAX_DEFAULT_BLOCKS unless the memory was given."""
    budget = config.kv_cache_memory or DEFAULT_KV_CACHE_MEMORY
    num_blocks = max(1, budget // bytes_per_block)
    if config.kv_cache_memory is None:
        num_blocks = min(num_blocks, MAX_DEFAULT_BLOCKS)
    return num_blocks

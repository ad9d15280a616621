"""Options into an AuditConfig: --cache-size and --concurrency, --kv-cache-dir (shared by the audit and --fix)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvcli.audit.auditor import AuditConfig
from kvcli.audit.capacity import SizeError, bytes_per_token, parse_size
from kvcli.audit.disk import open_disk_hits
from kvcli.audit.profiles import Profile, get_profile
from kvcli.audit.provider_rules import load_rules, with_rules
from kvcli.audit.sources import InputError
from kvcli.audit.tokenizers import AuditTokenizer, ModelTokenizer

if TYPE_CHECKING:
    from kvcli.audit.command import AuditOptions


def make_profile(opts: AuditOptions) -> Profile:
    """--profile with --provider-rules FILE over its tables, then --block-size/--min-tokens/--slots."""
    try:
        profile = get_profile(opts.profile)
        if opts.provider_rules:
            profile = with_rules(profile, load_rules(opts.provider_rules))
        return profile.with_overrides(opts.block_size, opts.min_tokens, opts.slots)
    except ValueError as err:
        raise InputError(str(err)) from err


def cache_options(opts: AuditOptions, config: AuditConfig, tokenizer: AuditTokenizer) -> None:
    """--cache-size (tokens, blocks, or bytes of the model's KV layout) and --concurrency."""
    if opts.concurrency is not None and opts.cache_size is None:
        raise InputError("--concurrency: give --cache-size too (it sets the in-flight prompts of that replay)")
    if isinstance(tokenizer, ModelTokenizer) and tokenizer.directory is not None:
        config.token_bytes = bytes_per_token(tokenizer.directory, opts.kv_dtype())  # generate's KV
    if opts.cache_size is None:
        return
    if config.profile.hit_model != "blocks":
        how = {"breakpoints": "reads at breakpoints", "tokens": "caches tokens in a radix tree",
               "slots": "keeps one prompt per slot"}[config.profile.hit_model]
        raise InputError(f"--cache-size: the {config.profile.name} profile {how}, not from a block pool")
    try:
        config.cache_blocks = parse_size(opts.cache_size, config.profile.block_size, config.token_bytes)
    except SizeError as err:
        raise InputError(str(err)) from err
    config.concurrency = opts.concurrency or 1


def disk_hits(opts: AuditOptions, config: AuditConfig, tokenizer: AuditTokenizer) -> Any:
    """--kv-cache-dir: what a persistent KV cache (kvcli generate --kv-cache-dir) already holds."""
    if opts.kv_cache_dir is None:
        return None
    if not isinstance(tokenizer, ModelTokenizer) or tokenizer.directory is None:
        raise InputError("--kv-cache-dir: give --model too (blocks on disk are keyed by the model)")
    if config.profile.hit_model != "blocks":
        raise InputError(f"--kv-cache-dir: the {config.profile.name} profile has no block pool")
    try:
        return open_disk_hits(opts.kv_cache_dir, tokenizer.directory, config.profile.block_size,
                              opts.model or "", opts.quantization, opts.dtype,
                              kv_cache_dtype=opts.kv_cache_dtype)
    except (OSError, ValueError) as err:
        raise InputError(f"--kv-cache-dir {opts.kv_cache_dir}: {err}") from err

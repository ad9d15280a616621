"""`kvcli audit --trace-block-size N TRACE.jsonl`: a hash-id trace replayed, reported in text or JSON."""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any

import click
import orjson

from kvcli.audit.capacity import CacheModels, SizeError, bytes_per_token, parse_size
from kvcli.audit.profiles import Profile, get_profile
from kvcli.audit.records import InputProblem
from kvcli.audit.report_capacity import capacity_dict, capacity_lines
from kvcli.audit.sources import InputError, RawRecord, check_paths, iter_records
from kvcli.audit.style import Style, plural
from kvcli.audit.timing import LIFETIME_S, PRICES_AS_OF, Clock, Cost
from kvcli.audit.trace import TraceReplay, TraceRequest, parse_trace_line
from kvcli.audit.worth import TIME_MODEL
from kvcli.calibration import load_calibration
from kvcli.numbers import percent

if TYPE_CHECKING:
    from kvcli.audit.command import AuditOptions

# Options that read what a trace does not have (text, ids, files of blocks).
NOT_FOR_TRACES = (("diff", "--diff"), ("html_path", "--html"), ("show_blocks", "--show-blocks"),
                  ("write_baseline", "--write-baseline"), ("baseline", "--baseline"),
                  ("kv_cache_dir", "--kv-cache-dir"), ("time_field", "--time-field"), ("slots", "--slots"),
                  ("fix", "--fix"), ("provider_rules", "--provider-rules"), ("responses", "--responses"))  # fmt: skip


def trace_profile(opts: AuditOptions) -> Profile:
    for name, flag in NOT_FOR_TRACES:
        if getattr(opts, name, None):
            raise InputError(f"{flag}: not for a hash-id trace (--trace-block-size): a trace has no text")
    if opts.fmt == "jsonl":
        raise InputError("--format jsonl: not for a hash-id trace; use text or json")
    bs = opts.trace_block_size
    if opts.block_size is not None and opts.block_size != bs:
        raise InputError(f"--block-size {opts.block_size}: a trace's blocks are --trace-block-size {bs}")
    profile = get_profile(opts.profile)
    if profile.hit_model != "blocks":
        raise InputError(f"--trace-block-size: the {profile.name} profile does not cache by blocks of ids "
                         "(use kvcli, vllm or openai)")
    return profile.with_overrides(bs, opts.min_tokens)


def _model_dir(opts: AuditOptions) -> Any:
    """--model's directory: its KV layout sizes bytes, its calibration gives the prefill rate."""
    if not opts.model:
        return None
    from kvcli.audit.tokenizers import ModelTokenizer, load_tokenizer

    tokenizer = load_tokenizer(opts.encoding, opts.model, opts.write_tensors)
    return tokenizer.directory if isinstance(tokenizer, ModelTokenizer) else None


def _rate(opts: AuditOptions, directory: Any) -> tuple[float | None, str]:
    """The prefill rate and where it comes from: --prefill-tok-s, else --model's calibration."""
    if opts.prefill_tok_s:
        return opts.prefill_tok_s, f"--prefill-tok-s {opts.prefill_tok_s:,g}"
    cal = load_calibration(directory, opts.dtype)
    if cal is None:
        return None, ""
    return cal.prefill_tok_s, f"{cal.prefill_tok_s:,g} tokens/s (calibrated on {cal.date} {cal.cpu})"


def _models(opts: AuditOptions, profile: Profile, directory: Any) -> CacheModels:
    token_bytes = bytes_per_token(directory, opts.kv_dtype()) if directory is not None else None
    if opts.concurrency is not None and opts.cache_size is None:
        raise InputError("--concurrency: give --cache-size too (it sets the in-flight prompts of that replay)")
    blocks = None
    if opts.cache_size is not None:
        try:
            blocks = parse_size(opts.cache_size, profile.block_size, token_bytes)
        except SizeError as err:
            raise InputError(str(err)) from err
    return CacheModels.make(profile.block_size, blocks, opts.concurrency or 1, token_bytes)


def trace_requests(paths: list[str], stdin: IO[bytes] | None, block_size: int,
                   time_unit: str) -> Any:
    for item in iter_records(paths, stdin):
        if isinstance(item, RawRecord):
            yield parse_trace_line(item.value, item.where, block_size, time_unit) if not item.is_text else \
                InputProblem(item.where, "a text prompt, not a trace line")
        else:
            yield item


def run_trace(opts: AuditOptions, stdin: IO[bytes], out: IO[bytes]) -> int:
    """Exit 0 with a report, 2 on bad usage or when no line is a trace line (InputError from here)."""
    profile = trace_profile(opts)
    paths = check_paths(opts.paths)
    directory = _model_dir(opts)
    models = _models(opts, profile, directory)
    rate, source = _rate(opts, directory)
    ttl = opts.cache_ttl if opts.cache_ttl is not None else LIFETIME_S.get(profile.name)
    cost = Cost(profile.name) if profile.name == "openai" else None
    replay = TraceReplay(profile, models, Clock.make(ttl), cost)
    problems = 0
    for item in trace_requests(paths, stdin, profile.block_size, opts.trace_time_unit):
        if isinstance(item, TraceRequest):
            replay.step(item)
            continue
        problems += 1
        click.echo(f"kvcli audit: {item}", err=True)
        if opts.strict:
            return 2
    if not replay.requests:
        click.echo("kvcli audit: error: no trace lines to replay", err=True)
        return 2
    capacity = models.report()
    capacity.kv_dtype = opts.kv_dtype() if capacity.token_bytes else None
    if opts.fmt == "json":
        out.write(orjson.dumps(trace_dict(replay, capacity, problems, rate, source), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        out.write(("\n".join(trace_lines(replay, capacity, problems, Style(bool(opts.color)), rate, source)) + "\n").encode())
    out.flush()
    return 0


def _time_sentence(r: TraceReplay) -> str:
    span = r.span_s
    if span is None:
        return "no line carries a timestamp: replayed in file order, no expiry"
    rate = f", {r.requests / span:,.2f} requests/s, {r.tokens / span:,.0f} input tokens/s" if span > 0 else ""
    order = f"; {r.out_of_order:,} line(s) earlier than one before (replayed in file order)" if r.out_of_order else ""
    ttl = (f"; a cached block lives {r.clock.ttl:g} s after its last use" if r.clock.ttl is not None
           else "; no expiry (give --cache-ttl for a lifetime)")
    return f"timestamps span {span:,.1f} s{rate}{ttl}{order}"


def trace_lines(r: TraceReplay, capacity: Any, problems: int, style: Style, rate: float | None = None,
                source: str = "") -> list[str]:
    p = r.profile
    lines = [
        style(f"kvcli audit: trace of {plural(r.requests, 'request')}", "bold")
        + f" · profile {p.name} (block {p.block_size} tokens" + (f", minimum {p.min_tokens}" if p.min_tokens else "")
        + ")", "",
        f"  input tokens    {r.tokens:>14,}  (output {r.output_tokens:,}, not cached)",
        f"  distinct blocks {len(r.index):>14,}",
        f"  cached tokens   {r.cached_tokens:>14,}  ({percent(r.hit_rate)} hit rate, unbounded cache"
        + (", with expiry)" if r.clock.expired_tokens else ")"),
        f"  {_time_sentence(r)}",
    ]  # fmt: skip
    if r.clock.expired_tokens:
        lines.append(f"  expiry: {r.clock.expired_tokens:,} tokens an unexpiring cache would have served")
    if r.cost is not None:
        lines.append(f"  input cost ≈ {percent(r.cost.relative)} of the same prompts uncached (openai cached-input "
                     f"multiplier, copy of {PRICES_AS_OF}; kvcli/audit/timing.py)")
    if rate:
        saved = r.cached_tokens if capacity.bounded is None else capacity.bounded.cached_tokens
        busy = (f"; {r.tokens / rate / r.span_s:.0%} and {(r.tokens - saved) / rate / r.span_s:.0%} of the trace's "
                f"{r.span_s:,.0f} s: one prefill engine's load") if r.span_s else ""
        lines.append(f"  at {source or f'--prefill-tok-s {rate:,g}'}: ≈ {r.tokens / rate:,.0f} s of prefill without a cache, "
                     f"{(r.tokens - saved) / rate:,.0f} s with it" + (" (at --cache-size)" if capacity.bounded else "")
                     + busy)
        lines.append(style(f"  an estimate: {TIME_MODEL}", "dim"))
    if problems:
        lines.append(f"  input problems  {problems:>14,}  (see stderr)")
    return lines + capacity_lines(capacity, style)


def trace_dict(r: TraceReplay, capacity: Any, problems: int, rate: float | None = None,
               source: str = "") -> dict[str, Any]:
    p = r.profile
    saved = r.cached_tokens if capacity.bounded is None else capacity.bounded.cached_tokens
    return {
        "trace": {"requests": r.requests, "input_tokens": r.tokens, "output_tokens": r.output_tokens,
                  "distinct_blocks": len(r.index), "span_s": r.span_s, "out_of_order": r.out_of_order,
                  "time": _time_sentence(r)},
        "profile": {"name": p.name, "block_size": p.block_size, "min_tokens": p.min_tokens},
        "summary": {"requests": r.requests, "tokens": r.tokens, "cached_tokens": r.cached_tokens,
                    "hit_rate": r.hit_rate, "expired_tokens": r.clock.expired_tokens, "ttl_s": r.clock.ttl,
                    "relative_input_cost": r.cost.relative if r.cost is not None else None},
        "capacity": capacity_dict(capacity),
        "input_problems": problems,
        "worth": {"prefill_tok_s": rate, "rate_source": source or None, "saved_tokens": saved, "time_model": TIME_MODEL if rate else None,
                  "prefill_s_uncached": r.tokens / rate if rate else None,
                  "prefill_s_cached": (r.tokens - saved) / rate if rate else None},
    }  # fmt: skip

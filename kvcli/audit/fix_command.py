"""`kvcli audit --fix OUT FILE.jsonl`: apply the fix rules one by one, each kept only when the
re-simulated replay gets no worse (worse()); write the fixed lines and say what changed where."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click
import orjson

from kvcli.audit.auditor import AuditConfig, Auditor
from kvcli.audit.configure import cache_options, make_profile
from kvcli.audit.fixes import ALL_RULES, DEFAULT_RULES, Change, FixContext, apply_rule, learn_tools
from kvcli.audit.otel import is_otel
from kvcli.audit.reading import request_of
from kvcli.audit.records import PromptRequest
from kvcli.audit.report_fix import fix_dict, fix_lines_text
from kvcli.audit.sources import InputError, RawRecord
from kvcli.audit.tokenizers import load_tokenizer

if TYPE_CHECKING:
    from kvcli.audit.command import AuditOptions


@dataclass(slots=True)
class Line:
    number: int  # 1-based
    raw: bytes  # as read: written back unless a kept fix changed the line
    value: Any = None  # parsed JSON; None for a blank or malformed line (copied as it is)


@dataclass(slots=True)
class Replayed:
    tokens: int
    cached: int  # at --cache-size when given, else in the unbounded (or expiring) cache

    @property
    def hit_rate(self) -> float:
        return self.cached / self.tokens if self.tokens else 0.0

    @property
    def prefill(self) -> int:
        return self.tokens - self.cached


@dataclass(slots=True)
class Step:
    rule: str
    changes: list[Change]
    before: Replayed
    after: Replayed | None  # None: the rule changed nothing
    applied: bool
    reason: str | None = None  # why it was not applied


def worse(before: Replayed, after: Replayed) -> str | None:
    """Why a fix is not kept: the replay computes more, or reuses a smaller share of prompts that
    did not get shorter (a fix that compacts prompts may lower the share while it saves compute)."""
    if after.prefill > before.prefill:
        return "more prefill tokens"
    if after.hit_rate < before.hit_rate and after.tokens >= before.tokens:
        return "it lowers the hit rate"
    return None


@dataclass(slots=True)
class FixReport:
    out: str
    replay: str  # which replay the rates are from
    before: Replayed
    steps: list[Step] = field(default_factory=list)
    lines: int = 0
    changed_lines: int = 0


Simulate = Callable[[list[Line]], Replayed]


def parse_rules(spec: str | None) -> tuple[str, ...]:
    if spec is None or spec == "default":
        return DEFAULT_RULES
    if spec == "all":
        return ALL_RULES
    rules = tuple(r.strip() for r in spec.split(",") if r.strip())
    unknown = [r for r in rules if r not in ALL_RULES]
    if unknown or not rules:
        raise InputError(f"--fix-rules {spec}: unknown rule {', '.join(unknown) or '(none given)'} "
                         f"(rules: {', '.join(ALL_RULES)}; default, all)")
    return rules


def read_lines(path: str) -> list[Line]:
    if path == "-" or not Path(path).is_file():
        raise InputError(f"--fix: give one JSONL file to rewrite (got {path})")
    lines = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                value = orjson.loads(raw) if raw.strip() else None
            except orjson.JSONDecodeError:
                value = None
            if is_otel(value):  # a span's request is not a line to rewrite in place
                raise InputError(f"--fix: {path}:{number} is an OpenTelemetry export: --fix rewrites request "
                                 "files (audit the spans without --fix)")
            lines.append(Line(number, raw, value))
    return lines


def make_simulator(opts: AuditOptions, name: str) -> Simulate:
    """The audit's own replay, set up once (profile, tokenizer, --cache-size) and run per candidate."""
    profile = make_profile(opts)
    tokenizer = load_tokenizer(opts.encoding, opts.model, opts.write_tensors)

    def simulate(lines: list[Line]) -> Replayed:
        config = AuditConfig(profile, capacity=opts.cache_size is not None, ttl=opts.cache_ttl)
        cache_options(opts, config, tokenizer)
        auditor = Auditor(config, tokenizer)
        items = [request_of(RawRecord(f"{name}:{line.number}", line.value), opts.time_field)
                 for line in lines if line.value is not None]
        requests = [r for r in items if isinstance(r, PromptRequest)]
        tokens = cached = 0
        for result in auditor.run(requests, lambda problem: None):
            tokens += result.tokens
            cached += result.cached_tokens if result.bounded_cached_tokens is None else result.bounded_cached_tokens
        return Replayed(tokens, cached)

    return simulate


def fix_lines(lines: list[Line], rules: tuple[str, ...], simulate: Simulate, out: str,
              replay: str) -> tuple[FixReport, list[Line]]:
    """Each rule on the result of the ones kept before it; kept when the replay gets no worse."""
    ctx = FixContext()
    for line in lines:
        learn_tools(ctx, line.value)
    current = simulate(lines)
    report = FixReport(out, replay, current, lines=len(lines))
    for rule in rules:
        candidate, changes = [], []
        for line in lines:
            value, found = apply_rule(rule, line.value, line.number, ctx)
            candidate.append(Line(line.number, line.raw, value) if found else line)
            changes += found
        if not changes:
            report.steps.append(Step(rule, [], current, None, False))
            continue
        after = simulate(candidate)
        reason = worse(current, after)
        report.steps.append(Step(rule, changes, current, after, reason is None, reason))
        applied = reason is None
        if applied:
            lines, current = candidate, after
    report.changed_lines = len({c.line for s in report.steps if s.applied for c in s.changes})
    return report, lines


def write_lines(path: str, original: list[Line], fixed: list[Line]) -> None:
    with open(path, "wb") as f:
        for old, new in zip(original, fixed, strict=True):
            if new.value is old.value:
                f.write(old.raw)
            else:
                f.write(orjson.dumps(new.value) + b"\n")


def run_fix(opts: AuditOptions, out: IO[bytes]) -> int:
    if len(opts.paths) != 1:
        raise InputError("--fix: give exactly one JSONL file to rewrite")
    for flag, given in (("--diff", opts.diff), ("--write-baseline", opts.write_baseline),
                        ("--baseline", opts.baseline), ("--html", opts.html_path),
                        ("--responses", opts.responses)):  # fmt: skip
        if given:
            raise InputError(f"{flag}: not with --fix (audit the fixed file afterwards)")
    rules = parse_rules(opts.fix_rules)
    path = opts.paths[0]
    lines = read_lines(path)
    replay = f"--cache-size {opts.cache_size}" if opts.cache_size else "the unbounded cache"
    target = str(opts.fix)
    report, fixed = fix_lines(lines, rules, make_simulator(opts, path), target, replay)
    write_lines(target, lines, fixed)
    click.echo(f"kvcli audit: wrote {target}", err=True)
    if opts.fmt == "json":
        out.write(orjson.dumps(fix_dict(report, path), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        out.write(("\n".join(fix_lines_text(report, path)) + "\n").encode())
    out.flush()
    return 0

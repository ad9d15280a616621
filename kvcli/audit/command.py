"""What `kvcli audit` does once its options are parsed: read, audit, report, exit status."""

from __future__ import annotations

import gc
import os
import sys
from concurrent.futures import BrokenExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import click

from kvcli.audit.auditor import AuditConfig, Auditor
from kvcli.audit.baseline import BaselineObserver
from kvcli.audit.capacity import CapacityReport
from kvcli.audit.configure import cache_options, disk_hits, make_profile
from kvcli.audit.fix_command import run_fix
from kvcli.audit.ordering import advice_size, advise
from kvcli.audit.reading import diff_requests, relabel, requests
from kvcli.audit.records import SEVERITY_RANK, Finding, InputProblem, PromptResult
from kvcli.audit.report_baseline import baseline_dict, baseline_lines, make_observer, write_baseline
from kvcli.audit.report_capacity import capacity_dict, capacity_html, capacity_lines
from kvcli.audit.report_diff import diff_lines
from kvcli.audit.report_groups import groups_dict, groups_html, groups_lines
from kvcli.audit.report_html import html_page
from kvcli.audit.report_json import document, jsonl_line
from kvcli.audit.report_text import blocks_lines, findings_lines, summary_lines
from kvcli.audit.report_timing import timing_dict, timing_lines
from kvcli.audit.sources import InputError, check_paths
from kvcli.audit.style import Style
from kvcli.audit.tokenizers import TokenizerLoadError, load_tokenizer
from kvcli.audit.trace_command import run_trace
from kvcli.audit.traffic import TrafficCompare, load_responses, traffic_dict, traffic_lines
from kvcli.audit.worth import ShareCounter, Worth, worth_dict, worth_lines
from kvcli.calibration import load_calibration

if TYPE_CHECKING:
    from kvcli.checkpoint.convert import TensorWriter

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


@dataclass(slots=True)
class AuditOptions:
    paths: tuple[str, ...]
    profile: str = "kvcli"
    encoding: str = "o200k_base"
    model: str | None = None
    block_size: int | None = None
    min_tokens: int | None = None
    fmt: str = "text"
    html_path: str | None = None
    show_blocks: bool = False
    diff: tuple[str, str] | None = None
    fail_on: str = "error"
    strict: bool = False
    limit: int = 5
    color: bool | None = None
    cache_size: str | None = None
    kv_cache_dir: str | None = None  # count blocks a `generate --kv-cache-dir` run left as hits
    quantization: str | None = "auto"  # the generate run's --quantization (part of the disk key)
    concurrency: int | None = None
    write_baseline: str | None = None
    baseline: str | None = None
    time_field: str | None = None
    cache_ttl: float | None = None
    slots: int | None = None
    responses: str | None = None  # --responses FILE: a batch output file joined by custom_id
    provider_rules: str | None = None  # --provider-rules FILE: per-model minimums and prices
    dtype: str = "float32"  # generate's --dtype: the KV cache's element type (bytes in --cache-size)
    kv_cache_dtype: str = "auto"  # generate's --kv-cache-dtype (auto: --dtype); int8 rows carry scales
    prefill_tok_s: float | None = None  # --prefill-tok-s: prefill tokens saved as seconds
    fix: str | None = None  # --fix OUT: write the input with the fixes that do not lower the hit rate
    fix_rules: str | None = None
    trace_block_size: int | None = None  # the input is a hash-id trace with blocks of this size
    trace_time_unit: str = "ms"
    # A GGUF --model's conversion step (torch): the command passes it, the audit never imports it.
    write_tensors: TensorWriter | None = None

    def kv_dtype(self) -> str:
        """The element type generate's KV cache is in: --kv-cache-dtype, or --dtype for auto."""
        return self.dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype


class StopAudit(Exception):
    """--strict met a malformed record."""


def _error(message: str) -> None:
    click.echo(f"kvcli audit: error: {message}", err=True)


def _exit_status(findings: list[Finding], fail_on: str) -> int:
    if fail_on == "never":
        return EXIT_OK
    worst = max((SEVERITY_RANK[f.severity] for f in findings), default=-1)
    return EXIT_FINDINGS if worst >= SEVERITY_RANK[fail_on] else EXIT_OK


def run_audit(opts: AuditOptions, stdin: IO[bytes] | None = None, out: IO[bytes] | None = None) -> int:
    stdin = stdin if stdin is not None else sys.stdin.buffer
    out = out if out is not None else sys.stdout.buffer
    if not opts.paths and not opts.diff:
        _error("give at least one PATH (a file, a directory, or - for stdin); see --help")
        return EXIT_USAGE
    if list(opts.paths).count("-") > 1:
        _error("- (stdin) can be given only once")
        return EXIT_USAGE
    try:
        if opts.fix_rules and not opts.fix:
            raise InputError("--fix-rules: give --fix OUT too (the rules pick what --fix rewrites)")
        if opts.trace_block_size:
            return run_trace(opts, stdin, out)
        return run_fix(opts, out) if opts.fix else _run(opts, stdin, out)
    except (InputError, TokenizerLoadError) as err:
        _error(str(err))
        return EXIT_USAGE
    except StopAudit:
        return EXIT_USAGE
    except BrokenExecutor as err:  # the tokenizer worker died (killed, out of memory)
        _error(f"the tokenizer worker stopped: {err}")
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (| head): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's documented recipe
        return EXIT_OK
    finally:
        gc.unfreeze()  # the audit froze its objects for the collector (AuditConfig.freeze_gc)


def _run(opts: AuditOptions, stdin: IO[bytes], out: IO[bytes]) -> int:
    profile = make_profile(opts)
    paths = check_paths(opts.paths) if not opts.diff else []
    if opts.model:  # the weights generate would run: "auto" resolved (part of the disk key)
        from kvcli.checkpoint.quant_modes import resolve_mode

        opts.quantization = resolve_mode(opts.model, opts.quantization, "cpu", opts.dtype)
    tokenizer = load_tokenizer(opts.encoding, opts.model, opts.write_tensors, opts.quantization)
    problems: list[InputProblem] = []

    def on_problem(problem: InputProblem) -> None:
        problems.append(problem)
        click.echo(f"kvcli audit: {problem}", err=True)
        if opts.strict:
            raise StopAudit

    excerpts = bool(opts.html_path or opts.diff)
    config = AuditConfig(profile, show_blocks=opts.show_blocks or bool(opts.diff), excerpts=excerpts, freeze_gc=True)
    config.capacity = not opts.diff
    config.ttl = opts.cache_ttl
    cache_options(opts, config, tokenizer)
    config.disk = disk_hits(opts, config, tokenizer)
    auditor = Auditor(config, tokenizer)
    baseline = make_observer(opts.write_baseline, opts.baseline, tokenizer, profile)
    shares = ShareCounter(profile.block_size, max(profile.block_size, profile.min_tokens_for(None)))
    traffic = TrafficCompare(profile.block_size)
    auditor.observers += [shares, traffic]
    if baseline is not None:
        auditor.observers.append(baseline)
    picked = diff_requests(opts.paths, opts.diff, stdin, on_problem) if opts.diff else None
    source = picked if picked is not None else requests(paths, stdin, opts.time_field)
    if opts.responses:
        traffic.responses = load_responses(opts.responses, on_problem)
        source = traffic.responses.join(source)
    keep = opts.fmt != "jsonl" or bool(opts.html_path)  # jsonl alone streams: keep no results
    results: list[PromptResult] = []
    findings: list[Finding] = []
    for result in auditor.run(source, on_problem):
        if opts.fmt == "jsonl":
            out.write(jsonl_line(result))
        if keep:
            results.append(result)
        findings.extend(result.findings)
    findings += auditor.finish()
    if picked is not None:
        relabel(results, picked)
    if auditor.tools_ignored:
        first = auditor.tools_ignored[0]
        click.echo(f"kvcli audit: warning: the model's chat template ignores `tools`; they are not "
                   f"in the prompt of {len(auditor.tools_ignored)} request(s) (first: {first})",
                   err=True)
    if auditor.summary.prompts < (2 if opts.diff else 1):
        _error("no prompts to audit" + _why_none(problems))
        return EXIT_USAGE
    if baseline is not None and opts.write_baseline:
        click.echo(f"kvcli audit: {write_baseline(baseline, opts.write_baseline)}", err=True)
    _report(opts, auditor, tokenizer.name, results, findings, problems, out, baseline, (shares, traffic))
    status = _exit_status(findings, opts.fail_on)
    return EXIT_FINDINGS if baseline is not None and baseline.moved else status


def _why_none(problems: list[InputProblem]) -> str:
    if not problems:
        return ""
    if all(p.empty for p in problems):
        return " (the input is empty)"
    return " (every record was malformed)"


def _report(
    opts: AuditOptions,
    auditor: Auditor,
    tokenizer: str,
    results: list[PromptResult],
    findings: list[Finding],
    problems: list[InputProblem],
    out: IO[bytes],
    baseline: BaselineObserver | None = None,
    observed: tuple[ShareCounter, TrafficCompare] | None = None,
) -> None:
    profile, summary = auditor.profile, auditor.summary
    # The run-wide reports (a pass over the block tree each): not for --diff or jsonl alone.
    wanted = not opts.diff and (opts.fmt != "jsonl" or bool(opts.html_path))
    capacity = _capacity(auditor) if wanted else None
    if capacity is not None and capacity.token_bytes:
        capacity.kv_dtype = opts.kv_dtype()
    bounded = capacity.bounded.cached_tokens if capacity is not None and capacity.bounded is not None else None
    shares, traffic = observed if observed is not None else (None, None)
    calibration = None if opts.prefill_tok_s else load_calibration(getattr(auditor.tokenizer, "directory", None), opts.dtype)
    rate = opts.prefill_tok_s or (calibration.prefill_tok_s if calibration is not None else None)
    worth = Worth(summary.tokens, summary.cached_tokens, bounded, rate, shares, auditor.hits, calibration,
                  opts.model, opts.dtype)
    groups = auditor.prefix_groups() if wanted else None
    id_of = auditor.ctx.id_of
    if opts.html_path:
        extra = capacity_html(capacity) if capacity is not None else ""
        extra += groups_html(groups, id_of) if groups is not None else ""
        page = html_page(tokenizer, profile, summary, results, findings, problems, extra)
        Path(opts.html_path).write_text(page, encoding="utf-8")
        click.echo(f"kvcli audit: wrote {opts.html_path}", err=True)
    if opts.fmt == "json":
        extras = {"capacity": capacity_dict(capacity) if capacity is not None else None,
                  "provider_replay": timing_dict(auditor.hits),
                  "prefix_groups": groups_dict(groups, id_of) if groups is not None else None,
                  "worth": worth_dict(worth) if wanted else None,
                  "traffic": traffic_dict(traffic) if traffic is not None else None}
        if baseline is not None and baseline.expected is not None:
            extras["baseline"] = baseline_dict(baseline, profile.block_size)
        out.write(document(tokenizer, profile, summary, results, findings, problems, extras))
    elif opts.fmt == "text":
        color = opts.color
        if color is None:
            color = out is sys.stdout.buffer and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        style = Style(color)
        if opts.diff:
            lines = diff_lines(results[0], results[1], style)
        else:
            sources = {r.index: r.source for r in results}
            lines = summary_lines(tokenizer, profile, summary, len(problems), style)
            lines += timing_lines(auditor.hits, style)
            priced = auditor.hits.cost is not None and bool(auditor.hits.cost.models)
            # With --model an engine run is predicted: say what it is worth, or how to calibrate
            engine = opts.model is not None and auditor.hits.cost is None
            lines += worth_lines(worth, style) if worth.rate or priced or engine else []
            lines += traffic_lines(traffic, opts.limit, style) if traffic is not None else []
            lines += _capacity_text(opts, capacity, style)
            lines += groups_lines(groups, id_of, style) if groups is not None else []
            if baseline is not None and baseline.expected is not None:
                lines += baseline_lines(baseline, profile.block_size, style)
            moved = len(baseline.moved) if baseline is not None else 0
            lines += findings_lines(findings, sources, opts.limit, style, moved)
            if opts.show_blocks:
                lines += blocks_lines(results, style)
        out.write(("\n".join(lines) + "\n").encode("utf-8"))
    out.flush()


def _capacity(auditor: Auditor) -> CapacityReport | None:
    """The capacity report with its ordering advice (at --cache-size, else at the elbow)."""
    models = auditor.cache_models
    if models is None:
        return None
    capacity = models.report()
    size = advice_size(capacity)
    if size is not None:
        capacity.ordering = advise(models.curve, auditor.index, size, auditor.profile.min_tokens_for(None))
    return capacity


def _capacity_text(opts: AuditOptions, capacity: CapacityReport | None, style: Style) -> list[str]:
    """The text report shows the capacity section when a cache size was asked about."""
    return capacity_lines(capacity, style) if capacity is not None and opts.cache_size else []

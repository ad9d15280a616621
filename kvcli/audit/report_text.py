"""The report for people: summary, then findings grouped by rule with excerpts and fixes."""

from __future__ import annotations

from collections import defaultdict

from kvcli.audit.auditor import Summary
from kvcli.audit.profiles import Profile
from kvcli.audit.records import Excerpt, Finding, PromptResult
from kvcli.audit.style import Style, plural
from kvcli.numbers import percent

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def summary_lines(tokenizer: str, profile: Profile, s: Summary, problems: int, style: Style) -> list[str]:
    lines = [
        style(f"kvcli audit: {plural(s.prompts, 'prompt')}", "bold")
        + f" · profile {profile.name} (block {profile.block_size} tokens"
        + (f", minimum {profile.min_tokens}" if profile.min_tokens else "")
        + f") · tokenizer {tokenizer}",
        "",
        f"  tokens          {s.tokens:>12,}",
        f"  cached tokens   {s.cached_tokens:>12,}  ({percent(s.cached_tokens, s.tokens)} hit rate)",
    ]
    if s.tokens:
        share = s.tokens_at_stake / s.tokens
        lines.append(f"  could be saved  {s.tokens_at_stake:>12,}  (≈{percent(share)} more, by fixing the findings below)")
    counts = [
        style(plural(s.findings["error"], "error"), "error") if s.findings["error"] else plural(0, "error"),
        style(plural(s.findings["warning"], "warning"), "warning") if s.findings["warning"] else plural(0, "warning"),
        f"{s.findings['info']:,} info",
    ]
    lines.append("  findings        " + " · ".join(counts))
    if problems:
        lines.append(f"  input problems  {problems:>12,}  (see stderr)")
    return lines


def excerpt_lines(e: Excerpt, this_label: str, style: Style, indent: str = "      ", other: str = "other") -> list[str]:
    other_label = f"prompt {e.against}" if e.against is not None else other
    width = max(len(this_label), len(other_label))
    lines = [f"{indent}{this_label:<{width}} │ {e.this}"]
    if e.other is not None:
        lines.append(f"{indent}{other_label:<{width}} │ {e.other}")
    lines.append(f"{indent}{'':<{width}} │ " + " " * e.caret + style("^", "bold"))
    return lines


def finding_lines(f: Finding, sources: dict[int, str], style: Style) -> list[str]:
    name = f'prompt {f.prompt}' + (f' "{f.prompt_id}"' if f.prompt_id else "")
    where = [sources.get(f.prompt, "")]
    if f.char is not None:
        where.append(f"char {f.char}")
    if f.segment:
        where.append(f"({f.segment})")
    times = f" ×{f.count}" if f.count > 1 else ""
    lines = [f"  {style(f'{f.severity:<7}', f.severity)} {style(name, 'bold')}{times}  {' '.join(w for w in where if w)}"]
    lines.append(f"      {f.message}")
    if f.excerpt is not None:
        lines.extend(excerpt_lines(f.excerpt, "this", style))
    lines.append(f"      {style('fix:', 'bold')} {f.fix}")
    return lines


def findings_lines(findings: list[Finding], sources: dict[int, str], limit: int, style: Style,
                   moved: int = 0) -> list[str]:
    """``moved``: stable prefixes that moved against --baseline, which fail the run (exit 1)
    even without a finding, so "No findings" alone would contradict the exit status."""
    if not findings and moved:
        return ["", f"No findings in the prompts themselves, but the --baseline check failed: "
                    f"{plural(moved, 'stable prefix', 'stable prefixes')} moved (see the baseline "
                    f"section above); exit status 1."]
    if not findings:
        return ["", "No findings: every prompt reuses what its position in the input allows."]
    by_rule: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_rule[f.rule].append(f)
    lines: list[str] = []
    ordered = sorted(by_rule.items(), key=lambda kv: (min(SEVERITY_ORDER[f.severity] for f in kv[1]), kv[0]))
    for rule, group in ordered:
        group.sort(key=lambda f: (SEVERITY_ORDER[f.severity], f.prompt))
        counts = defaultdict(int)
        for f in group:
            counts[f.severity] += 1
        tally = ", ".join(plural(n, sev) if sev != "info" else f"{n} info" for sev, n in counts.items())
        lines += ["", style(f"── {rule} · {tally} ", "bold") + "─" * max(0, 60 - len(rule) - len(tally))]
        for f in group[:limit]:
            lines.extend(finding_lines(f, sources, style))
        if len(group) > limit:
            more = plural(len(group) - limit, f"more {rule} finding")
            lines.append(f"  … {more} (--limit, or --format json for all)")
    return lines


def blocks_lines(results: list[PromptResult], style: Style) -> list[str]:
    lines = ["", style("── blocks ", "bold") + "─" * 60]
    for r in results:
        name = f"prompt {r.index}" + (f' "{r.id}"' if r.id else "")
        lines.append(f"{style(name, 'bold')} {r.source}: {r.tokens:,} tokens, {r.cached_tokens:,} cached")
        for j, b in enumerate(r.blocks or []):
            lines.append(f"  #{j:<5} {b.hash}  {b.start:>7}-{b.end:<7} {style(b.state, b.state)}")
        covered = len(r.blocks or []) * (r.blocks[0].end - r.blocks[0].start if r.blocks else 0)
        if r.tokens > covered:
            lines.append(style(f"  + {r.tokens - covered} tokens in a partial block (never cached)", "dim"))
    return lines

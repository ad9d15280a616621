"""The --fix report in text and JSON: before/after per rule, kept or not, and every change by line and field."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvcli.numbers import percent

if TYPE_CHECKING:
    from kvcli.audit.fix_command import FixReport, Replayed, Step


def _rates(step: Step) -> str:
    if step.after is None:
        return "no change"
    b, a = step.before, step.after
    verdict = "applied" if step.applied else f"NOT applied: {step.reason}"
    return (f"hit rate {percent(b.hit_rate)} -> {percent(a.hit_rate)}, prefill tokens {b.prefill:,} -> {a.prefill:,}: "
            f"{verdict}")


def fix_lines_text(report: FixReport, source: str) -> list[str]:
    b = report.before
    lines = [f"kvcli audit --fix: {report.changed_lines:,} of {report.lines:,} lines of {source} changed, "
             f"written to {report.out}",
             f"  replayed on {report.replay}: before, hit rate {percent(b.hit_rate)}, prefill tokens {b.prefill:,} "
             f"of {b.tokens:,}"]  # fmt: skip
    for step in report.steps:
        lines.append(f"  {step.rule:<11} {len(step.changes):>4} change(s)  {_rates(step)}")
    final = _final(report)
    lines.append(f"  after: hit rate {percent(final.hit_rate)}, prefill tokens {final.prefill:,} of {final.tokens:,}")
    for step in report.steps:
        if step.changes:
            lines += ["", f"  {step.rule} ({'applied' if step.applied else 'not applied'}):"]
            lines += [f"    {source}:{c.line}: {c.field}: {c.what}" for c in step.changes]
    return lines


def _final(report: FixReport) -> Replayed:
    applied = [s.after for s in report.steps if s.applied and s.after is not None]
    return applied[-1] if applied else report.before


def _replayed(r: Replayed | None) -> dict[str, Any] | None:
    return None if r is None else {"tokens": r.tokens, "cached_tokens": r.cached, "hit_rate": r.hit_rate,
                                   "prefill_tokens": r.prefill}


def fix_dict(report: FixReport, source: str) -> dict[str, Any]:
    return {
        "source": source, "out": report.out, "replay": report.replay, "lines": report.lines,
        "changed_lines": report.changed_lines, "before": _replayed(report.before),
        "after": _replayed(_final(report)),
        "rules": [{"rule": s.rule, "applied": s.applied, "not_applied_because": s.reason, "before": _replayed(s.before), "after": _replayed(s.after),
                   "changes": [{"line": c.line, "field": c.field, "what": c.what} for c in s.changes]}
                  for s in report.steps],
    }  # fmt: skip

"""--html FILE: one self-contained page (inline CSS, no network assets).

Summary on top, then findings (each linking to its prompt), then every prompt as a
strip of its blocks: green = reused, amber = seen before but not counted (last
token rule or profile minimum), red = computed; a mark at the first divergence,
with both sides' text under it.
"""

from __future__ import annotations

from html import escape

from kvcli.audit.auditor import Summary
from kvcli.audit.profiles import Profile
from kvcli.audit.records import Excerpt, Finding, InputProblem, PromptResult
from kvcli.numbers import percent

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table.sum td{padding:2px 14px 2px 0}table.sum td:nth-child(2){text-align:right;font-variant-numeric:tabular-nums}
table.f{border-collapse:collapse;width:100%}table.f td,table.f th{border-bottom:1px solid #eee;padding:4px 6px;
vertical-align:top;text-align:left}.sev{font-weight:600;text-transform:uppercase;font-size:.8em}
.error{color:#b3261e}.warning{color:#a15c00}.info{color:#0b6e99}
.prompt{margin:.9em 0;padding:.4em 0;border-bottom:1px dotted #ddd}.meta{font-size:.9em;color:#555}
.strip{position:relative;height:16px;background:#e06c5f;border-radius:3px;overflow:hidden;min-width:4px;
margin:4px 0;background-image:repeating-linear-gradient(to right,transparent 0,transparent calc(var(--b) - 1px),
rgba(255,255,255,.55) calc(var(--b) - 1px),rgba(255,255,255,.55) var(--b))}
.strip span{position:absolute;top:0;bottom:0}.hit{background:#3fa34d}.capped{background:#e8b33c}
.mark{width:2px;background:#000;top:-2px!important;bottom:-2px!important}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:-2px;border-radius:2px}
pre{background:#f6f6f6;padding:6px 8px;overflow-x:auto;font-size:12.5px;margin:4px 0}
details summary{cursor:pointer;font-size:.9em}a{color:#0b57d0}
"""


def _excerpt_pre(e: Excerpt, this_label: str = "this") -> str:
    other_label = f"prompt {e.against}" if e.against is not None else "other"
    width = max(len(this_label), len(other_label))
    rows = [f"{this_label:<{width}} │ {e.this}"]
    if e.other is not None:
        rows.append(f"{other_label:<{width}} │ {e.other}")
    rows.append(f"{'':<{width}} │ " + " " * e.caret + "^")
    return "<pre>" + escape("\n".join(rows)) + "</pre>"


def _summary(tokenizer: str, profile: Profile, s: Summary, problems: int) -> str:
    rows = [
        ("prompts", f"{s.prompts:,}"),
        ("tokens", f"{s.tokens:,}"),
        ("cached tokens", f"{s.cached_tokens:,} ({percent(s.cached_tokens, s.tokens)})"),
        ("could be saved", f"{s.tokens_at_stake:,}"),
        ("findings", f"{s.findings['error']} errors, {s.findings['warning']} warnings, {s.findings['info']} info"),
        ("input problems", f"{problems}"),
    ]
    cells = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows)
    head = (
        f"<p>profile <b>{escape(profile.name)}</b> ({escape(profile.summary)}), block {profile.block_size} "
        f"tokens, tokenizer <b>{escape(tokenizer)}</b></p>"
    )
    return head + f'<table class="sum" id="summary">{cells}</table>'


def _findings(findings: list[Finding]) -> str:
    if not findings:
        return "<p>No findings.</p>"
    rows = []
    for n, f in enumerate(findings):
        where = f"char {f.char}" if f.char is not None else ""
        if f.segment:
            where += f" ({escape(f.segment)})"
        excerpt = _excerpt_pre(f.excerpt) if f.excerpt else ""
        rows.append(
            f'<tr class="finding" id="f{n}" data-rule="{escape(f.rule)}" data-prompt="{f.prompt}">'
            f'<td class="sev {f.severity}">{f.severity}</td><td>{escape(f.rule)}</td>'
            f'<td><a href="#p{f.prompt}">prompt {f.prompt}</a> {escape(where)}</td>'
            f"<td>{escape(f.message)}{excerpt}<div><b>fix:</b> {escape(f.fix)}</div></td></tr>"
        )
    return '<table class="f"><tr><th>severity</th><th>rule</th><th>where</th><th>what</th></tr>' + "".join(rows) + "</table>"


def _strip(r: PromptResult, block_size: int, widest: int) -> str:
    n = max(r.tokens, 1)
    width = max(2.0, 100.0 * r.tokens / max(widest, 1))
    parts = [f'<span class="hit" style="left:0;width:{100 * r.cached_tokens / n:.3f}%"></span>']
    if r.matched_tokens > r.cached_tokens:
        left, span = 100 * r.cached_tokens / n, 100 * (r.matched_tokens - r.cached_tokens) / n
        parts.append(f'<span class="capped" style="left:{left:.3f}%;width:{span:.3f}%"></span>')
    if r.divergence is not None:
        parts.append(f'<span class="mark" style="left:{100 * r.divergence.token / n:.3f}%"></span>')
    title = f"{r.cached_tokens} of {r.tokens} tokens cached"
    return (
        f'<div class="strip" title="{title}" style="width:{width:.2f}%;--b:{100 * block_size / n:.4f}%">'
        + "".join(parts) + "</div>"
    )  # fmt: skip


def _prompt(r: PromptResult, findings: list[tuple[int, Finding]], block_size: int, widest: int) -> str:
    name = f"prompt {r.index}" + (f' "{escape(r.id)}"' if r.id else "")
    rate = r.cached_tokens / r.tokens if r.tokens else 0.0
    meta = f"{escape(r.source)} · {r.tokens:,} tokens · {r.cached_tokens:,} cached ({rate:.0%})"
    body = [f'<section class="prompt" id="p{r.index}"><div><b>{name}</b> <span class="meta">{meta}</span></div>']
    body.append(_strip(r, block_size, widest))
    d = r.divergence
    if d is not None:
        against = f'<a href="#p{d.against}">prompt {d.against}</a>'
        label = f"first divergence: token {d.token} (block {d.block}), char {d.char}, against {against}"
        excerpt = _excerpt_pre(r.excerpt) if r.excerpt else ""
        body.append(f"<details><summary>{label}</summary>{excerpt}</details>" if excerpt else f'<div class="meta">{label}</div>')
    links = " ".join(f'<a class="{f.severity}" href="#f{n}">{escape(f.rule)}</a>' for n, f in findings)
    if links:
        body.append(f'<div class="meta">findings: {links}</div>')
    return "".join(body) + "</section>"


def html_page(
    tokenizer: str,
    profile: Profile,
    summary: Summary,
    results: list[PromptResult],
    findings: list[Finding],
    problems: list[InputProblem],
    extra: str = "",  # more sections (capacity, prefix groups), already HTML
) -> str:
    by_prompt: dict[int, list[tuple[int, Finding]]] = {}
    for n, f in enumerate(findings):
        by_prompt.setdefault(f.prompt, []).append((n, f))
    widest = max((r.tokens for r in results), default=1)
    legend = (
        '<p class="legend"><span class="hit"></span>reused <span class="capped"></span>seen, not counted '
        '<span style="background:#e06c5f"></span>computed <span style="background:#000;width:2px"></span>first divergence</p>'
    )
    prompts = "".join(_prompt(r, by_prompt.get(r.index, []), profile.block_size, widest) for r in results)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>kvcli audit</title>'
        f"<style>{CSS}</style></head><body><h1>kvcli audit</h1>"
        f"{_summary(tokenizer, profile, summary, len(problems))}{extra}"
        f"<h2>Findings</h2>{_findings(findings)}<h2>Prompts</h2>{legend}{prompts}</body></html>\n"
    )

"""`kvcli audit --diff A B`: two prompts side by side, block by block, and where they part."""

from __future__ import annotations

from kvcli.audit.records import PromptResult
from kvcli.audit.report_text import finding_lines
from kvcli.audit.style import Style


def _name(r: PromptResult) -> str:
    return f"prompt {r.index}" + (f' "{r.id}"' if r.id else "") + f" ({r.source})"


def diff_lines(a: PromptResult, b: PromptResult, style: Style) -> list[str]:
    lines = [
        f"A  {_name(a)}: {a.tokens:,} tokens",
        f"B  {_name(b)}: {b.tokens:,} tokens, {b.cached_tokens:,} of them cached after A",
        "",
    ]
    d = b.divergence
    if d is None:
        lines.append("B shares no token with A: nothing of A is reused.")
    else:
        lines.append(f"first divergence: token {d.token} (block {d.block}), char {d.char}")
        if b.excerpt is not None:
            excerpt = b.excerpt
            lines += [
                f"      B │ {excerpt.this}",
                f"      A │ {excerpt.other}" if excerpt.other is not None else "      A │ (ends here)",
                "        │ " + " " * excerpt.caret + style("^", "bold"),
            ]
        elif d.token >= min(a.tokens, b.tokens):
            shorter = "B" if b.tokens <= a.tokens else "A"
            lines.append(f"      {shorter} is a prefix of the other one")
    lines += ["", style(f"{'block':>6}  {'tokens':<15} {'A':<10} {'B':<10}", "bold")]
    a_blocks, b_blocks = a.blocks or [], b.blocks or []
    for j in range(max(len(a_blocks), len(b_blocks))):
        x = a_blocks[j] if j < len(a_blocks) else None
        y = b_blocks[j] if j < len(b_blocks) else None
        ref = x or y
        assert ref is not None
        if x and y:
            verdict = style("same", "hit") if x.hash == y.hash else style("differs", "miss")
        else:
            verdict = style("only in " + ("A" if x else "B"), "dim")
        lines.append(
            f"{j:>6}  {ref.start:>6}-{ref.end:<8} {x.hash if x else '-':<10} {y.hash if y else '-':<10} {verdict}"
        )
    if b.findings:
        lines += ["", style("findings for B", "bold")]
        for f in b.findings:
            lines.extend(finding_lines(f, {b.index: b.source}, style))
    return lines



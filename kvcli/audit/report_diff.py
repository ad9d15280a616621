"""`kvcli audit --diff A B`: two prompts side by side, block by block, and where they part."""

from __future__ import annotations

from itertools import groupby

from kvcli.audit.records import BlockView, PromptResult
from kvcli.audit.report_text import finding_lines
from kvcli.audit.style import Style

RUN_SHOWN = 4


def _name(r: PromptResult) -> str:
    return f"prompt {r.index}" + (f' "{r.id}"' if r.id else "") + f" ({r.source})"


def _verdict(x: BlockView | None, y: BlockView | None) -> str:
    if x and y:
        return "same" if x.hash == y.hash else "differs"
    return "only in " + ("A" if x else "B")


def _block_rows(a: list[BlockView], b: list[BlockView], style: Style) -> list[str]:
    """One row per block; a run of more than RUN_SHOWN blocks with the same verdict is shortened."""
    pairs = [(a[j] if j < len(a) else None, b[j] if j < len(b) else None) for j in range(max(len(a), len(b)))]
    rows: list[str] = []
    j = 0
    for verdict, group in groupby(pairs, key=lambda pair: _verdict(*pair)):
        run = list(group)
        color = {"same": "hit", "differs": "miss"}.get(verdict, "dim")
        for k, (x, y) in enumerate(run):
            if len(run) > RUN_SHOWN and 0 < k < len(run) - 1:
                if k == 1:
                    rows.append(style(f"{'…':>6}  {len(run) - 2} more blocks: {verdict}", "dim"))
                continue
            ref = x or y
            assert ref is not None
            rows.append(
                f"{j + k:>6}  {ref.start:>6}-{ref.end:<8} {x.hash if x else '-':<10} {y.hash if y else '-':<10} "
                + style(verdict, color)
            )
        j += len(run)
    return rows


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
    lines += _block_rows(a.blocks or [], b.blocks or [], style)
    if b.findings:
        lines += ["", style("findings for B", "bold")]
        for f in b.findings:
            lines.extend(finding_lines(f, {b.index: b.source}, style))
    return lines



"""Shared-prefix groups and cacheability in text, JSON and HTML."""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import Any

from kvcli.audit.groups import GroupsReport, PrefixGroup
from kvcli.audit.style import Style
from kvcli.numbers import percent

TEXT_GROUPS = 5

IdOf = Callable[[int], str | None]


def _name(index: int, id_of: IdOf) -> str:
    found = id_of(index)
    return f'{index} "{found}"' if found else str(index)


def _where(g: PrefixGroup) -> str:
    place = f"char {g.char:,}" if g.char is not None else ""
    return f"{g.segment}, {place}" if g.segment else place


def groups_lines(report: GroupsReport, id_of: IdOf, style: Style) -> list[str]:
    lines = ["", style("── shared prefixes ", "bold") + "─" * 53,
             f"  cacheability {percent(report.cacheable_tokens, report.tokens)} ({report.cacheable_tokens:,} of {report.tokens:,} tokens): "
             f"{report.meaning}"]  # fmt: skip
    if not report.groups:
        return [*lines, "  no prefix of a full block is shared by two prompts"]
    lines.append(f"  {'tokens':>9} {'prompts':>8} {'saves':>10}  ends at (in its first prompt)     prompts")
    for g in report.groups[:TEXT_GROUPS]:
        examples = ", ".join(_name(i, id_of) for i in g.examples)
        lines.append(f"  {g.tokens:>9,} {g.prompts:>8,} {g.tokens_saved:>10,}  {_where(g):<33} {examples}")
    if len(report.groups) > TEXT_GROUPS:
        lines.append(f"  … {len(report.groups) - TEXT_GROUPS} more in --format json")
    lines.append(style("  saves: (prompts - 1) x the group's tokens below the group it is nested in; "
                       "the savings add up to the cacheable tokens", "dim"))
    return lines


def groups_dict(report: GroupsReport, id_of: IdOf) -> dict[str, Any]:
    return {
        "cacheability": report.cacheability, "cacheable_tokens": report.cacheable_tokens,
        "tokens": report.tokens, "meaning": report.meaning,
        "groups": [{"tokens": g.tokens, "prompts": g.prompts, "tokens_saved": g.tokens_saved,
                    "first_prompt": g.owner, "prompt_ids": [id_of(i) for i in g.examples],
                    "prompt_indexes": g.examples, "ends_at_char": g.char, "ends_in": g.segment}
                   for g in report.groups],
    }  # fmt: skip


def _links(g: PrefixGroup, id_of: IdOf) -> str:
    return " ".join(f'<a href="#p{i}">{escape(_name(i, id_of))}</a>' for i in g.examples)


def groups_html(report: GroupsReport, id_of: IdOf) -> str:
    rows = "".join(
        f"<tr><td>{g.tokens:,}</td><td>{g.prompts:,}</td><td>{g.tokens_saved:,}</td><td>{escape(_where(g))}</td>"
        f"<td>{_links(g, id_of)}</td></tr>"
        for g in report.groups
    )
    head = "<tr><th>tokens</th><th>prompts</th><th>saves</th><th>ends in</th><th>prompts</th></tr>"
    return (f'<h2>Shared prefixes</h2><p id="cacheability">cacheability <b>{percent(report.cacheable_tokens, report.tokens)}</b>: '
            f'{escape(report.meaning)}</p><table class="f" id="groups">{head}{rows}</table>')

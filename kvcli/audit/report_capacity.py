"""The capacity report in text, JSON and as the HTML page's inline SVG chart."""

from __future__ import annotations

import math
from html import escape
from typing import Any

from kvcli.audit.capacity import CapacityReport, CurvePoint
from kvcli.audit.style import Style
from kvcli.numbers import percent

BAR = 30  # characters of the text chart's widest bar
CURVE_ROWS = 14  # text rows at most (every other point of a long curve)


def human_bytes(n: int | None) -> str:
    if n is None:
        return ""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def size_label(report: CapacityReport, blocks: int) -> str:
    text = f"{blocks:,} blocks ({blocks * report.block_size:,} tokens"
    size = report.size_bytes(blocks)
    return text + (f", {human_bytes(size)})" if size is not None else ")")


def _thin(points: list[CurvePoint]) -> list[CurvePoint]:
    if len(points) <= CURVE_ROWS:
        return points
    step = -(-len(points) // CURVE_ROWS)
    return points[::step] + ([points[-1]] if (len(points) - 1) % step else [])


def capacity_lines(report: CapacityReport, style: Style) -> list[str]:
    lines = ["", style("── capacity ", "bold") + "─" * 60]
    b = report.bounded
    if b is not None:
        lines.append(f"  at --cache-size {size_label(report, b.blocks)}, concurrency {b.concurrency}: "
                     f"{b.cached_tokens:,} cached tokens, {percent(b.hit_rate)} hit rate "
                     f"(unbounded {percent(report.unbounded_hit_rate)})")
        if b.too_large:
            lines.append(f"  {b.too_large:,} prompt(s) need more blocks than that cache has (the engine refuses them)")
    if report.engine_pool is not None:
        e = report.engine_pool
        lines.append(f"  at kvcli generate's default pool, {size_label(report, e.blocks)}: {e.cached_tokens:,} "
                     f"cached tokens, {percent(e.hit_rate)} hit rate")
    if report.token_bytes and report.kv_dtype:
        flag = "--kv-cache-dtype" if report.kv_dtype == "int8" else "--dtype"
        row = " + 8 scale/zero-point bytes" if report.kv_dtype == "int8" else " x element size"
        lines.append(f"  KV: {report.token_bytes:,} bytes per token in {report.kv_dtype} (the model's layers x 2 x KV "
                     f"heads x (head dim{row})), as `kvcli generate {flag} {report.kv_dtype}` allocates; "
                     "--quantization changes weights, not the KV cache")
    lines.append(f"  hit rate by cache size (working set {size_label(report, report.working_set_blocks)}):")
    for p in _thin(report.curve):
        bar = "█" * round(BAR * p.hit_rate / max(report.unbounded_hit_rate, 1e-9))
        extra = f" {human_bytes(p.bytes):>10}" if p.bytes is not None else ""
        lines.append(f"    {p.blocks:>10,} blocks {p.tokens:>12,} tokens{extra} {percent(p.hit_rate):>7}  {bar}")
    if report.ordering is not None:
        lines.append(f"  {ordering_sentence(report)}")
    if report.elbow is not None:
        lines.append(f"  elbow: {size_label(report, report.elbow.blocks)} reaches {percent(report.elbow.hit_rate)}, "
                     f"90% of the unbounded {percent(report.unbounded_hit_rate)}")
    lines.append(style(f"  the curve assumes {report.assumes}", "dim"))
    if b is not None and b.concurrency > 1:
        lines.append(style(f"  at --cache-size: {b.concurrency} prompts in flight (in input order, the oldest "
                           f"finishing first); {b.method}", "dim"))
    return lines


def ordering_sentence(report: CapacityReport) -> str:
    o = report.ordering
    where = size_label(report, o.blocks)
    if round(o.sorted_hit_rate, 3) == round(o.given_hit_rate, 3):
        change = f"would not change the hit rate at {where} ({percent(o.given_hit_rate)})"
    else:
        verb = "raise" if o.sorted_hit_rate > o.given_hit_rate else "lower"
        change = f"would {verb} the hit rate at {where} from {percent(o.given_hit_rate)} to {percent(o.sorted_hit_rate)}"
    return (f"ordering by prefix {change} (all prompts sorted by tokens, one at a time: the limit of "
            "`kvcli generate --scheduling cache-aware`)")


def _point(p: CurvePoint) -> dict[str, Any]:
    return {"blocks": p.blocks, "tokens": p.tokens, "bytes": p.bytes, "cached_tokens": p.cached_tokens,
            "hit_rate": p.hit_rate}


def capacity_dict(report: CapacityReport) -> dict[str, Any]:
    b = report.bounded
    bounded = None if b is None else {
        "blocks": b.blocks, "tokens": b.blocks * report.block_size, "bytes": report.size_bytes(b.blocks),
        "concurrency": b.concurrency, "cached_tokens": b.cached_tokens, "hit_rate": b.hit_rate,
        "too_large": b.too_large, "method": b.method,
        "assumes": f"{b.concurrency} prompt(s) in flight in input order, the oldest finishing first; "
                   "outputs not cached",
    }  # fmt: skip
    return {
        "assumes": report.assumes, "block_size": report.block_size, "kv_bytes_per_token": report.token_bytes,
        "unbounded_hit_rate": report.unbounded_hit_rate, "working_set_blocks": report.working_set_blocks,
        "largest_prompt_blocks": report.largest_prompt_blocks, "bounded": bounded,
        "curve": [_point(p) for p in report.curve],
        "elbow": _point(report.elbow) if report.elbow is not None else None,
        "engine_pool": _point(report.engine_pool) if report.engine_pool is not None else None,
        "kv_dtype": report.kv_dtype,
        "ordering": None if report.ordering is None else {
            "blocks": report.ordering.blocks, "given_hit_rate": report.ordering.given_hit_rate,
            "sorted_hit_rate": report.ordering.sorted_hit_rate, "advice": ordering_sentence(report)},
    }  # fmt: skip


def capacity_svg(report: CapacityReport, width: int = 640, height: int = 220) -> str:
    """Hit rate (y) against log cache size (x); the unbounded level dashed, the elbow marked."""
    points = report.curve
    if not points:
        return ""
    pad, top = 48, 12
    lo, hi = math.log(points[0].blocks), math.log(points[-1].blocks)
    span = hi - lo or 1.0

    def xy(blocks: int, rate: float) -> tuple[float, float]:
        x = pad + (width - pad - 12) * (math.log(blocks) - lo) / span
        return x, top + (height - top - 28) * (1 - rate)

    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(p.blocks, p.hit_rate) for p in points))
    _, uy = xy(points[0].blocks, report.unbounded_hit_rate)
    parts = [
        f'<svg class="curve" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="hit rate by cache size">',
        f'<line x1="{pad}" y1="{uy:.1f}" x2="{width - 12}" y2="{uy:.1f}" stroke="#888" stroke-dasharray="4 3"/>',
        f'<text x="{pad + 4}" y="{uy - 4:.1f}" font-size="11" fill="#555">unbounded '
        f"{percent(report.unbounded_hit_rate)}</text>",
        f'<polyline fill="none" stroke="#3fa34d" stroke-width="2" points="{path}"/>',
        f'<line x1="{pad}" y1="{height - 28}" x2="{width - 12}" y2="{height - 28}" stroke="#333"/>',
        f'<text x="4" y="{top + 10}" font-size="11">100%</text><text x="4" y="{height - 28}" font-size="11">0%</text>',
    ]
    for p in (points[0], points[len(points) // 2], points[-1]):
        x, _ = xy(p.blocks, 0)
        parts.append(f'<text x="{x:.1f}" y="{height - 12}" font-size="11" text-anchor="middle">'
                     f"{escape(f'{p.tokens:,}')} tok</text>")
    if report.elbow is not None:
        x, y = xy(report.elbow.blocks, report.elbow.hit_rate)
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#b3261e"><title>elbow: '
                     f"{escape(size_label(report, report.elbow.blocks))}</title></circle>")
    return "".join(parts) + "</svg>"


def capacity_html(report: CapacityReport) -> str:
    lines = capacity_lines(report, Style(False))[1:]
    return (f'<h2>Capacity</h2><div id="capacity">{capacity_svg(report)}'
            f"<pre>{escape(chr(10).join(lines))}</pre></div>")

"""Human-readable benchmark tables and the optional bar chart (matplotlib, `bench` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLUMNS = (
    ("system", "name", "{}"),
    ("weights", "weights", "{}"),
    ("wall s", "wall_s", "{:.2f}"),
    ("median s", "wall_s_median", "{:.2f}"),
    ("prompt tok", "prompt_tokens", "{}"),
    ("prefill computed", "prefill_tokens_computed", "{}"),
    ("generated", "generated_tokens", "{}"),
    ("out tok/s", "output_tok_s", "{:.1f}"),
    ("total tok/s", "total_tok_s", "{:.1f}"),
    ("TTFT mean s", "ttft_mean_s", "{:.2f}"),
    ("p50", "ttft_p50_s", "{:.2f}"),
    ("p90", "ttft_p90_s", "{:.2f}"),
    ("peak RSS MiB", "peak_rss_mb", "{:.0f}"),
    ("KV util", "kv_utilization", "{:.2f}"),
)


def documents(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-workload documents of a report (one, or the list under "runs")."""
    return report["runs"] if "runs" in report else [report]



def _speed(doc: dict) -> str:
    """The machine's float32 speed over the workload (absent from older documents)."""
    if "float32_gflops_start" not in doc:
        return ""
    return (f"float32 GEMM {doc['float32_gflops_start']} -> {doc['float32_gflops_end']} "
            "GFLOP/s, ")

def _cell(entry: dict[str, Any], key: str, fmt: str) -> str:
    value = entry.get(key)
    return "-" if value is None else fmt.format(value)


def _match_cell(entry: dict[str, Any], reference: bool) -> str:
    if "error" in entry:
        return "failed (below)"
    if reference:
        return "reference"
    cell = f"{entry['outputs_matching']}/{entry['outputs_total']}"
    return cell if entry.get("exact", True) else f"{cell} ({entry.get('weights', 'quantized')})"


def _agreement_line(entry: dict[str, Any], reference: dict[str, Any]) -> str:
    """An inexact system's (quantized, bfloat16) greedy agreement with kvcli's row."""
    agree = entry["agreement"]
    line = (f"{entry['name']} greedy agreement with kvcli {reference.get('weights', 'float32')}: "
            f"{agree['identical_share']:.1%} identical outputs")
    if agree["mean_first_divergence"] is not None:
        line += (f", the {agree['diverged']} others first differ at token "
                 f"{agree['mean_first_divergence']:.1f} on average")
    return line


def _shared_rss_line(entries: list[dict[str, Any]]) -> list[str]:
    """Which rows' peak RSS is that of the bench's process, when several share it (none of
    them is then measured alone)."""
    shared = [e["name"] for e in entries if not e.get("rss_own_process", True)]
    if len(shared) < 2:
        return []
    return [f"peak RSS of {', '.join(shared)}: the bench's process, which holds all of them "
            "(--isolate runs each kvcli row in a process of its own)"]


def format_table(doc: dict[str, Any]) -> str:
    """One workload's results as an aligned text table with speedups and the load."""
    rows = [[title for title, _, _ in COLUMNS] + ["greedy = kvcli"]]
    for entry in doc["systems"]:
        cells = [_cell(entry, key, fmt) for _, key, fmt in COLUMNS]
        rows.append(cells + [_match_cell(entry, entry is doc["systems"][0])])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in
                       enumerate(zip(row, widths, strict=True))) for row in rows]
    machine = doc["machine"]
    head = (f"workload {doc['workload']}: {doc['description']}; {doc['max_new_tokens']} new "
            f"tokens each; model {doc['model']}; best of {doc['repeat']}")
    foot = [f"kvcli speedup over {peer}: {ratio:.2f}x (median runs {doc['speedup_median'][peer]:.2f}x)"
            for peer, ratio in doc["speedup"].items()]
    foot += [_agreement_line(e, doc["systems"][0]) for e in doc["systems"][1:]
             if not e.get("exact", True) and "error" not in e]
    foot += [f"{e['name']} failed at {e['error']}" for e in doc["systems"] if "error" in e]
    foot += _shared_rss_line(doc["systems"])
    kind = f" ({machine['cpu_kind']})" if machine.get("cpu_kind") else ""
    foot.append(f"machine: {machine.get('cpu_model', machine['processor'])}{kind}, "
                f"{machine['cpu_count']} CPUs, {machine['threads']} torch threads, "
                f"load avg {doc['load_avg_start']} -> {doc['load_avg_end']}, "
                f"{_speed(doc)}"
                f"torch {machine['torch']}, transformers {machine['transformers']}")
    return "\n".join([head, *lines, *foot])


def write_plot(report: dict[str, Any], path: Path) -> None:
    """Bar chart of output tokens/s per system, grouped by workload."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'kvcli[bench]' "
                           "(or pip install matplotlib)") from None
    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    docs = documents(report)
    names = list(dict.fromkeys(e["name"] for d in docs for e in d["systems"]))
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(docs)), 4.0))
    for i, name in enumerate(names):
        xs, ys = [], []
        for j, doc in enumerate(docs):
            entry = next((e for e in doc["systems"] if e["name"] == name), None)
            if entry is not None and "error" not in entry:
                xs.append(j + (i - (len(names) - 1) / 2) * width)
                ys.append(entry["output_tok_s"])
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(docs)), [d["workload"] for d in docs])
    ax.set_ylabel("output tokens/s (best run)")
    ax.set_title(f"{docs[0]['model']}, {docs[0]['machine']['threads']} threads")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""``--input-order prefix``: the whole file runs grouped by prompt prefix (kvcli/batch/ordering.py).

With the fake engine (tests/batch_fakes.py) for the batch layer, and a real tiny model with a
small KV pool for what it is for: fewer prefill tokens computed than the given order.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
from batch_fakes import FakeEngine, FakeTokenizer
from test_generate_cli import invoke as generate

from kvcli.batch.encode import PromptEncoder
from kvcli.batch.ordering import index_by_prefix, lines_in_order, prompt_key_fn
from kvcli.batch.parse import ParseOptions

PREFIXES = [f"{g} " + " ".join(f"rule{g}x{k}" for k in range(8)) + ": " for g in range(5)]


def shuffled_lines(groups: int = 5, per_group: int = 6, seed: int = 1) -> list[dict]:
    rows = [{"id": f"g{g}-{i}", "prompt": PREFIXES[g] + f"question {i}?", "max_tokens": 3}
            for g in range(groups) for i in range(per_group)]
    random.Random(seed).shuffle(rows)
    return rows


def write(path: Path, rows: list[dict], extra: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + extra)
    return path


def group_of(line_id: str) -> str:
    return line_id.split("-")[0]


def test_pass_one_makes_each_prefix_group_contiguous() -> None:
    rows = shuffled_lines()
    data = ("\n".join(json.dumps(r) for r in rows[:10]) + "\n\n\nnot json\n"
            + "\n".join(json.dumps(r) for r in rows[10:]) + "\n").encode()
    encoder = PromptEncoder(FakeTokenizer(), 4096, 259)
    key = prompt_key_fn(encoder, ParseOptions(), block_size=4)
    stream = io.BytesIO(data)
    entries = index_by_prefix(stream, key, 1 << 20)
    lines = list(lines_in_order(stream, entries, 1 << 20))
    assert lines[0].data == b"not json" and lines[0].line_no == 13  # failing lines first
    ids = [json.loads(line.data)["id"] for line in lines[1:]]
    groups = [group_of(i) for i in ids]
    assert sorted(ids) == sorted(r["id"] for r in rows)
    assert len(set(groups)) == sum(1 for a, b in zip(groups, groups[1:], strict=False) if a != b) + 1
    by_id = {json.loads(line.data)["id"]: line for line in lines[1:]}
    order = [r["id"] for r in rows]  # ranks are input positions; ties keep input order
    assert all(by_id[i].rank == (k if k < 10 else k + 1) for k, i in enumerate(order))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[FakeEngine]:
    """The command's engines (test_generate_cli's fixture), fresh fakes collected in a list."""
    engines: list[FakeEngine] = []
    monkeypatch.setattr("kvcli.batch.run.load_engine",
                        lambda cfg: engines.append(FakeEngine(max_model_len=4096)) or engines[-1])
    return engines


def without_cache_counts(text: str) -> list[dict]:
    """Result lines minus usage.cached_tokens (what the order is meant to change)."""
    rows = [json.loads(line) for line in text.splitlines()]
    for row in rows:
        row.get("usage", {}).pop("cached_tokens", None)
    return rows


def test_ordered_output_is_the_given_orders(fake, tmp_path) -> None:
    rows = shuffled_lines()
    src = write(tmp_path / "in.jsonl", rows, '{"prompt": 3}\n')
    given = generate(str(src), "--ordered", "-q", "--max-pending", "4")
    grouped = generate(str(src), "--ordered", "-q", "--max-pending", "4", "--input-order",
                       "prefix")
    assert given.exit_code == grouped.exit_code == 1  # the bad line fails in both
    assert without_cache_counts(grouped.stdout) == without_cache_counts(given.stdout)
    ranks = [int(engine_id) for engine_id in fake[1].added]  # engine ids are input positions
    groups = [group_of(rows[r]["id"]) for r in ranks]
    assert groups == sorted(groups, key=groups.index)  # each group admitted together


def test_unordered_writes_every_result_once(fake, tmp_path) -> None:
    src = write(tmp_path / "in.jsonl", shuffled_lines())
    res = generate(str(src), "-q", "--max-pending", "3", "--input-order", "prefix")
    assert res.exit_code == 0
    ids = [json.loads(line)["id"] for line in res.stdout.splitlines()]
    assert sorted(ids) == sorted(r["id"] for r in shuffled_lines())


def test_resume_skips_done_lines_and_keeps_order(fake, tmp_path) -> None:
    rows = shuffled_lines()
    src, out = write(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    full = generate(str(src), "--ordered", "-q")
    out.write_text("".join(full.stdout.splitlines(keepends=True)[:7]))
    res = generate(str(src), "-o", str(out), "--resume", "--ordered", "-q", "--input-order",
                   "prefix", "--max-pending", "2")
    assert res.exit_code == 0
    assert without_cache_counts(out.read_text()) == without_cache_counts(full.stdout)


def test_stdin_is_refused(fake) -> None:
    res = generate("-", "--input-order", "prefix", input='{"prompt": "a"}\n')
    assert res.exit_code == 2 and "needs a regular file" in res.stderr


def test_fewer_prefill_tokens_than_the_given_order(tiny_models, tmp_path) -> None:
    """Five ~50-token prefixes shuffled, a window of 2, a pool of 160 tokens (1,072 tokens computed
    in the given order, 340 grouped, measured):
    the given order recomputes most prefixes, the grouped order each once."""
    src = write(tmp_path / "in.jsonl", shuffled_lines())
    computed = {}
    for order in ("given", "prefix"):
        stats = tmp_path / f"{order}.json"
        res = generate(str(src), "--model", str(tiny_models["llama"]), "--block-size", "4",
                       "--num-blocks", "40", "--max-pending", "2", "--input-order", order,
                       "--stats", str(stats), "-q", "--ordered", "-o",
                       str(tmp_path / f"{order}.jsonl"))
        assert res.exit_code == 0, res.stderr
        computed[order] = json.loads(stats.read_text())["prefill_tokens_computed"]
    assert computed["prefix"] < 0.6 * computed["given"]
    assert (without_cache_counts((tmp_path / "prefix.jsonl").read_text())
            == without_cache_counts((tmp_path / "given.jsonl").read_text()))


def test_the_bench_file_is_shuffled_prefix_groups() -> None:
    from kvcli.bench.prefix_groups import prefix_group_lines

    rows = prefix_group_lines(3, 4, 20)
    systems = [r["messages"][0]["content"] for r in rows]
    assert len(rows) == 12 and len(set(systems)) == 3
    assert systems != sorted(systems, key=systems.index)  # shuffled: groups not contiguous

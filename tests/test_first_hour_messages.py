"""Messages a new user meets in the first hour say exactly what happened (issue 16, bug 12)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kvcli.cli import main

ROWS = [{"id": f"r{i}", "messages": [{"role": "system", "content": "You answer briefly. " * 8},
                                      {"role": "user", "content": f"question {i}"}]} for i in range(3)]


def _batch(tmp_path: Path, rows: list[dict] = ROWS) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_unknown_model_is_named_once(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["audit", str(_batch(tmp_path)), "--model", "nosuch"])
    assert res.exit_code == 2 and res.stderr.count("--model nosuch") == 1, res.stderr


def test_an_empty_file_is_called_empty_not_malformed(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = CliRunner().invoke(main, ["audit", str(empty)])
    assert res.exit_code == 2
    assert "no prompts to audit (the input is empty)" in res.stderr and "malformed" not in res.stderr


def test_diff_names_prompts_by_their_place_in_the_input(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["audit", str(_batch(tmp_path)), "--diff", "0", "2"])
    assert res.exit_code in (0, 1), res.output
    head = res.stdout.splitlines()[:2]
    assert head[0].startswith('A  prompt 0 "r0"') and head[1].startswith('B  prompt 2 "r2"'), head


def test_resume_counts_in_the_singular(tmp_path: Path, tiny_models) -> None:
    batch, out = _batch(tmp_path, ROWS[:1]), tmp_path / "out.jsonl"
    args = ["generate", str(batch), "--model", str(tiny_models["llama"]), "--max-tokens", "1", "-o", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    again = CliRunner().invoke(main, [*args, "--resume"])
    assert "resuming: 1 request already in" in again.stderr, again.stderr

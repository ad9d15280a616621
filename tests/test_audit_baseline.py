"""--write-baseline / --baseline: a pre-merge check that prompts' stable prefixes did not move."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_audit_support import SYSTEM, TOOLS, chat, run, system, user, write_jsonl

EXTRA_TOOL = {"type": "function", "function": {"name": "get_invoice", "description": "Fetch an invoice.",
              "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}  # fmt: skip


def _rows(sys_text: str = SYSTEM, tools: list | None = None) -> list[dict]:
    tools = TOOLS if tools is None else tools
    return [chat([system(sys_text), user(f"Question {i}?")], tools, id=f"support-{i}") for i in range(3)]


def _check(tmp_path: Path, before: list[dict], after: list[dict], *args: str):
    lock = tmp_path / "kvcli-audit.lock"
    wrote = run([str(write_jsonl(tmp_path / "before.jsonl", before)), "--write-baseline", str(lock)])
    assert wrote.exit_code == 0 and lock.exists(), wrote.output
    return run([str(write_jsonl(tmp_path / "after.jsonl", after)), "--baseline", str(lock), "--fail-on", "never", *args])


def test_unchanged_prompts_pass(tmp_path: Path) -> None:
    result = _check(tmp_path, _rows(), _rows())
    assert result.exit_code == 0, result.output
    assert "3 prompt(s) checked, 0 moved, 0 not in the baseline" in result.stdout


def test_reordered_tools_fail_naming_prompt_block_and_part(tmp_path: Path) -> None:
    result = _check(tmp_path, _rows(), _rows(tools=TOOLS[::-1]), "--format", "json")
    assert result.exit_code == 1
    moved = json.loads(result.stdout)["baseline"]["moved"]
    assert [m["key"] for m in moved] == ["support-0", "support-1", "support-2"]
    first = moved[0]
    assert first["segment"].startswith("tools[0]") and first["block"] < first["baseline_blocks"]
    assert 'prompt "support-0" (prompt 0): its stable prefix (tools, schema, system) moved at block' in first["message"]
    assert "create_ticket" in first["excerpt"]["this"] and "search_docs" in first["excerpt"]["other"]


def test_a_timestamp_in_the_system_prompt_is_named(tmp_path: Path) -> None:
    before, after = _rows("Today is 2026-01-05T10:00:00Z.\n" + SYSTEM), _rows("Today is 2026-01-06T10:00:00Z.\n" + SYSTEM)
    result = _check(tmp_path, before, after)
    assert result.exit_code == 1
    assert "a timestamp '2026-01-06T10:00:00Z' (was '2026-01-05T10:00:00Z') in the stable prefix" in result.stdout
    assert "baseline │" in result.stdout and "now      │" in result.stdout


def test_a_system_prompt_grown_at_its_end_moves_only_its_last_blocks(tmp_path: Path) -> None:
    """Text appended to the last stable part moves the blocks holding its end (and the end
    marker after it), nothing before: reported at that block, not at block 0."""
    result = _check(tmp_path, _rows(), _rows(SYSTEM + " Also: be kind."), "--format", "json")
    assert result.exit_code == 1
    for m in json.loads(result.stdout)["baseline"]["moved"]:
        assert m["baseline_blocks"] - 2 <= m["block"] < m["baseline_blocks"]
        assert m["segment"] == "messages[0] system" and "Also: be kind." in m["excerpt"]["this"]


def test_a_tool_appended_moves_the_system_prompt_after_it(tmp_path: Path) -> None:
    """Tools render before the system prompt, so one more tool moves everything after it."""
    result = _check(tmp_path, _rows(), _rows(tools=[*TOOLS, EXTRA_TOOL]), "--format", "json")
    assert result.exit_code == 1
    assert {m["segment"] for m in json.loads(result.stdout)["baseline"]["moved"]} == {"tools[2] get_invoice"}


def test_prompts_missing_from_the_baseline_are_counted(tmp_path: Path) -> None:
    result = _check(tmp_path, _rows(), [chat([system(), user("New prompt?")], TOOLS, id="new-one")])
    assert result.exit_code == 0 and "0 prompt(s) checked, 0 moved, 1 not in the baseline" in result.stdout


@pytest.mark.parametrize(("content", "extra", "message"), [
    (None, ["--block-size", "32"], "written with tokenizer o200k_base, block 16"),
    (b"{}", [], "not a kvcli audit baseline"),
    (b"not json", [], "not a kvcli audit baseline"),
])  # fmt: skip
def test_unusable_baselines_are_usage_errors(tmp_path: Path, content: bytes | None, extra: list[str], message: str) -> None:
    lock = tmp_path / "kvcli-audit.lock"
    path = write_jsonl(tmp_path / "r.jsonl", _rows())
    if content is None:
        run([str(path), "--write-baseline", str(lock)])
    else:
        lock.write_bytes(content)
    result = run([str(path), "--baseline", str(lock), *extra])
    assert result.exit_code == 2 and message in result.output


def test_write_and_check_together_is_refused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", _rows())
    result = run([str(path), "--baseline", "a.lock", "--write-baseline", "b.lock"])
    assert result.exit_code == 2 and "give one" in result.output

"""Helpers shared by the test_audit_* files (no tests here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from kvcli.cli import main

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "samples" / "prompts"

SYSTEM = (
    "You are Nimbus, the support assistant for ACME Cloud. Answer briefly, cite the documentation, "
    "never ask for secrets, and open a ticket for outages or billing disputes. "
) * 6
TOOLS = [
    {"type": "function", "function": {"name": "search_docs", "description": "Search the docs.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    {"type": "function", "function": {"name": "create_ticket", "description": "Open a ticket.",
     "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}}},
]  # fmt: skip


def chat(messages: list[dict[str, Any]], tools: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": messages, **extra}
    if tools is not None:
        row["tools"] = tools
    return row


def system(text: str = SYSTEM) -> dict[str, str]:
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def tool_result(call_id: str, content: str) -> dict[str, str]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def run(args: list[str], stdin: bytes | str | None = None) -> Result:
    return CliRunner().invoke(main, ["audit", *args], input=stdin, catch_exceptions=False)


def audit_json(tmp_path: Path, rows: list[Any], *args: str) -> dict[str, Any]:
    """Audit `rows` (JSONL) and return the --format json document."""
    path = write_jsonl(tmp_path / "requests.jsonl", rows)
    result = run([str(path), "--format", "json", "--fail-on", "never", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def rules(doc: dict[str, Any], severity: str | None = None) -> list[tuple[str, int]]:
    """(rule, prompt) of each finding, optionally of one severity."""
    return [(f["rule"], f["prompt"]) for f in doc["findings"] if severity is None or f["severity"] == severity]


def problems(doc: dict[str, Any]) -> list[str]:
    return [f"{p['where']}: {p['message']}" for p in doc["input_problems"]]

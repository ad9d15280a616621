"""The command line: report formats and schema, exit codes, blocks, diff, HTML, the samples."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_audit_support import SAMPLES, SYSTEM, TOOLS, chat, run, system, user, write_jsonl

from kvcli.audit.parse import to_request
from kvcli.audit.render import render_request
from kvcli.audit.tokenizers import TiktokenTokenizer
from kvcli.hashing import hash_token_blocks

TIMESTAMPED = [chat([system(f"Now: 2025-03-14T09:26:0{i}Z\n" + SYSTEM), user("How do I rotate keys?")], id=f"r{i}") for i in range(3)]


def test_json_schema(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", TIMESTAMPED)
    result = run([str(path), "--format", "json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["tokenizer"] == "o200k_base" and doc["block_size"] == 16
    summary = doc["summary"]
    assert {k: type(summary[k]) for k in ("prompts", "tokens", "cached_tokens", "hit_rate")} == {
        "prompts": int, "tokens": int, "cached_tokens": int, "hit_rate": float}  # fmt: skip
    assert summary["prompts"] == 3 and summary["hit_rate"] == summary["cached_tokens"] / summary["tokens"]
    for i, prompt in enumerate(doc["prompts"]):
        assert prompt["index"] == i and prompt["id"] == f"r{i}"
        assert isinstance(prompt["tokens"], int) and isinstance(prompt["cached_tokens"], int)
    assert doc["prompts"][0]["first_divergence"] is None
    divergence = doc["prompts"][1]["first_divergence"]
    assert set(divergence) >= {"token", "block", "char", "against"}
    assert divergence["against"] == 0 and divergence["block"] == divergence["token"] // 16
    for finding in doc["findings"]:
        assert finding["severity"] in ("error", "warning", "info")
        assert isinstance(finding["prompt"], int) and isinstance(finding["message"], str) and finding["fix"]
        assert finding["char"] is None or isinstance(finding["char"], int)


def test_divergence_positions_are_exact(tmp_path: Path) -> None:
    """token = longest common token prefix; char = where that token starts in the rendered text."""
    doc = json.loads(run([str(write_jsonl(tmp_path / "r.jsonl", TIMESTAMPED)), "--format", "json"]).stdout)
    tok = TiktokenTokenizer()
    texts = [render_request(i, to_request(r, "x")).text for i, r in enumerate(TIMESTAMPED)]  # type: ignore[arg-type]
    ids = tok.encode_batch(texts)
    lcp = next(k for k, (a, b) in enumerate(zip(ids[0], ids[1], strict=False)) if a != b)
    divergence = doc["prompts"][1]["first_divergence"]
    assert divergence["token"] == lcp
    assert divergence["char"] == len(tok._enc.decode(ids[1][:lcp]))
    assert texts[1][: divergence["char"]] == texts[0][: divergence["char"]]
    assert [p["tokens"] for p in doc["prompts"]] == [len(x) for x in ids]


def test_exit_codes(tmp_path: Path) -> None:
    noisy = str(write_jsonl(tmp_path / "noisy.jsonl", TIMESTAMPED))
    clean = str(SAMPLES / "clean.jsonl")
    switch = str(SAMPLES / "model_switch.jsonl")  # a warning only
    assert run([clean]).exit_code == 0
    assert run([noisy]).exit_code == 1
    assert run([noisy, "--fail-on", "never"]).exit_code == 0
    assert run([switch]).exit_code == 0
    assert run([switch, "--fail-on", "warning"]).exit_code == 1
    assert run([clean, "--profile", "nope"]).exit_code == 2
    assert run([clean, "--block-size", "0"]).exit_code == 2


def test_text_report(tmp_path: Path) -> None:
    result = run([str(write_jsonl(tmp_path / "r.jsonl", TIMESTAMPED))])
    out = result.stdout
    assert out.startswith("kvcli audit: 3 prompts · profile kvcli (block 16 tokens) · tokenizer o200k_base")
    for piece in ("cached tokens", "hit rate", "could be saved", "── volatile-prefix", 'prompt 1 "r1"', "fix:", "^"):
        assert piece in out
    assert "\x1b[" not in out  # not a terminal: no color
    assert "\x1b[" in run([str(tmp_path / "r.jsonl"), "--color"]).stdout


def test_jsonl_one_line_per_prompt(tmp_path: Path) -> None:
    lines = run([str(write_jsonl(tmp_path / "r.jsonl", TIMESTAMPED)), "--format", "jsonl"]).stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["index"] for r in records] == [0, 1, 2]
    assert [f["rule"] for f in records[1]["findings"]] == ["volatile-prefix"]


def test_show_blocks_are_the_engine_hashes(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", TIMESTAMPED[:2])
    doc = json.loads(run([str(path), "--format", "json", "--show-blocks"]).stdout)
    text = render_request(1, to_request(TIMESTAMPED[1], "x")).text  # type: ignore[arg-type]
    (ids,) = TiktokenTokenizer().encode_batch([text])
    blocks = doc["prompts"][1]["blocks"]
    assert [b["hash"] for b in blocks] == [h.hex()[:8] for h in hash_token_blocks(ids, 16)]
    assert [b["state"] for b in blocks[:2]] == ["hit", "miss"] and {b["state"] for b in blocks[2:]} == {"miss"}
    text_report = run([str(path), "--show-blocks"]).stdout
    assert f"{blocks[0]['hash']}        0-16      hit" in text_report


def test_diff_two_files_and_two_ids(tmp_path: Path) -> None:
    a = tmp_path / "a.txt"
    b = tmp_path / "b.txt"
    a.write_text(SYSTEM + "Question: how do I rotate keys?")
    b.write_text(SYSTEM + "Question: why was I billed twice?")
    out = run(["--diff", str(a), str(b)]).stdout
    assert "first divergence: token" in out and "same" in out and "differs" in out
    assert "B │ " in out and "A │ " in out
    path = write_jsonl(tmp_path / "r.jsonl", TIMESTAMPED)
    by_id = run(["--diff", "r0", "r2", str(path), "--format", "json"])
    doc = json.loads(by_id.stdout)
    assert [p["id"] for p in doc["prompts"]] == ["r0", "r2"] and doc["prompts"][1]["first_divergence"]["against"] == 0
    assert run(["--diff", "r0", "nope", str(path)]).exit_code == 2


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.findings = 0
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"] or "")
        if tag == "tr" and values.get("class") == "finding":
            self.findings += 1
        for key in ("href", "src"):
            if values.get(key):
                self.links.append(values[key] or "")


def test_html_report_holds_every_prompt_and_finding(tmp_path: Path) -> None:
    page_path = tmp_path / "report.html"
    result = run([str(SAMPLES), "--html", str(page_path), "--format", "json", "--fail-on", "never"])
    doc = json.loads(result.stdout)
    page = _Page()
    page.feed(page_path.read_text(encoding="utf-8"))
    assert {f"p{p['index']}" for p in doc["prompts"]} <= page.ids
    assert page.findings == len(doc["findings"]) > 0
    assert all(link.startswith("#") for link in page.links)  # self-contained: no network assets
    assert "summary" in page.ids


EXPECTED = {
    "clean.jsonl": set(),
    "volatile_prefix.jsonl": {"volatile-prefix"},
    "unsorted_json.jsonl": {"unsorted-json"},
    "dynamic_tools.jsonl": {"dynamic-tools"},
    "mid_prompt_edit.jsonl": {"mid-prompt-edit"},
    "whitespace_drift.jsonl": {"whitespace-drift"},
    "per_user_prefix.jsonl": {"per-user-prefix"},
    "unstable_order.jsonl": {"unstable-order"},
    "model_switch.jsonl": {"model-switch"},
    "below_minimum.jsonl": set(),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_sample_shows_its_pattern(name: str) -> None:
    doc = json.loads(run([str(SAMPLES / name), "--format", "json", "--fail-on", "never"]).stdout)
    assert {f["rule"] for f in doc["findings"] if f["severity"] != "info"} == EXPECTED[name]


def test_below_minimum_sample_with_the_openai_profile() -> None:
    doc = json.loads(run([str(SAMPLES / "below_minimum.jsonl"), "--profile", "openai", "--format", "json"]).stdout)
    assert {f["rule"] for f in doc["findings"]} == {"below-minimum"}


def test_tokenizer_and_profile_options(tmp_path: Path) -> None:
    path = str(write_jsonl(tmp_path / "r.jsonl", [chat([system(), user("hi")], TOOLS)] * 2))
    cl100k = json.loads(run([path, "--tokenizer", "cl100k_base", "--format", "json"]).stdout)
    assert cl100k["tokenizer"] == "cl100k_base"
    small = json.loads(run([path, "--block-size", "4", "--format", "json"]).stdout)
    assert small["block_size"] == 4 and small["prompts"][1]["cached_tokens"] % 4 == 0
    assert small["prompts"][1]["cached_tokens"] >= small["prompts"][1]["tokens"] - 4

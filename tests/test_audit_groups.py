"""Shared-prefix groups: which prefixes carry the savings, where they end, and cacheability as
an upper bound (the groups' savings add up to it)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_audit_support import SYSTEM, audit_json, chat, run, system, user, write_jsonl

from kvcli.audit.groups import prefix_groups
from kvcli.audit.prefix_index import PrefixIndex, token_bytes

OTHER = "You are Quill, a writing assistant. Keep the user's voice, fix grammar, never invent facts. " * 4


def test_top_group_is_the_shared_system_prompt(tmp_path: Path) -> None:
    rows = [chat([system(), user(f"Question {i}: what does error E{i}{i} mean?")], id=f"n{i}") for i in range(5)]
    rows += [chat([system(OTHER), user(f"Fix sentence {i}.")], id=f"q{i}") for i in range(2)]
    doc = audit_json(tmp_path, rows)
    groups = doc["prefix_groups"]
    first, second = groups["groups"][:2]
    assert (first["prompts"], first["prompt_ids"][:3]) == (5, ["n0", "n1", "n2"])
    assert first["tokens_saved"] == 4 * first["tokens"]  # nested in nothing: 4 prompts reuse all of it
    # The shared full blocks run past the system prompt into the user turn (its digits differ).
    assert first["ends_in"] == "messages[1] user"
    assert len(SYSTEM) < first["ends_at_char"] < len(SYSTEM) + 60
    assert (second["prompts"], second["prompt_ids"]) == (2, ["q0", "q1"])
    total = sum(g["tokens_saved"] for g in groups["groups"])
    assert total == groups["cacheable_tokens"]
    assert groups["cacheability"] >= doc["summary"]["hit_rate"]
    assert "upper bound" in groups["meaning"]


def test_text_and_html_show_the_groups(tmp_path: Path) -> None:
    rows = [chat([system(), user(f"Question {i}?")], id=f"n{i}") for i in range(3)]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    text = run([str(path)]).stdout
    assert "── shared prefixes" in text and "cacheability" in text and "upper bound" in text
    assert '0 "n0", 1 "n1", 2 "n2"' in text
    html = tmp_path / "a.html"
    run([str(path), "--html", str(html)])
    assert 'id="groups"' in html.read_text() and 'href="#p1"' in html.read_text()


@pytest.mark.parametrize("seed", range(6))
def test_savings_add_up_to_the_cacheable_tokens(seed: int) -> None:
    rng, bs = random.Random(seed), 4
    heads = [[rng.randrange(50) for _ in range(rng.randrange(4, 30))] for _ in range(4)]
    index, prompts = PrefixIndex(bs), []
    for i in range(60):
        ids = rng.choice(heads) + [rng.randrange(50) for _ in range(rng.randrange(0, 20))]
        if rng.random() < 0.3 and prompts:
            ids = rng.choice(prompts) + ids[:5]  # a later turn of an earlier prompt
        raw = token_bytes(ids)
        index.insert(i, raw, None, index.match(ids, raw, None))
        prompts.append(ids)
    report = prefix_groups(index, sum(map(len, prompts)), top=10_000)
    assert sum(g.tokens_saved for g in report.groups) == report.cacheable_tokens
    # Brute force: a full block counts once per prompt after the first with that whole prefix.
    seen, expected = set(), 0
    for ids in prompts:
        for j in range(len(ids) // bs):
            key = tuple(ids[: (j + 1) * bs])
            expected += bs if key in seen else 0
            seen.add(key)
    assert report.cacheable_tokens == expected
    for g in report.groups:  # every example prompt really starts with the group's prefix
        head = prompts[g.owner][: g.tokens]
        assert all(prompts[i][: g.tokens] == head for i in g.examples)
        assert g.prompts == sum(p[: g.tokens] == head for p in prompts)

"""Each rule: a case it must report (with the exact place) and a close case it must not."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from test_audit_support import (
    SYSTEM,
    TOOLS,
    assistant,
    audit_json,
    chat,
    rules,
    system,
    tool_call,
    tool_result,
    user,
)  # fmt: skip

from kvcli.audit.render import IM_START

HEAD = IM_START + "system\n"  # what precedes the system text in the rendering


def only(doc: dict, rule: str) -> list[dict]:
    return [f for f in doc["findings"] if f["rule"] == rule]


def loud(doc: dict) -> list[tuple[str, int]]:
    return rules(doc, "error") + rules(doc, "warning")


# ---- volatile-prefix --------------------------------------------------------------
def test_volatile_timestamp_in_system_prompt(tmp_path: Path) -> None:
    rows = [chat([system(f"Current time: 2025-03-14T09:26:0{i}Z\n" + SYSTEM), user("How do I rotate keys?")]) for i in range(3)]
    doc = audit_json(tmp_path, rows)
    errors = [f for f in only(doc, "volatile-prefix") if f["severity"] == "error"]
    assert [(f["prompt"], f["against"]) for f in errors] == [(1, 0), (2, 0)]
    assert {f["char"] for f in errors} == {len(HEAD) + len("Current time: 2025-03-14T09:26:0")}
    assert "timestamp '2025-03-14T09:26:01Z'" in errors[0]["message"]
    assert errors[0]["excerpt"]["other"] is not None and "09:26:00Z" in errors[0]["excerpt"]["other"]
    assert errors[0]["tokens_at_stake"] > 150
    assert "metadata" in errors[0]["fix"]
    latent = [f for f in only(doc, "volatile-prefix") if f["severity"] == "warning"]
    assert [f["prompt"] for f in latent] == [0]  # the value sits in the prefix of the first prompt too


def test_volatile_values_not_in_the_shared_prefix_are_fine(tmp_path: Path) -> None:
    questions = ["How do I rotate keys?", "Why was I billed twice?", "Where are my logs?"]
    rows = [chat([system("Knowledge cutoff: 2024-06-01.\n" + SYSTEM), user(f"[2025-03-14T09:2{i}:00Z] {q}")])
            for i, q in enumerate(questions)]  # fmt: skip
    doc = audit_json(tmp_path, rows)
    assert loud(doc) == []
    assert [f["severity"] for f in only(doc, "volatile-prefix")] == ["info"]  # a plain date: a hint only


# ---- unsorted-json ----------------------------------------------------------------
def _agent_turns(args_turn2: str, args_turn3: str) -> list[dict]:
    t1 = [system(), user("Find the docs on key rotation.")]
    t2 = t1 + [tool_call("c1", "search_docs", args_turn2), tool_result("c1", '{"hits":["keys/rotate"]}')]
    t3 = t1 + [tool_call("c1", "search_docs", args_turn3), tool_result("c1", '{"hits":["keys/rotate"]}'),
               assistant("Use `acme keys rotate`."), user("Thanks!")]  # fmt: skip
    return [chat(t, TOOLS, session_id="s1") for t in (t1, t2, t3)]


@pytest.mark.parametrize(
    ("turn3", "kind"),
    [('{"query":"rotation","limit":3}', "key order ($: keys (query, limit) vs (limit, query))"),
     ('{"limit": 3, "query": "rotation"}', "separators/whitespace")],
)  # fmt: skip
def test_unsorted_json_in_tool_call_arguments(tmp_path: Path, turn3: str, kind: str) -> None:
    doc = audit_json(tmp_path, _agent_turns('{"limit":3,"query":"rotation"}', turn3))
    (finding,) = only(doc, "unsorted-json")
    assert (finding["severity"], finding["prompt"], finding["against"]) == ("error", 2, 1)
    assert kind in finding["message"]
    assert finding["segment"] == "messages[2] assistant"
    assert "sort_keys=True" in finding["fix"]
    assert [r for r in loud(doc) if r[0] != "unsorted-json"] == []


def test_different_arguments_are_not_a_serialization_problem(tmp_path: Path) -> None:
    doc = audit_json(tmp_path, _agent_turns('{"limit":3,"query":"rotation"}', '{"limit":5,"query":"rotation"}'))
    assert only(doc, "unsorted-json") == []
    assert [r[0] for r in loud(doc)] == ["mid-prompt-edit"]  # the call itself was rewritten


def test_same_object_serialized_two_ways_across_conversations(tmp_path: Path) -> None:
    one = chat([system(), user("a"), tool_call("c", "search_docs", '{"query":"x","limit":1}')], TOOLS)
    two = chat([system(), user("b"), tool_call("c", "search_docs", '{"limit":1,"query":"x"}')], TOOLS)
    doc = audit_json(tmp_path, [one, two])
    findings = only(doc, "unsorted-json")
    assert [(f["severity"], f["prompt"]) for f in findings] == [("info", 0), ("warning", 1)]
    assert "arguments of 'search_docs'" in findings[1]["message"]


# ---- dynamic-tools ----------------------------------------------------------------
def test_tools_added_reordered_and_edited_in_a_session(tmp_path: Path) -> None:
    extra = {"type": "function", "function": {"name": "get_invoice", "parameters": {"type": "object"}}}
    edited = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "Search all docs."}}, TOOLS[1], extra]
    msgs = [system(), user("Why is my invoice higher?")]
    tool_lists = [TOOLS, TOOLS + [extra], [extra, *TOOLS], edited, edited]
    doc = audit_json(tmp_path, [chat(msgs + [assistant("ok"), user(str(i))] * i, t, session_id="s") for i, t in enumerate(tool_lists)])
    found = only(doc, "dynamic-tools")
    assert [(f["prompt"], f["severity"]) for f in found] == [(1, "error"), (2, "error"), (3, "error")]
    assert "'get_invoice' added" in found[0]["message"]
    # The char is where the two prompts really part (inside the first tool's name), and the
    # message says the same char (issue 16, bug 12: it said char 0 while they shared 61 chars).
    assert "reordered" in found[1]["message"] and found[1]["char"] == 61
    assert "from char 61 on" in found[1]["message"]
    assert "'search_docs' edited (description)" in found[2]["message"]
    assert found[0]["char"] > 0 and found[0]["segment"] == "tools[2] get_invoice"


def test_tools_changing_in_a_stream_without_sessions(tmp_path: Path) -> None:
    """Without session keys, requests with the same system prompt (one application) are compared."""
    rows = [chat([system(), user("first")], TOOLS), chat([system(), user("second")], TOOLS[:1]),
            chat([system("Another app."), user("third")], TOOLS[1:]), chat([system(), user("fourth")])]  # fmt: skip
    found = only(audit_json(tmp_path, rows), "dynamic-tools")
    assert [(f["prompt"], f["against"]) for f in found] == [(1, 0)]
    assert "'create_ticket' removed" in found[0]["message"]


def test_same_tools_with_keys_reordered_are_not_dynamic(tmp_path: Path) -> None:
    swapped = [{"function": t["function"], "type": t["type"]} for t in TOOLS]
    msgs = [system(), user("hello")]
    doc = audit_json(tmp_path, [chat(msgs, TOOLS, session_id="s"), chat(msgs + [assistant("hi"), user("again")], swapped, session_id="s")])
    assert only(doc, "dynamic-tools") == []
    (finding,) = doc["findings"]  # the key order is what breaks the prefix, at its divergence
    assert (finding["rule"], finding["severity"], finding["segment"]) == ("unsorted-json", "error", "tools[0] search_docs")


# ---- mid-prompt-edit ----------------------------------------------------------------
U = [user(f"Question {i}: how does feature {i} work in detail?") for i in range(6)]
A = [assistant(f"Answer {i}: feature {i} works like this, step by step.") for i in range(6)]


@pytest.mark.parametrize(
    ("before", "after", "how", "index"),
    [
        ([U[0], A[0], U[1]], [U[0], assistant("Answer 0, rewritten."), U[1], A[1], U[2]], "edited", 2),
        ([U[0], A[0], U[1], A[1], U[2]], [U[1], A[1], U[2], A[2], U[3]], "dropped", 1),
        ([U[0], A[0], U[1], A[1], U[2]], [assistant("Summary of turns 0-1."), U[2], A[2], U[3]], "summarized", 1),
        ([U[0], A[0], U[1]], [U[0], user("Reminder: be brief."), A[0], U[1], A[1], U[2]], "inserted", 2),
        ([U[0], A[0], U[1], A[1], U[2]], [U[0], A[1], U[1], A[0], U[2], A[2], U[3]], "reordered", 2),
    ],
)  # fmt: skip
def test_mid_prompt_edits_are_classified(tmp_path: Path, before: list, after: list, how: str, index: int) -> None:
    doc = audit_json(tmp_path, [chat([system(), *before], session_id="s"), chat([system(), *after], session_id="s")])
    (finding,) = only(doc, "mid-prompt-edit")
    assert (finding["prompt"], finding["against"], finding["severity"]) == (1, 0, "error")
    assert f"messages[{index}]" in finding["message"] and f"was {how}" in finding["message"]
    text_start = finding["char"]
    assert text_start > len(HEAD + SYSTEM)


def test_append_only_and_resent_last_turn_are_fine(tmp_path: Path) -> None:
    rows = [
        chat([system(), U[0]], session_id="s"),
        chat([system(), U[0], A[0], U[1]], session_id="s"),
        chat([system(), U[0], A[0], user("Question 1, asked differently?")], session_id="s"),  # edit & resend
        chat([system(), U[3]], session_id="other"),
    ]
    assert audit_json(tmp_path, rows)["findings"] == []


# ---- below-minimum ----------------------------------------------------------------
def test_below_minimum_for_openai_only(tmp_path: Path) -> None:
    rows = [chat([system(), user(q)]) for q in ("How do I rotate keys?", "Why was I billed twice?")]
    openai = audit_json(tmp_path, rows, "--profile", "openai")
    (finding,) = only(openai, "below-minimum")
    assert finding["prompt"] == 1 and "at least 1024 tokens" in finding["message"]
    assert openai["summary"]["cached_tokens"] == 0
    assert only(audit_json(tmp_path, rows), "below-minimum") == []


def test_long_shared_prefix_is_cached_in_128_token_steps(tmp_path: Path) -> None:
    rows = [chat([system(SYSTEM * 7), user(q)]) for q in ("How do I rotate keys?", "Why was I billed twice?")]
    doc = audit_json(tmp_path, rows, "--profile", "openai")
    lcp = doc["prompts"][1]["first_divergence"]["token"]
    assert lcp >= 1024 and doc["prompts"][1]["cached_tokens"] == lcp // 128 * 128
    assert doc["block_size"] == 128 and only(doc, "below-minimum") == []


# ---- whitespace-drift ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("variant", "kind"),
    [
        (SYSTEM.replace("briefly, ", "briefly,\r\n"), "line endings"),
        (SYSTEM.replace("briefly, ", "briefly,  "), "whitespace"),
        (SYSTEM.replace("briefly, ", "briefly, \u200b"), "zero-width"),
        ("Café policy. " + SYSTEM, "Unicode normalization"),
    ],
)  # fmt: skip
def test_whitespace_drift(tmp_path: Path, variant: str, kind: str) -> None:
    base = SYSTEM if not variant.startswith("Café") else unicodedata.normalize("NFD", "Café policy. ") + SYSTEM
    if kind == "line endings":
        base = SYSTEM.replace("briefly, ", "briefly,\n")
    doc = audit_json(tmp_path, [chat([system(base), user("hi")]), chat([system(variant), user("hi")])])
    (finding,) = only(doc, "whitespace-drift")
    assert finding["severity"] == "error" and kind in finding["message"]
    assert finding["tokens_at_stake"] > 100
    assert loud(doc) == [("whitespace-drift", 1)]


def test_a_real_word_change_is_not_whitespace_drift(tmp_path: Path) -> None:
    doc = audit_json(tmp_path, [chat([system(), user("hi")]), chat([system(SYSTEM.replace("briefly", "shortly")), user("hi")])])
    assert only(doc, "whitespace-drift") == []


# ---- per-user-prefix ----------------------------------------------------------------
def test_user_names_in_the_system_prompt(tmp_path: Path) -> None:
    people = [("Dana", "dana@example.com"), ("Ravi", "ravi.m@example.org")]
    rows = [chat([system(f"You are helping {n} <{e}>.\n" + SYSTEM), user("hi")], user=n) for n, e in people]
    (finding,) = only(audit_json(tmp_path, rows), "per-user-prefix")
    assert finding["severity"] == "warning" and "'Ravi <ravi.m@example.org'" in finding["message"]
    assert "email address" in finding["message"]


def test_one_users_system_prompt_changing_is_not_per_user_data(tmp_path: Path) -> None:
    rows = [chat([system("Plan: Hobby.\n" + SYSTEM), user("hi")], user="u1"),
            chat([system("Plan: Pro.\n" + SYSTEM), user("hi"), assistant("hello"), user("upgrade done")], user="u1")]  # fmt: skip
    doc = audit_json(tmp_path, rows)
    assert only(doc, "per-user-prefix") == [] and [r[0] for r in loud(doc)] == ["mid-prompt-edit"]


# ---- unstable-order -----------------------------------------------------------------
CHUNKS = [f"[doc {i}] " + " ".join(f"fact{i}-{j}" for j in range(30)) for i in range(4)]


def test_reordered_retrieved_chunks(tmp_path: Path) -> None:
    rows = [chat([system(), user("\n\n".join(CHUNKS[j] for j in order) + "\n\nQuestion?")]) for order in ([0, 1, 2, 3], [1, 0, 3, 2])]
    (finding,) = only(audit_json(tmp_path, rows), "unstable-order")
    assert finding["severity"] == "error" and finding["message"].startswith("2 paragraphs")


def test_different_chunks_are_not_a_reorder(tmp_path: Path) -> None:
    rows = [chat([system(), user("\n\n".join(CHUNKS[:2]))]), chat([system(), user("\n\n".join(CHUNKS[2:]))])]
    assert only(audit_json(tmp_path, rows), "unstable-order") == []


# ---- model-switch -------------------------------------------------------------------
def test_model_switch_within_a_session(tmp_path: Path) -> None:
    rows = [chat([system(), U[0]], session_id="s", model="gpt-4o"),
            chat([system(), U[0], A[0], U[1]], session_id="s", model="gpt-4o-mini"),
            chat([system(), U[2]], session_id="t", model="gpt-4o")]  # fmt: skip
    found = only(audit_json(tmp_path, rows), "model-switch")
    assert [(f["prompt"], f["severity"]) for f in found] == [(1, "warning")]
    assert "'gpt-4o' to 'gpt-4o-mini'" in found[0]["message"]


# ---- cache-breakpoints (anthropic) ---------------------------------------------------
def test_anthropic_breakpoints_and_lookback(tmp_path: Path) -> None:
    def blocks(n: int, mark: int | None = None) -> list:
        return [{"type": "text", "text": f"note {i}", **({"cache_control": {"type": "ephemeral"}} if i == mark else {})} for i in range(n)]

    first = chat([system(), {"role": "user", "content": blocks(1, mark=0)}])
    near = chat([system(), {"role": "user", "content": blocks(1)}, {"role": "user", "content": blocks(5, mark=4)}])
    far = chat([system(), {"role": "user", "content": blocks(1)}, {"role": "user", "content": blocks(30, mark=29)}])
    doc = audit_json(tmp_path, [first, near, far], "--profile", "anthropic", "--min-tokens", "64")
    cached = [p["cached_tokens"] for p in doc["prompts"]]
    assert cached[0] == 0 and cached[1] > 200 and cached[2] == 0
    (finding,) = only(doc, "cache-breakpoints")
    assert finding["prompt"] == 2 and "20 blocks" in finding["message"]
    many = chat([system(), {"role": "user", "content": [{**b, "cache_control": {"type": "ephemeral"}} for b in blocks(5)]}])
    doc = audit_json(tmp_path, [many], "--profile", "anthropic")
    assert [(f["rule"], f["severity"]) for f in doc["findings"]] == [("cache-breakpoints", "error"),
                                                                      ("cache-breakpoints", "warning")]
    assert "at most 4" in doc["findings"][0]["message"]
    assert "5 breakpoint(s) below" in doc["findings"][1]["message"]  # a prompt below 1,024 tokens, too


# ---- a clean stream -----------------------------------------------------------------
def test_clean_append_only_conversations_have_no_warning(tmp_path: Path) -> None:
    rows = []
    for session, opening in (("a", U[0]), ("b", U[3])):
        turn = [system(), opening]
        for k in range(3):
            rows.append(chat(list(turn), TOOLS, session_id=session, model="gpt-4o"))
            turn += [tool_call(f"c{k}", "search_docs", '{"limit":3,"query":"x"}'), tool_result(f"c{k}", "ok"), A[k], U[k + 1]]
    doc = audit_json(tmp_path, rows)
    assert loud(doc) == []
    assert doc["summary"]["hit_rate"] > 0.6

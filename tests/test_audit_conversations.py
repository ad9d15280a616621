"""Conversations without session keys are matched by the messages they repeat, not only by
their opening message: a compacted history is recognised, independent chats are not."""

from __future__ import annotations

from pathlib import Path

from test_audit_support import SAMPLES, assistant, audit_json, chat, run, system, user

from kvcli.audit.shapes import longest_common_run

U = [user(f"Turn {i}: please explain part {i} of the deployment guide in detail.") for i in range(6)]
A = [assistant(f"Part {i} covers step {i}: configure, build, then verify the health check.") for i in range(6)]
SUMMARY = user("Summary of the conversation so far: the user deployed the app and asked about parts 0-2.")


def _history(turns: int) -> list[dict]:
    messages = [system()]
    for k in range(turns):
        messages += [U[k], A[k]]
    return messages


def test_longest_common_run_finds_the_kept_turns() -> None:
    assert longest_common_run([1, 2, 3, 4, 5], [9, 3, 4, 5, 7]) == (3, 2, 1)
    assert longest_common_run([1, 2], [3, 4]) == (0, 0, 0)
    assert longest_common_run([1, 2, 1, 2, 3], [1, 2, 3]) == (3, 2, 0)


def test_compacted_history_is_the_same_conversation(tmp_path: Path) -> None:
    """Turns 0-2 replaced by a summary, turns 3-4 kept: the opening differs, the later turns match."""
    before = _history(5) + [U[5]]
    compacted = [system(), SUMMARY, U[3], A[3], U[4], A[4], U[5]]
    doc = audit_json(tmp_path, [chat(before), chat(compacted)])
    (finding,) = [f for f in doc["findings"] if f["rule"] == "mid-prompt-edit"]
    assert (finding["prompt"], finding["against"], finding["severity"]) == (1, 0, "error")
    assert "messages[1] (user) was summarized since prompt 0" in finding["message"]
    assert "messages[2:7] repeat messages[7:12] there" in finding["message"]
    excerpt = finding["excerpt"]  # both sides: the summary here, the original opening there
    assert "Summary of the conversation" in excerpt["this"]
    assert "Turn 0" in excerpt["other"]
    assert finding["segment"] == "messages[1] user"


def test_rewritten_opening_with_an_appended_turn(tmp_path: Path) -> None:
    first = [system(), U[0], A[0], U[1], A[1], U[2]]
    rewritten = [system(), user("Turn 0, reworded: explain part 0."), A[0], U[1], A[1], U[2], A[2], U[3]]
    doc = audit_json(tmp_path, [chat(first), chat(rewritten)])
    (finding,) = [f for f in doc["findings"] if f["rule"] == "mid-prompt-edit"]
    assert finding["prompt"] == 1 and "messages[1] (user) was edited" in finding["message"]


def test_independent_conversations_sharing_a_system_prompt_stay_apart(tmp_path: Path) -> None:
    """Same system prompt, same short assistant reply, different users: no conversation link."""
    ok = assistant("Sure, I can help with that.")
    rows = [chat([system(), user(f"User {i} asks about invoice {i}."), ok, user(f"Invoice {i} is wrong.")])
            for i in range(4)]
    doc = audit_json(tmp_path, rows)
    assert [f for f in doc["findings"] if f["severity"] != "info"] == []


def test_one_shared_message_is_not_enough(tmp_path: Path) -> None:
    first = [system(), U[0], A[0], U[1]]
    other = [system(), user("Something else entirely."), A[0], user("And now?")]
    doc = audit_json(tmp_path, [chat(first), chat(other)])
    assert [f["rule"] for f in doc["findings"]] == []


def test_clean_samples_stay_clean() -> None:
    result = run([str(SAMPLES / "clean.jsonl"), "--fail-on", "info"])
    assert result.exit_code == 0, result.output
    assert "0 errors · 0 warnings · 0 info" in result.stdout


def test_session_keys_still_decide(tmp_path: Path) -> None:
    """With session keys, a compacted request of another session is not this session's turn."""
    before = _history(5) + [U[5]]
    compacted = [system(), SUMMARY, U[3], A[3], U[4], A[4], U[5]]
    doc = audit_json(tmp_path, [chat(before, session_id="a"), chat(compacted, session_id="b")])
    assert [f for f in doc["findings"] if f["rule"] == "mid-prompt-edit"] == []

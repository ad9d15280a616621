"""The llamacpp profile: each llama-server slot keeps its last prompt; no sharing across slots."""

from __future__ import annotations

from pathlib import Path

from test_audit_support import SAMPLES, audit_json, run

from kvcli.audit.prefix_index import token_bytes
from kvcli.audit.slots import SlotCache

A = [1, 2, 3, 4, 5, 6, 7, 8]
B = [9, 9, 9, 9, 9, 9, 9, 9]


def test_one_slot_reuses_only_the_previous_prompt() -> None:
    cache = SlotCache(slots=1)
    assert [cache.step(token_bytes(p)) for p in (A, A + [1], B, A + [2])] == [0, 8, 0, 0]


def test_more_slots_keep_more_prompts_and_pick_the_most_similar() -> None:
    cache = SlotCache(slots=2)
    assert [cache.step(token_bytes(p)) for p in (A, B, A + [1], B + [2], A[:4] + [0])] == [0, 0, 8, 8, 4]


def test_a_weak_match_goes_to_the_least_recently_used_slot() -> None:
    cache = SlotCache(slots=2, similarity=0.5)
    cache.step(token_bytes(A))
    cache.step(token_bytes(B))
    # Shares 1 of 8 tokens with slot 0: below the similarity, so slot 0 (least recently used)
    # is taken anyway and reuses that one token; slot 1 keeps B.
    assert cache.step(token_bytes([1, 0, 0, 0, 0, 0, 0, 0])) == 1
    assert cache.step(token_bytes(B + [3])) == 8


def test_interleaved_applications_thrash_one_slot(tmp_path: Path) -> None:
    shared = " ".join(["alpha beta gamma delta"] * 20)
    rows = [{"prompt": f"App {k}: {shared} question {i}"} for i in range(3) for k in range(2)]
    one = [p["cached_tokens"] for p in audit_json(tmp_path, rows, "--profile", "llamacpp")["prompts"]]
    two = [p["cached_tokens"] for p in audit_json(tmp_path, rows, "--profile", "llamacpp", "--slots", "2")["prompts"]]
    assert max(one) < 10 and sum(two[2:]) > 4 * 60  # two slots keep each application's prefix


def test_slots_and_cache_size_are_refused_where_they_do_not_apply() -> None:
    clean = str(SAMPLES / "clean.jsonl")
    assert "has no slots" in run([clean, "--slots", "2"]).output
    result = run([clean, "--profile", "llamacpp", "--cache-size", "64blocks"])
    assert result.exit_code == 2 and "keeps one prompt per slot" in result.output

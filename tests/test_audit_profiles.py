"""The vllm and sglang profiles: vLLM's full-block rule, SGLang's token-granular radix tree."""

from __future__ import annotations

from pathlib import Path

from test_audit_support import SAMPLES, audit_json, run

from kvcli.audit.hits import radix_cached_tokens
from kvcli.audit.profiles import get_profile

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def test_radix_rule_counts_tokens_and_keeps_the_last() -> None:
    assert radix_cached_tokens(37, 100, True, 1) == 37  # no rounding to blocks
    assert radix_cached_tokens(100, 100, True, 1) == 99  # one token is always computed
    assert radix_cached_tokens(0, 100, True, 1) == 0


def test_vllm_predicts_what_kvcli_does(tmp_path: Path) -> None:
    rows = [{"prompt": " ".join(WORDS * 8) + f" question {i}"} for i in range(4)]
    kvcli = audit_json(tmp_path, rows)
    vllm = audit_json(tmp_path, rows, "--profile", "vllm")
    assert [p["cached_tokens"] for p in vllm["prompts"]] == [p["cached_tokens"] for p in kvcli["prompts"]]
    assert vllm["profile"]["name"] == "vllm" and "get_computed_blocks" in vllm["profile"]["source"]


def test_sglang_reuses_the_shared_part_of_a_partial_block(tmp_path: Path) -> None:
    shared = " ".join(WORDS * 3)
    rows = [{"prompt": shared + " first question about the deployment"},
            {"prompt": shared + " second question about billing"},
            {"prompt": shared + " second question about billing"}]
    blocks = audit_json(tmp_path, rows)
    radix = audit_json(tmp_path, rows, "--profile", "sglang")
    lcp = radix["prompts"][1]["first_divergence"]["token"]
    cached = [p["cached_tokens"] for p in radix["prompts"]]
    assert cached[:2] == [0, lcp] and lcp % 16 != 0
    assert cached[2] == radix["prompts"][2]["tokens"] - 1  # a repeat: all but its last token
    assert blocks["prompts"][1]["cached_tokens"] == lcp // 16 * 16
    assert radix["capacity"] is None
    assert "not a bound here" in radix["prefix_groups"]["meaning"]


def test_sglang_has_no_block_pool_to_bound() -> None:
    result = run([str(SAMPLES / "clean.jsonl"), "--profile", "sglang", "--cache-size", "64blocks"])
    assert result.exit_code == 2 and "radix tree" in result.output


def test_profiles_name_their_sources() -> None:
    for name in ("vllm", "sglang"):
        profile = get_profile(name)
        assert profile.source and profile.as_of

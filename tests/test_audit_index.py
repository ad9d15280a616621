"""The hit model and the prefix index against brute force, and predict_cached_tokens."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.audit import predict_cached_tokens
from kvcli.audit.prefix_index import PrefixIndex, token_bytes
from kvcli.hashing import hash_token_blocks


def test_predict_cached_tokens_counts_leading_full_blocks() -> None:
    a = list(range(40))
    b = list(range(40)) + [7, 7, 7]
    c = list(range(20)) + [99] * 30
    assert predict_cached_tokens([a, b, c], block_size=16) == [0, 32, 16]


def test_at_least_one_token_is_computed() -> None:
    """A repeated prompt of exactly two blocks reuses only one: its last token is recomputed."""
    a = list(range(32))
    assert predict_cached_tokens([a, a], block_size=16) == [0, 16]
    assert predict_cached_tokens([a, a + [1]], block_size=16) == [0, 32]


def test_cache_salt_isolates() -> None:
    a = list(range(64))
    assert predict_cached_tokens([a, a, a], 16, ["alice", "bob", "alice"]) == [0, 0, 48]


def test_block_size_is_respected() -> None:
    a = list(range(100))
    assert predict_cached_tokens([a, a], block_size=32) == [0, 96]
    assert predict_cached_tokens([a, a], block_size=7) == [0, 98]


def brute_force(prompts: list[list[int]], i: int) -> tuple[int, int | None]:
    """Longest common token prefix of prompt i with any earlier one, and the earliest such prompt."""
    best, against = 0, None
    for j in range(i):
        n = 0
        while n < min(len(prompts[i]), len(prompts[j])) and prompts[i][n] == prompts[j][n]:
            n += 1
        if n > best:
            best, against = n, j
    return best, against


# Small vocabularies and shared stems make long common prefixes, ties and branches likely.
stems = st.lists(st.integers(0, 3), min_size=0, max_size=40)
prompt_lists = st.lists(
    st.tuples(st.sampled_from([[], [1] * 16, [1, 2, 3] * 9]), stems).map(lambda t: t[0] + t[1]),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(prompts=prompt_lists, block_size=st.sampled_from([1, 2, 4, 16]))
def test_index_matches_brute_force(prompts: list[list[int]], block_size: int) -> None:
    index = PrefixIndex(block_size)
    predicted = predict_cached_tokens(prompts, block_size)
    for i, ids in enumerate(prompts):
        raw = token_bytes(ids)
        match = index.match(ids, raw, None, hint=i - 1)
        lcp, against = brute_force(prompts, i)
        assert match.lcp == lcp
        assert match.against == against  # ties go to the earliest prompt
        assert match.hashes == hash_token_blocks(ids, block_size)
        cached = max(0, min(match.blocks, (len(ids) - 1) // block_size)) * block_size
        assert cached == predicted[i]
        index.insert(i, raw, None, match)
    for i, ids in enumerate(prompts):
        assert index.tokens_of(i) == ids


def test_hint_is_only_a_shortcut() -> None:
    """A wrong or stale hint gives the same match as none."""
    prompts = [list(range(64)), list(range(32)) + [5] * 32, list(range(64)) + [9]]
    for hint in (None, 0, 1):
        index = PrefixIndex(16)
        for i, ids in enumerate(prompts):
            match = index.match(ids, token_bytes(ids), None, hint=hint if i == 2 else None)
            index.insert(i, token_bytes(ids), None, match)
        assert (match.blocks, match.lcp, match.against) == (4, 64, 0)


def test_salted_prompts_only_match_their_salt() -> None:
    index = PrefixIndex(16)
    ids = list(range(48))
    for i, salt in enumerate(["a", "b"]):
        match = index.match(ids, token_bytes(ids), salt)
        assert match.against is None and match.lcp == 0
        index.insert(i, token_bytes(ids), salt, match)
    match = index.match(ids, token_bytes(ids), "a")
    assert (match.lcp, match.against, match.hashes) == (48, 0, hash_token_blocks(ids, 16, "a"))

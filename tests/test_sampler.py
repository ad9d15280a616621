"""The sampler's greedy rule: the same token transformers' generate() picks."""

from __future__ import annotations

import torch

from kvcli.engine.sampler import _argmax_rows, greedy_rows


def test_greedy_argmax_keeps_torchs_first_index_rule():
    """The sampler's NumPy argmax picks what torch.argmax (transformers' greedy step) picks,
    ties and NaN included."""
    torch.manual_seed(3)
    logits = torch.randn(33, 1000)
    logits[0, [7, 900]] = 50.0  # a tie: the first index wins
    logits[1, 5] = float("nan")
    logits[2] = 0.0
    assert _argmax_rows(logits) == logits.argmax(dim=-1).tolist()


def test_greedy_rows_is_argmax_and_finds_every_unusable_row():
    """One pass gives the greedy tokens and the rows the engine fails: a NaN anywhere, +inf,
    or all -inf; finite rows (a -inf among them included) are not flagged."""
    torch.manual_seed(4)
    logits = torch.randn(6, 500)
    logits[0, [3, 400]] = float("nan")
    logits[1, 9] = float("inf")
    logits[2] = float("-inf")
    logits[3, 7] = float("-inf")
    logits[4, [10, 20]] = 40.0
    top, bad = greedy_rows(logits)
    assert bad == [0, 1, 2]
    assert top[3:] == logits[3:].argmax(dim=-1).tolist() and top[4] == 10
    assert greedy_rows(torch.randn(3, 50))[1] == []

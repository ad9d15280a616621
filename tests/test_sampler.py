"""The sampler's greedy rule: the same token transformers' generate() picks."""

from __future__ import annotations

import torch

from kvcli.engine.sampler import _argmax_rows


def test_greedy_argmax_keeps_torchs_first_index_rule():
    """The sampler's NumPy argmax picks what torch.argmax (transformers' greedy step) picks,
    ties and NaN included."""
    torch.manual_seed(3)
    logits = torch.randn(33, 1000)
    logits[0, [7, 900]] = 50.0  # a tie: the first index wins
    logits[1, 5] = float("nan")
    logits[2] = 0.0
    assert _argmax_rows(logits) == logits.argmax(dim=-1).tolist()

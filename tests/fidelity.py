"""Tie-aware comparison of kvcli's greedy output with transformers' generate()."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

TIE_TOLERANCE = 1e-4


@dataclass(slots=True)
class HFReference:
    """transformers greedy continuations of each prompt, run one prompt at a time (no padding)."""

    model_dir: Path
    max_new_tokens: int
    model: object = field(init=False)
    cache: dict[tuple[int, ...], list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.model.eval()
        gc = self.model.generation_config
        gc.eos_token_id = None  # compare full lengths; kvcli runs with ignore_eos
        gc.pad_token_id = 0

    def generate(self, prompt: list[int]) -> list[int]:
        import torch

        key = tuple(prompt)
        if key not in self.cache:
            ids = torch.tensor([prompt])
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=self.max_new_tokens,
                                      min_new_tokens=self.max_new_tokens)
            self.cache[key] = out[0, len(prompt):].tolist()
        return self.cache[key]

    def top2_gap(self, ids: list[int]) -> float:
        import torch

        with torch.no_grad():
            logits = self.model(torch.tensor([ids])).logits[0, -1]
        top = logits.topk(2).values
        return float(top[0] - top[1])


def compare(ref: HFReference, prompt: list[int], ours: list[int]) -> int:
    """0 if equal, 1 if the first difference is a tie in transformers; AssertionError otherwise."""
    theirs = ref.generate(prompt)
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for j, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            gap = ref.top2_gap(prompt + theirs[:j])
            assert gap <= TIE_TOLERANCE, (
                f"greedy mismatch at output token {j}: kvcli {a}, transformers {b}, "
                f"top-2 gap {gap:.2e} (not a tie)"
            )
            return 1
    return 0

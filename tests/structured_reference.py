"""transformers generate() under xgrammar's own logits processor: the reference for kvcli's
constrained greedy decoding, tie-aware as tests/fidelity.py is.

The grammar is compiled from the same vocabulary reading as the engine's
(kvcli.structured.vocab, checked against xgrammar's from_huggingface in
test_structured_vocab.py); the masking, the matcher advancing and the stopping are
xgrammar's and transformers', independent of kvcli's engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fidelity import TIE_TOLERANCE

from kvcli.structured import StructuredOutputsParams
from kvcli.structured.grammars import GrammarCache


@dataclass(slots=True)
class ConstrainedReference:
    model_dir: Path
    max_new_tokens: int
    model: Any = field(init=False)
    grammars: GrammarCache = field(init=False)
    eos: list[int] = field(init=False)

    def __post_init__(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from kvcli.engine.config import EngineConfig
        from kvcli.model.loader import read_eos_token_ids
        from kvcli.tokenizer import Tokenizer

        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.model.eval()
        self.eos = list(read_eos_token_ids(self.model_dir))
        vocab = self.model.config.vocab_size
        self.grammars = GrammarCache(Tokenizer.from_dir(self.model_dir), vocab, tuple(self.eos),
                                     EngineConfig().structured_compile_timeout)

    def generate(self, prompt: list[int], params: StructuredOutputsParams) -> list[int]:
        import torch
        from xgrammar.contrib.hf import LogitsProcessor

        ids = torch.tensor([prompt])
        processor = LogitsProcessor(self.grammars.get(params).result())  # single use: one per call
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=self.max_new_tokens, eos_token_id=self.eos,
                                  pad_token_id=self.eos[0], logits_processor=[processor])
        return out[0, len(prompt):].tolist()

    def masked_top2_gap(self, prompt: list[int], output: list[int],
                        params: StructuredOutputsParams) -> float:
        """Gap between the two best tokens the grammar allows after ``output``."""
        import torch
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(self.grammars.get(params).result())
        for token in output:
            assert matcher.accept_token(token)
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt + output])).logits[:, -1].float()
        mask = xgr.allocate_token_bitmask(1, logits.shape[-1])
        matcher.fill_next_token_bitmask(mask, 0)
        xgr.apply_token_bitmask_inplace(logits, mask)
        top = logits[0].topk(2).values
        return float(top[0] - top[1])

    def compare(self, prompt: list[int], ours: list[int],
                params: StructuredOutputsParams) -> int:
        """0 if equal, 1 if the first difference is a tie; AssertionError otherwise."""
        theirs = self.generate(prompt, params)
        for j, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            if a != b:
                gap = self.masked_top2_gap(prompt, theirs[:j], params)
                assert gap <= TIE_TOLERANCE, (
                    f"constrained greedy mismatch at output token {j}: kvcli {a}, transformers "
                    f"{b}, masked top-2 gap {gap:.2e} (not a tie)")
                return 1
        assert len(ours) == len(theirs), (ours, theirs)
        return 0

"""The real default model (SmolLM2-135M-Instruct) end to end: kvcli equals transformers exactly."""

from __future__ import annotations

import pytest
from fidelity import HFReference, compare

from kvcli.engine.llm import LLM
from kvcli.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

SYSTEM = "You are a concise assistant for a travel agency. Answer in one sentence."
QUESTIONS = ["What is the capital of France?", "Name a famous museum in Paris.",
             "Which river flows through Rome?"]


def test_smollm2_greedy_equals_transformers(default_model_dir):
    llm = LLM(str(default_model_dir))
    tok = llm.engine.tokenizer
    chats = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
             for q in QUESTIONS]
    prompts = [tok.encode(tok.apply_chat_template(c), add_special_tokens=False) for c in chats]
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    ref = HFReference(default_model_dir, 16)
    ties = sum(compare(ref, p, o.outputs[0].token_ids) for p, o in zip(prompts, outs, strict=True))
    assert ties == 0, "the real model's logits are peaked: expect exact equality"
    assert outs[1].num_cached_tokens > 0  # the system prompt was served from the cache
    paris = llm.generate([{"messages": [{"role": "user", "content": QUESTIONS[0]}]}],
                         SamplingParams(max_tokens=20))
    assert paris[0].outputs[0].text == "The capital of France is Paris."

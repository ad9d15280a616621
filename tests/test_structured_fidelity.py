"""Constrained greedy decoding equals transformers generate() with xgrammar's logits processor.

Token for token (tie-aware, on the grammar-masked logits) for JSON Schema, JSON object,
regex, choice and EBNF constraints, with prefix caching on and off, chunked prefill and
preemption; unconstrained rows in the same batch stay byte-identical to a run without any
grammar; every JSON output that ended by its grammar validates against its schema.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from structured_reference import ConstrainedReference

from kvcli.engine.llm import LLM
from kvcli.sampling_params import SamplingParams
from kvcli.structured import StructuredOutputsParams

MAX_NEW = 40
BLOCK = 4
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "urgency": {"enum": ["low", "high"]},
        "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
    },
    "required": ["name", "urgency"],
    "additionalProperties": False,
}
CONSTRAINTS = [
    StructuredOutputsParams(json=SCHEMA),
    StructuredOutputsParams(json_object=True),
    StructuredOutputsParams(regex=r"[a-z]{2,5}-\d{1,3}"),
    StructuredOutputsParams(choice=["red fox", "blue fish", "Paris"]),
    StructuredOutputsParams(grammar='root ::= "(" [0-9]+ (" + " [0-9]+)* ")"'),
]
CONFIGS = {
    "caching": dict(enable_prefix_caching=True),
    "no-caching": dict(enable_prefix_caching=False),
    "chunked": dict(max_num_batched_tokens=5),
    "preemption": dict(num_blocks=24, max_num_batched_tokens=64),
}


def make_prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(3)
    shared = [rng.randrange(3, vocab) for _ in range(16)]
    return [shared + [rng.randrange(3, vocab) for _ in range(n)] for n in (1, 5, 9, 14, 3, 20)]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def setup(request, tiny_models):
    model_dir = tiny_models[request.param]
    return model_dir, ConstrainedReference(model_dir, MAX_NEW)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_constrained_greedy_equals_transformers(setup, config):
    model_dir, ref = setup
    llm = LLM(str(model_dir), block_size=BLOCK, **CONFIGS[config])
    prompts = make_prompts(llm.engine.vocab_size)
    constraints = [CONSTRAINTS[i % len(CONSTRAINTS)] for i in range(len(prompts))]
    params = [SamplingParams(max_tokens=MAX_NEW, structured_outputs=c) for c in constraints]
    outs = llm.generate([list(p) for p in prompts], params)
    ties = 0
    for prompt, out, c in zip(prompts, outs, constraints, strict=True):
        ties += ref.compare(prompt, out.outputs[0].token_ids, c)
    assert ties <= 1, f"{ties} ties in {len(prompts)} prompts"
    if config == "preemption":
        assert llm.engine.stats()["preemptions"] > 0
    for out, c in zip(outs, constraints, strict=True):
        check_valid(out.outputs[0], c)


def check_valid(choice, constraint: StructuredOutputsParams) -> None:
    """An output that ended by its grammar (EOS, not max_tokens) is in the language."""
    if choice.finish_reason != "stop":
        return
    if constraint.kind == "json":
        jsonschema.validate(json.loads(choice.text), constraint.json)
    elif constraint.kind == "json_object":
        assert isinstance(json.loads(choice.text), dict)
    elif constraint.kind == "choice":
        assert choice.text in constraint.choice


def test_unconstrained_rows_keep_their_outputs(tiny_models):
    """Mixing grammar rows into a batch leaves the other rows' tokens as they were, greedy or
    sampled (logprobs up to the float noise of a different batch shape; the sampler-level
    test in test_structured_engine.py shows their logits are not even written)."""
    llm = LLM(str(tiny_models["qwen2"]), block_size=BLOCK)
    prompts = make_prompts(llm.engine.vocab_size)
    plain = [SamplingParams(max_tokens=12, temperature=0.8 * (i % 2), seed=i, logprobs=2)
             for i in range(len(prompts))]
    alone = llm.generate([list(p) for p in prompts], plain)
    mixed_params = [p for pair in zip(plain, CONSTRAINTS * 2, strict=False)
                    for p in (pair[0], SamplingParams(max_tokens=12, structured_outputs=pair[1]))]
    mixed = llm.generate([list(p) for p in prompts for _ in (0, 1)], mixed_params)
    for a, b in zip(alone, mixed[::2], strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert x.keys() == y.keys() and list(x.values()) == pytest.approx(list(y.values()),
                                                                              abs=1e-4)
    assert llm.engine.structured.grammars.num_compiled == len(CONSTRAINTS)

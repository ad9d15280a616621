"""On the real default model, constrained greedy decoding equals transformers + xgrammar exactly
(no ties allowed), and every output that stops validates against its schema."""

from __future__ import annotations

import json

import jsonschema
import pytest
from structured_reference import ConstrainedReference

from kvcli.engine.llm import LLM
from kvcli.sampling_params import SamplingParams
from kvcli.structured import StructuredOutputsParams

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["category", "urgency", "order_id"],
          "properties": {"category": {"enum": ["shipping", "billing", "account", "other"]},
                         "urgency": {"enum": ["low", "medium", "high"]},
                         "order_id": {"type": ["string", "null"], "maxLength": 12}}}
TICKETS = ["My order #A1234 never arrived and it's been 3 weeks!",
           "I was charged twice for order B-889, please refund.",
           "How do I change my password?"]


@pytest.mark.slow
def test_default_model_constrained_equals_transformers(default_model_dir):
    llm = LLM(str(default_model_dir))
    system = "Extract the support ticket as JSON with category, urgency and order_id."
    prompts = [{"messages": [{"role": "system", "content": system},
                             {"role": "user", "content": t}]} for t in TICKETS]
    so = StructuredOutputsParams(json=SCHEMA)
    outs = llm.generate(prompts, SamplingParams(max_tokens=48, structured_outputs=so))
    ref = ConstrainedReference(default_model_dir, 48)
    stopped = 0
    for out in outs:
        assert ref.compare(out.prompt_token_ids, out.outputs[0].token_ids, so) == 0
        if out.outputs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
            stopped += 1
    assert stopped >= 2

"""The engine side of structured outputs: masking, padding ids, errors, n > 1, logprobs, stops."""

from __future__ import annotations

import json
import math
import shutil

import jsonschema
import pytest
import torch
from structured_reference import ConstrainedReference

from kvcli.engine.llm import LLM
from kvcli.engine.request import Request
from kvcli.engine.sampler import Sampler
from kvcli.sampling_params import SamplingParams
from kvcli.structured import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llm(tiny_models):
    return LLM(str(tiny_models["qwen2"]), block_size=4)


def test_sampler_writes_only_constrained_rows(llm):
    """The rows without a grammar are not written at all (bytes compared), and the sampler's
    picks for them equal a sampler without the mask hook."""
    engine = llm.engine
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    grammar = engine._grammar(params).result()
    reqs = [Request(f"r{i}", [5, 6, 7], params if i == 1 else SamplingParams(temperature=0.7))
            for i in range(3)]
    engine.structured.add("r1", grammar)
    logits = torch.randn(3, engine.vocab_size, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    sampler = Sampler(0)
    sampler.logits_mask = engine.structured.mask
    picks = sampler(logits, reqs).token_ids
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert not torch.equal(logits[1], before[1])
    assert picks[::2] == Sampler(0)(before.clone(), reqs).token_ids[::2]
    digits = engine.tokenizer.decode([picks[1]])
    assert digits.isdigit(), digits
    engine.structured.forget("r1")


def test_errors_name_the_field(llm):
    def bad(so: StructuredOutputsParams, match: str) -> None:
        with pytest.raises(ValueError, match=match):
            llm.engine.add_request("x", [5, 6], SamplingParams(structured_outputs=so))

    bad(StructuredOutputsParams(regex="a(b"), r"^structured_outputs\.regex: .*parenthesis")
    bad(StructuredOutputsParams(grammar="root ::= x"), r"^structured_outputs\.grammar: .*x")
    bad(StructuredOutputsParams(grammar='root ::= root "a"'), "accepts no output")
    bad(StructuredOutputsParams(json={"type": "string", "pattern": "(?=a)b"}),
        r"^structured_outputs\.json\.pattern: .*Lookahead")
    bad(StructuredOutputsParams(json={"type": "integer", "minimum": 5, "maximum": 2}),
        r"^structured_outputs\.json: cannot be compiled")
    with pytest.raises(ValueError, match="^ignore_eos: cannot be combined"):
        llm.engine.add_request("x", [5], SamplingParams(
            ignore_eos=True, structured_outputs=StructuredOutputsParams(json_object=True)))
    assert not llm.engine.has_unfinished()


def test_compiled_once_per_canonical_schema(llm):
    reordered = dict(reversed(list(SCHEMA.items())))
    params = [SamplingParams(max_tokens=30, structured_outputs=StructuredOutputsParams(json=s))
              for s in (SCHEMA, reordered, json.dumps(SCHEMA))]
    before = llm.engine.structured.grammars.num_compiled if llm.engine.structured else 0
    llm.generate([[5, 6, 7]] * 3, params)
    assert llm.engine.structured.grammars.num_compiled == before + 1


def test_n_samples_logprobs_and_validity(llm):
    """n > 1 sampled choices each follow the grammar; logprobs are of the constrained
    distribution: alternatives are allowed tokens only, and the allowed mass is 1."""
    so = StructuredOutputsParams(json=SCHEMA)
    sp = SamplingParams(max_tokens=60, temperature=1.0, seed=3, n=4, logprobs=5,
                        structured_outputs=so)
    out = llm.generate([[9, 10, 11, 12]], sp)[0]
    assert len(out.outputs) == 4
    stopped = [c for c in out.outputs if c.finish_reason == "stop"]
    assert stopped, [c.text for c in out.outputs]
    for choice in stopped:
        jsonschema.validate(json.loads(choice.text), SCHEMA)
    first = out.outputs[0].logprobs[0]  # the first token of a JSON object: "{" or whitespace
    assert all(math.isfinite(v) for v in first.values())
    allowed = [llm.engine.tokenizer.decode([t]) for t in first]
    assert all(t.strip() in ("{", "") for t in allowed), allowed


def test_stop_string_ends_a_constrained_output(llm):
    so = StructuredOutputsParams(regex="(ab)+c")
    out = llm.generate([[5, 6]], SamplingParams(max_tokens=40, stop=["b"],
                                                structured_outputs=so))[0].outputs[0]
    assert (out.text, out.finish_reason, out.stop_reason) == ("a", "stop", "b")


def test_matcher_is_rebuilt_from_the_output_tokens(llm):
    """A matcher out of step with its request (as after a preemption that dropped state) is
    re-derived from the request's output tokens before its next mask."""
    engine = llm.engine
    params = SamplingParams(structured_outputs=StructuredOutputsParams(choice=["12345"]))
    req = Request("m", [5], params)
    engine.structured.add("m", engine._grammar(params).result())
    for token in engine.tokenizer.encode("12", add_special_tokens=False):
        req.append_output_token(token)
    logits = torch.zeros(1, engine.vocab_size)
    engine.structured.mask(logits, [req])  # never accepted: replayed from output_token_ids
    allowed = torch.nonzero(logits[0] > -math.inf).flatten().tolist()
    assert allowed and all("12345".startswith("12" + engine.tokenizer.decode([t]))
                           for t in allowed)
    engine.structured.forget("m")


def test_padding_ids_beyond_the_tokenizer_are_masked(tiny_models, tmp_path):
    """The model's logits are wider than the tokenizer (padded output layer) and the padding
    rows are made to win: unconstrained greedy picks one, constrained decoding never does and
    still equals transformers + xgrammar on the same padded model."""
    from transformers import AutoModelForCausalLM

    src = tiny_models["qwen2"]
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    vocab = model.config.vocab_size
    prompt = [7, 8, 9, 10]
    with torch.no_grad():
        first = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
        model.resize_token_embeddings(vocab + 32, mean_resizing=False)
        model.lm_head.weight[vocab:] = 4 * model.lm_head.weight[first]
    padded = tmp_path / "padded"
    model.save_pretrained(padded)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                 "chat_template.jinja"):
        if (src / name).exists():
            shutil.copy(src / name, padded / name)
    llm = LLM(str(padded), block_size=4)
    assert llm.engine.vocab_size == vocab + 32
    plain = llm.generate([prompt], SamplingParams(max_tokens=3))[0].outputs[0]
    assert plain.token_ids[0] >= vocab  # the padding row wins without a grammar
    so = StructuredOutputsParams(json=SCHEMA)
    out = llm.generate([prompt], SamplingParams(max_tokens=30, structured_outputs=so))[0]
    assert max(out.outputs[0].token_ids) < vocab
    assert ConstrainedReference(padded, 30).compare(prompt, out.outputs[0].token_ids, so) == 0


def test_finished_outputs_are_counted_and_rechecked(llm):
    """engine.stats()["structured"]: samples, those ended by their grammar and re-checked
    (json parsed and validated, choices looked up), those cut by max_tokens."""
    engine = llm.engine
    before = dict(engine.stats()["structured"]) if engine.structured else None
    choice = StructuredOutputsParams(choice=["red", "green"])
    llm.generate([[5, 6, 7], [8, 9]], [SamplingParams(max_tokens=10, structured_outputs=choice),
                                       SamplingParams(max_tokens=1, structured_outputs=choice,
                                                      n=2, temperature=1.0)])
    after = engine.stats()["structured"]
    base = before or {"requests": 0, "completed": 0, "cut": 0, "invalid": 0}
    assert after["requests"] - base["requests"] == 3
    assert after["completed"] - base["completed"] == 1 and after["invalid"] == base["invalid"]
    assert after["cut"] - base["cut"] == 2  # one token cannot be a choice and its end


def test_is_valid_checks_independently():
    from kvcli.structured.validity import is_valid

    schema = StructuredOutputsParams(json=SCHEMA)
    assert is_valid(schema, '{"n": 1, "ok": true}', True)
    assert not is_valid(schema, '{"n": "1", "ok": true}', True)
    assert not is_valid(StructuredOutputsParams(json_object=True), "[1]", True)
    assert is_valid(StructuredOutputsParams(regex="[0-9]{2}"), "42", False)
    assert not is_valid(StructuredOutputsParams(regex="[0-9]{2}"), "4", True)
    assert is_valid(StructuredOutputsParams(grammar='root ::= "a"'), "a", True)


def test_compiling_holds_up_no_running_row(tiny_models, monkeypatch):
    """While a grammar compiles (held here until released), the other rows keep stepping; the
    constrained request joins once it is compiled, and a compile that fails fails only it."""
    import threading

    from kvcli.structured.grammars import GrammarCache

    release = threading.Event()
    real = GrammarCache._compile

    def slow(self, grammar):
        assert release.wait(30)
        return real(self, grammar)

    monkeypatch.setattr(GrammarCache, "_compile", slow)
    llm = LLM(str(tiny_models["qwen2"]), block_size=4)
    engine = llm.engine
    engine.add_request("free", [5, 6, 7], SamplingParams(max_tokens=6))
    so = StructuredOutputsParams(regex="[0-9]{3}")
    engine.add_request("held", [5, 6, 8], SamplingParams(max_tokens=8, structured_outputs=so))
    done = {}
    for _ in range(6):
        done.update({o.request_id: o for o in engine.step()})
    assert "free" in done and "held" not in done and engine.has_unfinished()
    release.set()
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step()})
    held = done["held"].outputs[0]
    assert held.finish_reason == "stop" and len(held.text) == 3 and held.text.isdigit()

    def broken(self, grammar):
        raise RuntimeError("compiler crashed")

    monkeypatch.setattr(GrammarCache, "_compile", broken)
    engine.add_request("bad", [5], SamplingParams(structured_outputs=StructuredOutputsParams(
        regex="[a-z]{4}")))
    (out,) = engine.step()
    assert out.request_id == "bad" and "compiler crashed" in out.error
    assert not engine.has_unfinished()


def test_structured_counts_add_up_over_ray_workers():
    from kvcli.distributed.tally import WorkerTally, merge_stats

    base = {"prefill_tokens_computed": 1, "prefill_tokens_skipped": 0, "decode_tokens": 1,
            "preemptions": 0, "steps": 1, "forward_s": 0.1, "num_blocks": 8,
            "peak_blocks_in_use": 1, "evicted_blocks": 0, "block_size": 16,
            "peak_kv_utilization": 0.5}
    tallies = []
    for i, counts in enumerate(({"requests": 3, "invalid": 0, "compile_s": 0.25},
                                {"requests": 2, "invalid": 0, "compile_s": 0.5})):
        tally = WorkerTally(i)
        tally.note_stats("a", {**base, "structured": counts})
        tallies.append(tally)
    tallies.append(WorkerTally(2))  # a worker that saw no constrained line
    merged = merge_stats(tallies, 1.0)
    assert merged["structured"] == {"requests": 5, "invalid": 0, "compile_s": 0.75}


def test_disable_any_whitespace_gives_compact_json(llm):
    """vLLM's disable_any_whitespace: xgrammar's fixed separators, no free JSON whitespace (a
    separate grammar from the default one); the random model then completes its object."""
    free = StructuredOutputsParams(json=SCHEMA)
    compact = StructuredOutputsParams.from_json({"json": SCHEMA, "disable_any_whitespace": True})
    assert compact.key != free.key
    out = llm.generate([[9, 10, 11, 12]], SamplingParams(max_tokens=40,
                                                        structured_outputs=compact))[0]
    text = out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop", text
    jsonschema.validate(json.loads(text), SCHEMA)
    assert not any(c in text for c in "\n\t\r") and "  " not in text, text
    with pytest.raises(ValueError, match=r"^structured_outputs\.disable_any_whitespace: "):
        StructuredOutputsParams.from_json({"json": SCHEMA, "disable_any_whitespace": 1})

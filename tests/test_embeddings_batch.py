"""Embeddings lines in a batch file (issue 30): ``/v1/embeddings`` Batch lines and plain
``{"input", "task": "embed"}`` lines, answered with OpenAI's ``CreateEmbeddingResponse``
(validated with the openai SDK's type), mixed with chat lines in one file."""

from __future__ import annotations

import base64
import json
import shutil

import numpy as np
import pytest
from embed_models import INSTRUCTION, headless_st_model
from openai.types import CreateEmbeddingResponse
from test_batch_parse import fails, ok
from test_structured_cli import generate

from kvcli.checkpoint.pooling import read_embedding_spec

pytest.importorskip("sentence_transformers")


def emb_line(body: dict, custom_id: str = "e1") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}


def jsonl(lines: list[dict]) -> str:
    return "".join(json.dumps(x) + "\n" for x in lines)


def vectors(result: dict) -> list:
    body = result["response"]["body"] if "response" in result else result
    return [d["embedding"] for d in body["data"]]


# ---------------------------------------------------------------------------------- parsing
def test_every_input_shape_is_read_as_openai_reads_it():
    assert [p.text for p in ok(emb_line({"input": "a"})).embed.inputs] == ["a"]
    assert [p.text for p in ok(emb_line({"input": ["a", "b"]})).embed.inputs] == ["a", "b"]
    assert [p.token_ids for p in ok(emb_line({"input": [1, 2]})).embed.inputs] == [[1, 2]]
    req = ok(emb_line({"input": [[1], [2, 3]], "encoding_format": "base64", "dimensions": 8}))
    assert [p.token_ids for p in req.embed.inputs] == [[1], [2, 3]]
    assert (req.embed.encoding_format, req.embed.dimensions) == ("base64", 8)
    plain = ok({"id": "p", "input": "x", "task": "embed"})
    assert plain.embed is not None and plain.style.value == "embed"
    assert ok({"id": "r", "input": "x"}).embed is None  # a Responses body, as before


@pytest.mark.parametrize("body,field", [
    ({"input": ""}, "body.input"),
    ({"input": []}, "body.input"),
    ({"input": ["a", 1]}, "body.input"),
    ({"input": ["a", ""]}, "body.input[1]"),
    ({"input": [[1], []]}, "body.input[1]"),
    ({"input": [1, -2]}, "body.input[1]"),
    ({"input": "a", "encoding_format": "int8"}, "body.encoding_format"),
    ({"input": "a", "dimensions": 0}, "body.dimensions"),
    ({"input": "a", "dimensions": True}, "body.dimensions"),
])
def test_bad_embeddings_bodies_name_their_field(body, field):
    fails(emb_line(body), field)


def test_a_plain_line_with_another_task_is_refused():
    fails({"id": "p", "input": "x", "task": "generate"}, "task")


def test_unknown_body_fields_are_reported():
    assert ok(emb_line({"input": "a", "extra": 1})).ignored_fields == ["body.extra"]


# ------------------------------------------------------------------------ the model's recipe
def _layout(tmp_path, modules: list[str], pooling: dict, config: dict | None = None):
    (tmp_path / "modules.json").write_text(json.dumps(
        [{"idx": i, "path": "" if i == 0 else f"{i}_{m}", "type": f"sentence_transformers.models.{m}"}
         for i, m in enumerate(modules)]))
    (tmp_path / "1_Pooling").mkdir(exist_ok=True)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return read_embedding_spec(tmp_path, {"hidden_size": 8, **(config or {})})


def test_the_pooling_is_read_from_the_layout_and_what_cannot_be_followed_is_said(tmp_path):
    assert read_embedding_spec(tmp_path, {"hidden_size": 8}).pooling == "last"  # no layout
    spec = _layout(tmp_path, ["Transformer", "Pooling"], {"pooling_mode_mean_tokens": True})
    assert (spec.pooling, spec.normalize, spec.unsupported) == ("mean", False, None)
    spec = _layout(tmp_path, ["Transformer", "Pooling", "Normalize"], {"pooling_mode": "cls"})
    assert (spec.pooling, spec.normalize) == ("cls", True)
    for modules, pooling, words in [
        (["Transformer", "Pooling", "Dense"], {"pooling_mode": "mean"}, "Dense"),
        (["Transformer", "Pooling"], {"pooling_mode_max_tokens": True}, "max_tokens"),
        (["Transformer", "Pooling"], {"pooling_mode": "mean", "include_prompt": False},
         "include_prompt"),
        (["Transformer", "Pooling"], {"pooling_mode": "mean", "embedding_dimension": 4}, "4"),
    ]:
        spec = _layout(tmp_path, modules, pooling)
        assert words in spec.unsupported
        with pytest.raises(ValueError, match="cannot compute embeddings"):
            spec.params(None)
    spec = _layout(tmp_path, ["Transformer", "Pooling"], {"pooling_mode": "mean"},
                   {"is_causal": False})
    assert "bidirectional" in spec.unsupported


def test_dimensions_only_where_the_model_is_matryoshka(tmp_path):
    plain = read_embedding_spec(tmp_path, {"hidden_size": 64})
    assert plain.params(64).dimensions is None  # the full size changes nothing
    with pytest.raises(ValueError, match="^dimensions: .*is_matryoshka"):
        plain.params(16)
    listed = read_embedding_spec(tmp_path, {"hidden_size": 64, "matryoshka_dimensions": [16, 32]})
    assert listed.params(16).dimensions == 16
    with pytest.raises(ValueError, match="supports 16, 32"):
        listed.params(20)
    anything = read_embedding_spec(tmp_path, {"hidden_size": 64, "is_matryoshka": True})
    assert anything.params(20).dimensions == 20
    with pytest.raises(ValueError, match="1 to 64"):
        anything.params(65)


# ------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def headless(tiny_models, tmp_path_factory):
    return headless_st_model(tiny_models["qwen2"], tmp_path_factory.mktemp("emb") / "m",
                             "lasttoken", True)


def test_a_file_of_embeddings_lines(headless):
    lines = [emb_line({"model": "m", "input": INSTRUCTION + "the fox"}, "one"),
             emb_line({"input": [INSTRUCTION + "the fox", "Paris"]}, "two"),
             emb_line({"input": "Paris", "encoding_format": "base64"}, "b64"),
             {"id": "plain", "input": "Paris", "task": "embed"},
             emb_line({"input": "Paris", "dimensions": 8}, "dims"),
             {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}]
    res, out = generate("-", "--model", str(headless), "-q", input=jsonl(lines))
    assert res.exit_code == 1  # the two lines the model cannot answer
    for key in ("one", "two"):
        assert out[key]["error"] is None
        CreateEmbeddingResponse.model_validate(out[key]["response"]["body"])
    body = out["two"]["response"]["body"]
    assert [d["index"] for d in body["data"]] == [0, 1] and body["object"] == "list"
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert vectors(out["two"])[0] == vectors(out["one"])[0]  # batching changes nothing
    assert np.linalg.norm(vectors(out["one"])[0]) == pytest.approx(1.0, abs=1e-6)
    # base64: float32 bytes, which the SDK decodes (numpy.frombuffer) before its type holds them
    decoded = np.frombuffer(base64.b64decode(vectors(out["b64"])[0]), dtype="<f4")
    assert decoded.tolist() == vectors(out["two"])[1] == vectors(out["plain"])[0]
    b64 = out["b64"]["response"]["body"]
    CreateEmbeddingResponse.model_validate({**b64, "data": [{**b64["data"][0],
                                                              "embedding": decoded.tolist()}]})
    CreateEmbeddingResponse.model_validate({k: v for k, v in out["plain"].items() if k != "id"})
    assert out["dims"]["error"]["param"] == "body.dimensions"
    assert "no language-model head" in out["chat"]["error"]["message"]


def test_embeddings_and_chat_lines_mix_in_one_file(tiny_models):
    """A causal model answers both kinds, each line in its own shape; the lines sharing an
    instruction read its blocks from the prefix cache."""
    queries = ["the fox", "the dog", "a river", "Paris"]
    lines = [emb_line({"input": INSTRUCTION + q}, f"e{i}") for i, q in enumerate(queries)]
    lines.insert(2, {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}})
    lines.append({"id": "p", "prompt": "Once upon a time", "max_tokens": 3})
    res, out = generate("-", "--model", str(tiny_models["llama"]), "-q", "--block-size", "4",
                        "--ordered", input=jsonl(lines))
    assert res.exit_code == 0, res.output
    assert out["chat"]["response"]["body"]["object"] == "chat.completion"
    assert out["p"]["usage"]["completion_tokens"] == 3
    usages = [out[f"e{i}"]["response"]["body"]["usage"] for i in range(len(queries))]
    assert usages[0]["prompt_tokens_details"]["cached_tokens"] == 0
    assert all(u["prompt_tokens_details"]["cached_tokens"] >= 40 for u in usages[1:])


def test_dimensions_truncate_then_normalise(tiny_models, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(tiny_models["llama"], model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [16, 32]}))
    lines = [emb_line({"input": "the fox"}, "full"),
             emb_line({"input": "the fox", "dimensions": 16}, "d16"),
             emb_line({"input": "the fox", "dimensions": 20}, "d20")]
    res, out = generate("-", "--model", str(model), "-q", input=jsonl(lines))
    full, d16 = np.array(vectors(out["full"])[0]), np.array(vectors(out["d16"])[0])
    assert len(d16) == 16
    np.testing.assert_allclose(d16, full[:16] / np.linalg.norm(full[:16]), atol=1e-6)
    assert "supports 16, 32" in out["d20"]["error"]["message"]


def test_the_library_embeds_as_the_batch_does(headless):
    from kvcli import LLM

    llm = LLM(str(headless), num_blocks=64)
    lines = [emb_line({"input": "Paris"}, "text"), emb_line({"input": [5, 6, 7]}, "ids")]
    _, out = generate("-", "--model", str(headless), "-q", input=jsonl(lines))
    assert llm.embed(["Paris", [5, 6, 7]]) == vectors(out["text"]) + vectors(out["ids"])
    with pytest.raises(ValueError, match="dimensions"):
        llm.embed(["Paris"], dimensions=8)


def test_the_audit_says_it_does_not_predict_embeddings_lines():
    from kvcli.audit.parse import to_request
    from kvcli.audit.records import InputProblem

    for line in (emb_line({"input": "x"}), {"id": "p", "input": "x", "task": "embed"}):
        problem = to_request(line, "in.jsonl:1")
        assert isinstance(problem, InputProblem) and "embeddings" in problem.message


def test_an_engine_without_embeddings_fails_those_lines_only():
    """``generate --ray``'s pool (like this fake) has no embedding path: its embeddings lines
    are their errors, the chat lines beside them run."""
    from test_batch_job import jsonl as job_lines
    from test_batch_job import run_job

    outcome, sink, _ = run_job(job_lines(emb_line({"input": "x"}, "e"), {"id": "p", "prompt": "ab"},
                                         {"id": "t", "input": "x", "task": "embed"}), ordered=True)
    assert outcome.exit_code == 1
    by_id = {r.get("custom_id") or r["id"]: r for r in sink.results}
    assert "not supported by this engine" in by_id["e"]["error"]["message"]
    assert by_id["e"]["error"]["param"] == "body.input" and by_id["t"]["error"]["param"] == "input"
    assert by_id["p"]["text"] == "ba"

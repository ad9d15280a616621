"""Tiny embedding models in a sentence-transformers layout, built from the tiny fixtures.

``headless_st_model``: sentence-transformers builds and saves it itself (its own ``modules.json``
and ``1_Pooling/config.json`` with a ``pooling_mode`` string; a headless ``*Model`` checkpoint,
no ``model.`` prefix, no lm_head). ``causal_st_model``: the ``*ForCausalLM`` fixture with the
older layout (``pooling_mode_*`` flags) written next to it, as older hub models ship it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

INSTRUCTION = "Instruct: Given a question, find the passage that answers it\nQuery: "
QUERIES = ["What is the capital of France?", "the quick brown fox",
           "Caching the keys and values of a shared prompt prefix saves work",
           "Every morning the fox walked to the river to drink and to watch the fish jump.", "x"]
# The last repeats the first: with one-token blocks it hits all but its last token, which then
# runs alone (the fused NumPy single-token path).
TEXTS = [INSTRUCTION + q for q in QUERIES] + ["A language model reads text as tokens.", "Paris",
                                              INSTRUCTION + QUERIES[0]]


def headless_st_model(source: Path, path: Path, pooling: str, normalize: bool) -> Path:
    """sentence-transformers' own save of ``source``'s body with ``pooling`` (its mode name)."""
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(str(source))
    # sentence-transformers 6 renamed get_word_embedding_dimension (5 has only the old name)
    dimension = getattr(transformer, "get_embedding_dimension", None) \
        or transformer.get_word_embedding_dimension
    modules = [transformer, models.Pooling(dimension(), pooling_mode=pooling)]
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules).save(str(path))
    # sentence-transformers 6 renders a text through the tokenizer's chat template when its
    # config lists a "message" modality; the Embeddings API embeds the text itself (as vLLM).
    config = path / "sentence_bert_config.json"
    settings = json.loads(config.read_text())
    settings.get("modality_config", {}).pop("message", None)
    config.write_text(json.dumps(settings))
    return path


def causal_st_model(source: Path, path: Path, pooling: str, normalize: bool) -> Path:
    """``source`` (a ``*ForCausalLM`` dir) copied, with an old-style layout pooling ``pooling``
    (``lasttoken`` / ``mean_tokens`` / ``cls_token``)."""
    shutil.copytree(source, path)
    hidden = json.loads((path / "config.json").read_text())["hidden_size"]
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (path / "2_Normalize").mkdir()
    (path / "modules.json").write_text(json.dumps(modules))
    flags = {f"pooling_mode_{m}": m == pooling for m in
             ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
              "weightedmean_tokens", "lasttoken")}
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, **flags, "include_prompt": True}))
    (path / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": 512, "do_lower_case": False}))
    return path


def st_encode(path: Path, texts: list[str]):
    """sentence-transformers' ``encode`` of ``texts`` (float32 numpy, one row per text)."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    model = SentenceTransformer(str(path), device="cpu")
    tokens = model.preprocess(texts)  # what it embeds: the texts' own tokens, no template
    reference = AutoTokenizer.from_pretrained(str(path))
    for row, mask, text in zip(tokens["input_ids"], tokens["attention_mask"], texts, strict=True):
        assert row[mask.bool()].tolist() == reference(text)["input_ids"], text
    return model.encode(texts, batch_size=len(texts), convert_to_numpy=True)


def kvcli_encode(path: Path, texts: list[str], preempt: bool = False,
                 **engine) -> tuple[list[list[float]], dict]:
    """kvcli's engine's embeddings of ``texts`` (one request per text) and its stats.

    ``preempt``: every request is preempted once, mid-prefill. A prefill-only job never runs
    out of blocks on its own (at most the newest request is part-computed when a step begins;
    the rest finish and free theirs), but mixed with chat lines' decodes it is preempted like
    any other, so the recompute path is forced here."""
    from kvcli.engine.config import EngineConfig
    from kvcli.engine.llm_engine import LLMEngine
    from kvcli.engine.scheduler import SchedulerOutput

    eng = LLMEngine.from_config(EngineConfig(model=str(path), **{"num_blocks": 256, **engine}))
    params = eng.embedding.params(None)
    for i, text in enumerate(texts):
        eng.add_embedding_request(str(i), [eng.tokenizer.encode(text, add_special_tokens=True)],
                                  params)
    outs = {}
    while eng.has_unfinished():
        for out in eng.step():
            assert out.error is None, out.error
            outs[out.request_id] = out.embeddings[0]
        for req in list(eng.scheduler.running) if preempt else ():
            if 0 < req.num_computed_tokens < req.num_tokens and not req.num_preemptions:
                eng.scheduler.running.remove(req)
                eng.scheduler._preempt(req, SchedulerOutput())
    return [outs[str(i)] for i in range(len(texts))], eng.stats()

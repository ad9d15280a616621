"""Embeddings equal sentence-transformers' ``encode`` (issue 30): cosine >= 0.99999 and max abs
difference <= 1e-5 on tiny random models of two families, with the prefix cache on and off,
chunked prefill and preemption mid-prefill (recomputed: mean pooling must not add a position
twice); a model without a sentence-transformers layout equals
transformers' last hidden state of the last token, L2-normalised (vLLM's default)."""

from __future__ import annotations

import numpy as np
import pytest
from embed_models import TEXTS, causal_st_model, headless_st_model, kvcli_encode, st_encode

pytest.importorskip("sentence_transformers")

# Block 4: the shared instruction prefix (~44 tokens) spans 11 full blocks, so later lines hit.
SETTINGS = {
    "caching": dict(block_size=4),
    "caching-block-1": dict(block_size=1, max_num_seqs=1),  # one at a time: see TEXTS[-1]
    "no-caching": dict(block_size=4, enable_prefix_caching=False),
    "chunked": dict(block_size=4, max_num_batched_tokens=7),
    "preemption": dict(block_size=4, max_num_batched_tokens=20, preempt=True),
}
# (family, layout, pooling as the layout names it, normalize)
MODELS = {
    "qwen2-headless-last": ("qwen2", headless_st_model, "lasttoken", True),
    "qwen2-headless-cls": ("qwen2", headless_st_model, "cls", False),
    "llama-causal-mean": ("llama", causal_st_model, "mean_tokens", True),
    "llama-causal-last": ("llama", causal_st_model, "lasttoken", False),
    "llama-headless-mean": ("llama", headless_st_model, "mean", True),
}


@pytest.fixture(scope="module")
def st_models(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("st_models")
    built = {}
    for name, (family, make, pooling, normalize) in MODELS.items():
        path = make(tiny_models[family], root / name, pooling, normalize)
        built[name] = (path, st_encode(path, TEXTS))
    return built


def assert_close(got: list[list[float]], ref: np.ndarray) -> None:
    got_a = np.asarray(got, dtype=np.float64)
    ref_a = ref.astype(np.float64)
    cos = (got_a * ref_a).sum(1) / np.linalg.norm(got_a, axis=1) / np.linalg.norm(ref_a, axis=1)
    assert cos.min() >= 0.99999, cos
    assert np.abs(got_a - ref_a).max() <= 1e-5


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("model", MODELS)
def test_equal_to_sentence_transformers(st_models, model, setting) -> None:
    path, ref = st_models[model]
    got, stats = kvcli_encode(path, TEXTS, **SETTINGS[setting])
    assert_close(got, ref)
    last = MODELS[model][2] == "lasttoken"
    if setting in ("caching", "caching-block-1", "chunked"):
        # Last-token pooling reads the shared instruction's blocks; mean and CLS compute every
        # token (their hidden states cannot come from K/V) and so read none.
        assert (stats["cached_tokens"] > 0) == last, stats["cached_tokens"]
    if setting == "preemption":
        assert stats["preemptions"] > 0


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_without_a_layout_last_token_normalised(tiny_models, family) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = tiny_models[family]
    tok, hf = AutoTokenizer.from_pretrained(str(path)), AutoModel.from_pretrained(str(path))
    with torch.no_grad():
        ref = np.stack([torch.nn.functional.normalize(
            hf(**tok(t, return_tensors="pt")).last_hidden_state[0, -1], dim=0).numpy()
            for t in TEXTS])
    for setting in ("caching", "chunked"):
        got, stats = kvcli_encode(path, TEXTS, **SETTINGS[setting])
        assert_close(got, ref)
        assert stats["cached_tokens"] > 0

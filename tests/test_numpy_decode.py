"""The fused NumPy single-token decode path equals the torch path and transformers."""

from __future__ import annotations

import pytest
import torch
from fidelity import HFReference, compare

from kvcli.engine.llm import LLM
from kvcli.model.numpy_decode import NumpyDecoder
from kvcli.sampling_params import SamplingParams


@pytest.mark.parametrize("family", ["llama", "llama-gqa"])
def test_single_sequence_decode_uses_numpy_and_equals_transformers(tiny_models, family,
                                                                  monkeypatch):
    llm = LLM(str(tiny_models[family]), block_size=4)
    model = llm.engine.model
    assert model._numpy_decoder is not None
    calls = []
    real = NumpyDecoder.__call__
    monkeypatch.setattr(NumpyDecoder, "__call__",
                        lambda self, *a: calls.append(1) or real(self, *a))
    prompt = [5, 17, 99, 3, 250, 41, 7]
    out = llm.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True))
    assert len(calls) == 23  # every step after the first token
    assert compare(HFReference(tiny_models[family], 24), prompt, out[0].outputs[0].token_ids) == 0


def test_numpy_and_torch_paths_give_the_same_logits(tiny_models):
    llm = LLM(str(tiny_models["llama-gqa"]), block_size=4)
    engine, model = llm.engine, llm.engine.model
    prompt = [5, 17, 99, 3, 250, 41, 7, 8, 9]
    llm.generate([prompt], SamplingParams(max_tokens=1))
    # Decode the same next token twice over the cached prefix: once per path.
    from kvcli.model.attention import build_attention_metadata

    table = list(range(engine.num_blocks))[:4]
    kv = engine.runner.kv_cache
    ids, pos = torch.tensor([11]), torch.tensor([len(prompt)])
    meta = build_attention_metadata([table], [len(prompt)], [1], 4, "cpu")
    # Fill the first blocks with this prompt's K/V via the torch path (a prefill).
    pre = build_attention_metadata([table], [0], [len(prompt)], 4, "cpu")
    model(torch.tensor(prompt), torch.arange(len(prompt)), pre, kv)
    fast = model.compute_logits(model(ids, pos, meta, kv))
    decoder, model._numpy_decoder = model._numpy_decoder, None
    slow = model.compute_logits(model(ids, pos, meta, kv))
    model._numpy_decoder = decoder
    assert torch.allclose(fast, slow, atol=1e-5, rtol=0)


def test_models_with_qk_norm_or_windows_keep_the_torch_path(tiny_models):
    assert LLM(str(tiny_models["qwen3"])).engine.model._numpy_decoder is None  # q/k norm
    for family in ("mistral", "qwen2"):
        model = LLM(str(tiny_models[family])).engine.model
        windowed = any(layer.self_attn.attn.sliding_window for layer in model.model.layers)
        assert (model._numpy_decoder is None) == windowed

"""The one-call native batch-1 decode step (kvcli/model/native_step.py): taken by every decode
step of gguf, gguf-int, int8 and float32 models, and equal to the NumPy loop it replaces (the same matmul kernels; the element-wise and attention kernels of the batched path,
which differ from NumPy's only in the last bits), with a float32 or an int8 KV cache."""

from __future__ import annotations

import pytest
import torch
from quant_runs import PROMPT, greedy
from test_quant_model import quant_gguf  # noqa: F401 - the tiny GGUF fixture

from kvcli.engine.llm import LLM
from kvcli.model.backend import model_backend
from kvcli.model.gguf_convert import resolve_model
from kvcli.model.quant.load import load_quantized
from kvcli.sampling_params import SamplingParams

STEPS = 8


def _counted(model) -> list[int]:
    """Calls of the model's native step from now on (AssertionError: it has none)."""
    step = model._numpy_decoder.native_step
    assert step is not None
    calls: list[int] = []
    real = step._fn
    step._fn = lambda *args: calls.append(1) or real(*args)
    return calls


def _numpy_loop(model, run):
    """``run()`` with the step's NumPy loop instead of the native call."""
    decoder = model._numpy_decoder
    step, decoder.native_step = decoder.native_step, None
    try:
        return run()
    finally:
        decoder.native_step = step


@pytest.mark.parametrize("mode", ["gguf", "gguf-int"])
def test_decode_steps_are_one_native_call_equal_to_the_numpy_loop(quant_gguf, kvcli_home,  # noqa: F811
                                                                  mode):
    model = load_quantized(resolve_model(str(quant_gguf), quantization=mode), mode)
    calls = _counted(model)
    got, got_logits = greedy(model, PROMPT, STEPS)
    assert len(calls) == STEPS - 1  # every step after the prefill
    want, want_logits = _numpy_loop(model, lambda: greedy(model, PROMPT, STEPS))
    assert got == want
    for a, b in zip(got_logits, want_logits, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def _tokens(llm: LLM, prompt: list[int]) -> list[int]:
    out = llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True))
    return list(out[0].outputs[0].token_ids)


@pytest.mark.parametrize("mode", ["gguf", "gguf-int"])
def test_int8_kv_cache_steps_equal_the_numpy_loop(quant_gguf, kvcli_home, mode):  # noqa: F811
    llm = LLM(str(quant_gguf), quantization=mode, kv_cache_dtype="int8", block_size=4,
              enable_prefix_caching=False)
    model = llm.engine.model
    calls = _counted(model)
    got = _tokens(llm, PROMPT[:11])
    assert len(calls) == 15
    assert got == _numpy_loop(model, lambda: _tokens(llm, PROMPT[:11]))


@pytest.mark.parametrize("quantization", ["int8", "auto"])  # auto: float32 weights (gemv.c)
@pytest.mark.parametrize("family", ["llama-gqa", "qwen2"])  # qwen2: q/k/v biases
def test_int8_and_float32_weights_take_the_native_step(tiny_models, family, quantization):
    llm = LLM(str(tiny_models[family]), quantization=quantization, block_size=4,
              enable_prefix_caching=False)
    model = llm.engine.model
    assert model_backend(model).batch1_decode.startswith("native fused")  # --stats says so
    calls = _counted(model)
    got = _tokens(llm, [5, 17, 99, 3, 250, 41, 7])
    assert len(calls) == 15
    assert got == _numpy_loop(model, lambda: _tokens(llm, [5, 17, 99, 3, 250, 41, 7]))


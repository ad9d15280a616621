"""The one-call native decode steps (kvcli/model/native_step.py). Batch 1: taken by every decode
step of gguf, gguf-int, int8 and float32 models, and equal to the NumPy loop it replaces (the
same matmul kernels; the element-wise and attention kernels of the batched path, which differ
from NumPy's only in the last bits), with a float32 or an int8 KV cache. Batched: taken by the
steps whose every row is a decode token, equal to the batched torch path bit for bit."""

from __future__ import annotations

import pytest
import torch
from quant_runs import PROMPT, greedy
from test_quant_model import quant_gguf  # noqa: F401 - the tiny GGUF fixture

from kvcli.engine.llm import LLM
from kvcli.model.attention.native_cpu import NativeMetadata
from kvcli.model.attention.shared_prefix import MIN_CASCADE_BLOCKS
from kvcli.model.backend import model_backend
from kvcli.model.gguf_convert import resolve_model
from kvcli.model.native_step import NativeStep
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



PROMPTS = [[5, 17, 99, 3, 250, 41, 7], [8, 9, 10, 11, 12], [200, 3, 7, 7, 7, 1, 2, 3, 4, 5, 6]]


def _run_rows(llm: LLM) -> list:
    """Three sequences decoding together: each token and its logprob (the logits' last bits)."""
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=10, ignore_eos=True, logprobs=0))
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


def _counted_rows(model) -> list[int]:
    """Batched steps the model's native call has run from now on."""
    step = model._numpy_decoder.native_step
    calls: list[int] = []
    real = step._rows_fn
    step._rows_fn = lambda *args: calls.append(1) or real(*args)
    return calls


def _torch_rows(run, failing: bool = False):
    """``run()`` with batched steps on the torch path: the call declined (``rows`` returns None),
    or, ``failing``, taken and failed (status -2), so the torch path redoes the step."""
    with pytest.MonkeyPatch.context() as mp:
        if failing:
            mp.setattr(NativeStep, "rows", _failing_rows)
        else:
            mp.setattr(NativeStep, "rows", lambda *args: None)
        return run()


def _failing_rows(self, *args):
    real, self._rows_fn = self._rows_fn, lambda *a: -2
    try:
        return _REAL_ROWS(self, *args)
    finally:
        self._rows_fn = real


_REAL_ROWS = NativeStep.rows


def _check_rows(llm: LLM) -> None:
    model = llm.engine.model
    calls = _counted_rows(model)
    got = _run_rows(llm)
    assert len(calls) >= 5  # the steps after every prompt's prefill
    assert got == _torch_rows(lambda: _run_rows(llm))
    assert got == _torch_rows(lambda: _run_rows(llm), failing=True)


@pytest.mark.parametrize("kv", ["auto", "int8"])
@pytest.mark.parametrize("mode", ["gguf", "gguf-int"])
def test_batched_decode_steps_are_one_native_call_equal_to_the_torch_path(
        quant_gguf, kvcli_home, mode, kv):  # noqa: F811
    _check_rows(LLM(str(quant_gguf), quantization=mode, kv_cache_dtype=kv, block_size=4,
                    enable_prefix_caching=False))


@pytest.mark.parametrize("kv", ["auto", "int8"])
@pytest.mark.parametrize("family", ["llama-gqa", "qwen2"])  # float32 weights: gemm.c; biases
def test_float32_batched_decode_steps_equal_the_torch_path(tiny_models, family, kv):
    _check_rows(LLM(str(tiny_models[family]), block_size=4, kv_cache_dtype=kv,
                    enable_prefix_caching=False))


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_decode_steps_sharing_a_cached_prefix_equal_the_torch_path(tiny_models, kv):
    """Rows whose contexts start with the same cached blocks (>= MIN_CASCADE_BLOCKS): the
    shared-prefix kernel for them, the paged kernel for the other row, scattered back."""
    prefix = list(range(30, 30 + 4 * MIN_CASCADE_BLOCKS + 2))
    prompts = [prefix + [7, 8], prefix + [9], [5, 6, 7, 250]]
    llm = LLM(str(tiny_models["llama-gqa"]), block_size=4, kv_cache_dtype=kv)
    model, groups = llm.engine.model, []
    real = NativeMetadata.__init__

    def seen(self, *args):
        real(self, *args)
        groups.append(self.shared_decode is not None and self.shared_decode.rest is not None)

    def run():
        llm.engine.reset_prefix_cache()
        llm.generate([prefix], SamplingParams(max_tokens=1))  # the prefix cached first
        outs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=0))
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]

    calls = _counted_rows(model)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NativeMetadata, "__init__", seen)
        got = run()
    assert any(groups) and len(calls) >= 5
    assert got == _torch_rows(run)


def test_a_row_count_the_batched_path_runs_elsewhere_is_declined(tiny_models, monkeypatch):
    """Past KVCLI_GEMM_MAX_ROWS the float32 matmuls are torch's: the step is not taken."""
    monkeypatch.setenv("KVCLI_GEMM_MAX_ROWS", "2")
    llm = LLM(str(tiny_models["llama-gqa"]), block_size=4, enable_prefix_caching=False)
    step = llm.engine.model._numpy_decoder.native_step
    assert step.takes(2) and not step.takes(3) and not step.takes(1)
    calls = _counted_rows(llm.engine.model)
    _run_rows(llm)
    assert not calls

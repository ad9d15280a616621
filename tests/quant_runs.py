"""Runs of quantized tiny models for the model-level tests: greedy decoding step by step, and
the check that a gguf-int model is its gguf model computing on q8_0-rounded matmul inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvcli.model import native
from kvcli.model.attention import allocate_kv_cache, build_attention_metadata
from kvcli.model.quant.int_weights import IntWeight
from kvcli.model.quant.load import load_quantized
from kvcli.model.quant.weights import QuantWeight, StackedWeight

BLOCK = 16
PROMPT = list(range(5, 85))  # 80 rows: the prefill goes through the float32 GEMM path


def greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill ``prompt`` in one step, then decode one token per step; every step's logits."""
    kv = allocate_kv_cache(model, 16, BLOCK, torch.float32, "cpu")
    tokens, computed, out, logits_seen = list(prompt), 0, [], []
    blocks = list(range(16))
    while len(out) < steps:
        new = len(tokens) - computed
        meta = build_attention_metadata([blocks], [computed], [new], BLOCK, "cpu")
        ids = torch.tensor(tokens[computed:])
        logits = model.compute_logits(model(ids, torch.arange(computed, len(tokens)), meta, kv))
        logits_seen.append(logits[-1])
        computed = len(tokens)
        out.append(int(logits[-1].argmax()))
        tokens.append(out[-1])
    return out, logits_seen


def python_matmuls(model):
    """``model`` with its decode steps' matmuls called through QuantWeight.linear (where a test
    patches it), not inside the one-call native step (kvcli/model/native_step.py)."""
    model._numpy_decoder.native_step = None
    return model


def q8_0(x: torch.Tensor) -> torch.Tensor:
    """x rounded as gguf-int rounds a matmul's input: the kernels' own q8_0 quantizer
    (tests/test_qint_kernels.py checks it against the formula), de-quantized."""
    flat = x.reshape(-1, x.shape[-1]).float().contiguous()
    rows, k = flat.shape
    q = torch.empty((rows, k), dtype=torch.int8)
    d, s = torch.empty((rows, k // 32)), torch.empty((rows, k // 32))
    native.load().kvcli_qint_quantize(flat.data_ptr(), q.data_ptr(), d.data_ptr(), s.data_ptr(),
                                      rows, k)
    return (q.reshape(rows, -1, 32).float() * d[..., None]).reshape(x.shape)


def _parts(weight) -> list:
    return weight.parts if isinstance(weight, StackedWeight) else [weight]


def reference_weights(int_model, float_model) -> dict[int, object]:
    """Each of ``int_model``'s integer weights (a mixed-type q/k/v's parts too) -> the same
    module's GGUF weight in ``float_model``."""
    floats = dict(float_model.named_modules())
    return {id(mine): theirs for name, m in int_model.named_modules()
            if getattr(m, "weight", None) is not None
            for mine, theirs in zip(_parts(m.weight), _parts(floats[name].weight), strict=True)
            if isinstance(mine, IntWeight)}


def check_gguf_int_is_gguf_on_q8_0(model, model_dir: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each integer matmul of a whole greedy run of ``model`` (``model_dir``'s gguf-int model)
    equals the gguf weights' float matmul of the q8_0-rounded *same* input, to float32 rounding
    (max relative error 1e-5); greedy tokens equal those of the gguf model computing on
    q8_0-rounded inputs, and every step's logits stay near gguf's float activations'."""
    assert "int8 activations, " in model.routes.describe()["matmul"]
    reference = reference_weights(model, load_quantized(model_dir, "gguf"))
    real_int, real_linear, worst = IntWeight.linear, QuantWeight.linear, []

    def checked(self, x, bias, routes=None):
        y = real_int(self, x, bias, routes)
        want = reference[id(self)].linear(q8_0(x), bias, routes)
        worst.append(float((y - want).abs().max() / want.abs().max().clamp_min(1e-6)))
        return y

    monkeypatch.setattr(IntWeight, "linear", checked)
    got, got_logits = greedy(python_matmuls(model), PROMPT, 6)
    assert len(worst) > 6 * len(reference) // 2 and max(worst) < 1e-5  # every matmul, every step
    monkeypatch.setattr(IntWeight, "linear", real_int)
    _, float_logits = greedy(load_quantized(model_dir, "gguf"), PROMPT, 6)
    monkeypatch.setattr(QuantWeight, "linear",
                        lambda self, x, bias, routes=None: real_linear(self, q8_0(x), bias, routes))
    want, _ = greedy(python_matmuls(load_quantized(model_dir, "gguf")), PROMPT, 6)
    assert got == want
    for a, f in zip(got_logits, float_logits, strict=True):
        assert (a - f).abs().max() < 0.1 * f.abs().max()  # as int8 weights' (test_quant_model)

"""A model whose every matmul runs the native kernels (gguf-int, int8: ``KernelRoutes.own_pool``)
runs its forwards on kvcli's own pool: torch's ops on one thread, the kernels' many-row calls
on the pool (native.own_pool, pool.c kvcli_pool_wide), so torch's OpenMP team never runs and no
call waits at its barrier for a thread on a core another process holds. The numbers are those
of torch's team: the kernels' split is the caller's, whoever runs each part."""

from __future__ import annotations

import threading
from contextlib import nullcontext

import pytest
import torch
from test_quant_model import quant_gguf  # noqa: F401 - the tiny quantized GGUF fixture

from kvcli.engine.llm import LLM
from kvcli.model import native
from kvcli.model.quant.int_weights import IntWeight
from kvcli.model.routes import KernelRoutes
from kvcli.sampling_params import SamplingParams

needs_integer = pytest.mark.skipif(not native.qint_available(native.load()),
                                   reason="needs the integer kernels")
PROMPTS = [[(7 * i + j) % 200 + 3 for i in range(90 + 11 * j)] for j in range(3)]  # > 64 rows
GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)


@needs_integer
@pytest.mark.parametrize("quant_gguf", ["llama"], indirect=True)
def test_integer_forwards_run_on_kvcli_pool_with_torch_on_one_thread(quant_gguf, kvcli_home,  # noqa: F811
                                                                      monkeypatch):
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", "2")
    llm = LLM(str(quant_gguf), quantization="gguf-int")
    assert llm.engine.model.routes.own_pool
    assert "kvcli's own threads" in llm.engine.runner.backend.describe()["matmul"]
    seen: set[tuple[int, int]] = set()  # (torch's threads, the kernels') at each matmul
    run = IntWeight.linear
    monkeypatch.setattr(IntWeight, "linear", lambda self, x, bias, routes=None: seen.add(
        (torch.get_num_threads(), native.num_threads())) or run(self, x, bias, routes))
    torch_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
        assert torch.get_num_threads() == 2  # restored after every forward
        forward_calls, seen = seen, set()
        monkeypatch.setattr(KernelRoutes, "forward_threads", lambda self: nullcontext())
        want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]  # torch's team
    finally:
        torch.set_num_threads(torch_threads)
    assert (1, 2) in forward_calls  # the forwards' matmuls: torch on one thread, kernels on 2
    assert (2, 2) in forward_calls  # the logits (compute_logits) outside a forward
    assert seen == {(2, 2)}
    assert got == want


@needs_integer
@pytest.mark.parametrize("quant_gguf", ["llama"], indirect=True)
def test_float_matmuls_keep_torch_team(quant_gguf, kvcli_home, tiny_models):  # noqa: F811
    """gguf's prefill and float32's large matmuls run torch's library: its threads stay."""
    assert not LLM(str(quant_gguf), quantization="gguf").engine.model.routes.own_pool
    assert not LLM(str(tiny_models["llama"])).engine.model.routes.own_pool
    assert LLM(str(tiny_models["llama"]), quantization="int8").engine.model.routes.own_pool


def test_the_pool_setting_is_the_calling_threads():
    lib = native.load()
    if lib is None:
        pytest.skip("needs the native kernels")
    other: list[int] = []
    with native.own_pool(lib):
        assert lib.kvcli_pool_wide(1) == 1  # set here, as own_pool left it
        worker = threading.Thread(target=lambda: other.append(lib.kvcli_pool_wide(0)))
        worker.start()
        worker.join()
        with native.own_pool(lib):  # nested: the outer count and setting come back
            assert torch.get_num_threads() == 1
        assert lib.kvcli_pool_wide(1) == 1
    assert other == [0] and lib.kvcli_pool_wide(0) == 0

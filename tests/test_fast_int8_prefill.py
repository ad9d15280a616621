"""fast's int8 prefill copy on a GGUF (precision._fast_prefill "int8", quant/int_weights.py):
where AVX512-VNNI runs the integer kernels without AMX, each quantized Linear keeps an int8
copy per output channel of its blocks, which its matmuls of I8_PREFILL_ROWS rows or more run
on the same kernels; fewer rows (decode) stay on the blocks, half the bytes to stream."""

from __future__ import annotations

import pytest
import torch
from test_fast_prefill import ZEN4, packed_with_copy  # ZEN4: AVX512-VNNI, no AMX
from test_precision import with_flags
from test_quant_model import quant_gguf  # noqa: F401 - the tiny quantized GGUF fixture

from kvcli.engine.kv_disk import weights_form
from kvcli.engine.llm import LLM
from kvcli.model import native
from kvcli.model.quant.int_weights import I8_PREFILL_ROWS, IntWeight, pack
from kvcli.model.quant.weights import I8, quantize_int8
from kvcli.sampling_params import SamplingParams

needs_integer = pytest.mark.skipif(not native.qint_available(native.load()),
                                   reason="needs the integer kernels")


@needs_integer
def test_many_rows_run_the_int8_copy_and_few_the_blocks():
    dense, routes, plain, copied = packed_with_copy(i8_prefill_rows=8)
    own = pack(quantize_int8(torch.from_numpy(dense)), routes)  # the copy's arithmetic
    assert plain.i8 is None and copied.i8 is not None and copied.i8.kind == I8
    assert copied.nbytes == plain.nbytes + own.nbytes
    few, many = torch.randn(7, 64), torch.randn(2, 4, 64)  # 8 rows in a [2, 4] batch
    assert torch.equal(copied.linear(few, None), plain.linear(few, None))
    got = copied.linear(many, None)
    assert got.shape == (2, 4, 48) and torch.equal(got, own.linear(many, None))
    assert not torch.equal(got, plain.linear(many, None))
    torch.testing.assert_close(got, many @ torch.from_numpy(dense).T, rtol=0.05, atol=0.05)


@needs_integer
@pytest.mark.parametrize("quant_gguf", ["llama"], indirect=True)
def test_fast_gguf_prefills_from_the_copy_and_keys_its_cache_apart(quant_gguf, kvcli_home,  # noqa: F811
                                                                   monkeypatch):
    monkeypatch.delenv("KVCLI_FAST_PREFILL", raising=False)
    with_flags(monkeypatch, ZEN4)
    llm = LLM(str(quant_gguf), precision="fast", quantization="gguf-int")
    assert llm.engine.model.routes.i8_prefill_rows == I8_PREFILL_ROWS
    assert "int8 prefill matmuls" in llm.engine.runner.backend.describe()["precision"]
    few = " with int8 batched decode" if native.w8a8_available(native.load()) else ""
    assert weights_form(llm.engine.config, llm.engine.model) == f"gguf-int with int8 prefill{few}"
    calls: list[tuple[int, int]] = []  # (kind, rows) of every integer matmul
    run = IntWeight.linear
    monkeypatch.setattr(IntWeight, "linear", lambda self, x, bias, routes=None: calls.append(
        (self.kind, x.numel() // x.shape[-1])) or run(self, x, bias, routes))
    prompt = [(7 * i) % 200 + 3 for i in range(I8_PREFILL_ROWS + 9)]
    out = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
    assert {k for k, rows in calls if rows >= I8_PREFILL_ROWS and k == I8}  # the long prefill
    assert {k for k, rows in calls if rows < I8_PREFILL_ROWS} - {I8}  # decode: the blocks
    monkeypatch.setenv("KVCLI_FAST_PREFILL", "blocks")
    plain = LLM(str(quant_gguf), precision="fast", quantization="gguf-int")
    assert plain.engine.model.routes.i8_prefill_rows == 0
    assert weights_form(plain.engine.config, plain.engine.model) == f"gguf-int{few}"

"""The attention backend is chosen once per model by kvcli/model/attention/selector.py, from
the platform (device, KV dtype, the CPU's compiled kernels) and the model's layers; a new
backend is one class plus one line in the selector's BACKENDS."""

from __future__ import annotations

import pytest
import torch
from counting_backend import CountingBackend

from kvcli.engine.llm import LLM
from kvcli.model import large_gemm, native
from kvcli.model.attention import (
    LayerAttention,
    build_attention_metadata,
    selector,
    torch_prefill_cascade,
)
from kvcli.model.attention.cuda import TorchDeviceBackend
from kvcli.model.attention.native_bf16 import NativeBF16Backend
from kvcli.model.attention.native_cpu import NativeCPUBackend
from kvcli.model.attention.native_int8 import INT8_STORAGE, NativeInt8Backend
from kvcli.model.attention.softcap import SoftcapBackend
from kvcli.model.attention.torch_sdpa import TorchSDPABackend
from kvcli.model.platform import Platform
from kvcli.model.routes import select_routes
from kvcli.sampling_params import SamplingParams

PLAIN = [LayerAttention(0.125), LayerAttention(0.125, sliding_window=8)]
CAPPED = [LayerAttention(0.125, softcap=50.0)] * 2
needs_native = pytest.mark.skipif(native.load() is None, reason="no C compiler")


def platform(device: str = "cpu", dtype: torch.dtype = torch.float32, lib: object = None
             ) -> Platform:
    return Platform(torch.device(device), dtype, lib, "avx512" if lib is not None else "")


@needs_native
def test_cpu_float32_with_kernels_takes_the_native_backend() -> None:
    assert type(selector.select_attention_backend(platform(lib=native.load()), PLAIN)) \
        is NativeCPUBackend


def test_an_int8_cache_takes_its_native_backend_or_is_refused() -> None:
    lib = native.load()  # the report asks the kernels whether they score in integers
    chosen = selector.select_attention_backend(platform(dtype=INT8_STORAGE, lib=lib), PLAIN)
    assert type(chosen) is NativeInt8Backend and "int8" in chosen.decode
    probe = torch.empty(2, 1, 1, 72, dtype=INT8_STORAGE)
    assert ("VNNI integer scores" in chosen.decode) == native.int_scores(lib, probe, 64)
    tiles = lib is not None and native.attention_amx(lib, probe)  # AMX implies VNNI's scores
    assert ("AMX tiles (int8 scores" in chosen.prefill) == tiles
    assert tiles or chosen.prefill == chosen.decode
    for plat, layers, why in [(platform(dtype=INT8_STORAGE), PLAIN, "needs the native CPU"),
                              (platform("cuda", INT8_STORAGE), PLAIN, "CPU only"),
                              (platform(dtype=INT8_STORAGE, lib=object()), CAPPED, "soft-capped")]:
        with pytest.raises(ValueError, match=f"--kv-cache-dtype int8: .*{why}"):
            selector.select_attention_backend(plat, layers)


def test_a_bfloat16_cache_under_a_float32_model_takes_its_native_backend() -> None:
    bf16 = platform(dtype=torch.bfloat16, lib=object())
    chosen = selector.select_attention_backend(bf16, PLAIN, torch.float32)
    assert type(chosen) is NativeBF16Backend and "bfloat16" in chosen.decode
    assert type(selector.select_attention_backend(bf16, PLAIN, torch.bfloat16)) \
        is not NativeBF16Backend  # a bfloat16 model's own cache: not a converted one
    with pytest.raises(ValueError, match="--kv-cache-dtype bfloat16: needs the native CPU"):
        selector.select_attention_backend(platform(dtype=torch.bfloat16), PLAIN, torch.float32)


@pytest.mark.parametrize("plat", [platform(), platform(dtype=torch.bfloat16, lib=object())],
                         ids=["no-kernels", "bfloat16"])
def test_cpu_without_float32_kernels_takes_torch_sdpa(plat: Platform) -> None:
    assert type(selector.select_attention_backend(plat, PLAIN)) is TorchSDPABackend


def test_cuda_takes_the_device_backend_without_the_prefill_cascade() -> None:
    chosen = selector.select_attention_backend(platform("cuda"), PLAIN)
    assert type(chosen) is TorchDeviceBackend and chosen.name == "cuda"
    # Two chunks after the same 4 cached blocks: the CPU route attends the prefix once.
    common = build_attention_metadata([[0, 1, 2, 3, 4], [0, 1, 2, 3, 5]], [16, 16], [3, 3], 4,
                                      "cpu")
    cpu = selector.select_attention_backend(platform(), PLAIN).build_metadata(common)
    assert len(cpu.prefill_groups) == (0 if torch_prefill_cascade._FLASH_LSE is None else 1)
    assert chosen.build_metadata(common).prefill_groups == []


@pytest.mark.parametrize("plat", [platform(), platform("cuda"), platform(lib=object())],
                         ids=["torch-cpu", "cuda", "native-cpu"])
def test_a_softcapped_model_takes_the_softcap_backend(plat: Platform) -> None:
    assert type(selector.select_attention_backend(plat, CAPPED)) is SoftcapBackend
    with pytest.raises(ValueError, match="only in part"):
        selector.select_attention_backend(plat, [CAPPED[0], PLAIN[0]])


def test_gemma2_runs_the_softcap_backend_and_reports_it(tiny_models) -> None:
    engine = LLM(str(tiny_models["gemma2"])).engine
    assert type(engine.model.attention_backend) is SoftcapBackend
    assert engine.runner.backend.describe()["decode_attention"] == SoftcapBackend.decode


@pytest.mark.parametrize(("vendor", "want"), [("AuthenticAMD", "onednn"), ("GenuineIntel", "mkl")])
def test_cpu_vendor_and_flags_choose_the_large_gemm_route(vendor, want, monkeypatch) -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch built without oneDNN")
    monkeypatch.delenv("KVCLI_LARGE_GEMM", raising=False)
    monkeypatch.setattr(large_gemm, "cpuinfo", lambda: (vendor, {"avx2", "avx512f"}))
    large_gemm.library.cache_clear()
    try:
        routes = select_routes(platform())
    finally:
        large_gemm.library.cache_clear()
    assert routes.large_gemm == want
    assert routes.describe()["matmul"].endswith({"onednn": "oneDNN", "mkl": "MKL"}[want])


def test_a_new_backend_is_one_class_and_one_selector_line(tiny_models, monkeypatch) -> None:
    """The dummy backend (tests/counting_backend.py) enters through BACKENDS; a tiny model then
    runs every layer through it and gives the torch SDPA route's tokens and logprobs exactly."""
    prompts = [[5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 9, 10, 11, 12, 13], [20, 21]]
    params = [SamplingParams(max_tokens=6, ignore_eos=True, logprobs=2),
              SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.8, seed=3, logprobs=2)]

    def run() -> tuple[LLM, list]:
        llm = LLM(str(tiny_models["llama"]), block_size=4)
        outs = [llm.generate(prompts, p) for p in params]
        return llm, [(c.token_ids, c.logprobs) for out in outs for o in out for c in o.outputs]

    monkeypatch.setattr(selector, "BACKENDS", (TorchSDPABackend,))
    _, want = run()
    monkeypatch.setattr(selector, "BACKENDS", (CountingBackend, *selector.BACKENDS))  # the line
    monkeypatch.setattr(CountingBackend, "calls", [])
    llm, got = run()
    assert type(llm.engine.model.attention_backend) is CountingBackend
    assert got == want
    layers = llm.engine.model.num_layers
    assert CountingBackend.calls and len(CountingBackend.calls) % layers == 0
    assert llm.engine.runner.backend.describe()["prefill_attention"] == CountingBackend.prefill

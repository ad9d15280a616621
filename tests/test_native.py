"""The native paged-decode kernel: equal to a plain gather + softmax reference, built once.

The kernel reads K/V through block tables in place; the reference gathers each sequence's
context and runs the textbook attention in float64. Shapes cover grouped heads (1, 3, 4 query
heads per KV head), head sizes 32/64/128, shared prefix blocks, shuffled block tables,
sliding windows and one-token contexts.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from native_variants import native_lib  # noqa: F401 - fixture

from kvcli.model import native
from kvcli.model.platform import detect_platform

lib = native.load()
pytestmark = pytest.mark.skipif(lib is None, reason="no C compiler: the torch path is used")


def reference(q, kv, tables, lens, block_size, window, scale):
    out = torch.empty_like(q)
    heads, kv_heads = q.shape[1], kv.shape[2]
    for s, (table, n) in enumerate(zip(tables, lens, strict=True)):
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size
                              for p in range(n)])
        first = max(0, n - window) if window else 0
        k = kv[0, slots[first:]].double().repeat_interleave(heads // kv_heads, dim=1)
        v = kv[1, slots[first:]].double().repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,thd->ht", q[s].double(), k) * scale
        out[s] = torch.einsum("ht,thd->hd", scores.softmax(-1), v).float()
    return out


@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 4, 32), (9, 3, 64), (8, 2, 128)])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_kernel_equals_reference(heads, kv_heads, dim, window, threads, monkeypatch, native_lib):  # noqa: F811
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    rng = random.Random(heads * dim)
    block_size, num_blocks = 4, 64
    kv = torch.randn(2, num_blocks * block_size, kv_heads, dim)
    free = list(range(1, num_blocks))
    rng.shuffle(free)
    shared = [free.pop() for _ in range(3)]  # a prefix every other sequence starts with
    lens = [1, 2, 5, 13, 16, 17, 30]
    tables = []
    for i, n in enumerate(lens):
        need = -(-n // block_size)
        own = shared[:need] if i % 2 and need > 3 else []
        tables.append(own + [free.pop() for _ in range(need - len(own))])
    width = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    q = torch.randn(len(lens), heads, dim)
    scale = dim**-0.5
    got = native.paged_decode_attention(native_lib, q, kv, bt, torch.tensor(lens), block_size,
                                        window, scale)
    want = reference(q, kv, tables, lens, block_size, window, scale)
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5), (got - want).abs().max()


def _home_with_the_session_build(home: Path) -> tuple[Path, Path]:
    """``home`` holding the session's build (KVCLI_KERNELS_DIR: the key a fresh home's build
    gets, compiled from nothing when the suite began), and a compiler that logs each call
    before running cc: what load() then asks of it shows whether it compiled anything."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    assert cc is not None
    session = native.build.build(cc, native.isa_flags("native"))  # cached: only `cc --version`
    kernels = home / "kernels"
    kernels.mkdir(parents=True)
    shutil.copy2(session, kernels / session.name)
    logger, log = home / "logging-cc", home / "cc.log"
    logger.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {cc} "$@"\n')
    logger.chmod(0o755)
    return logger, log


def test_build_is_cached_and_can_be_switched_off(monkeypatch, tmp_path):
    """A home whose kernels dir has the key's library loads it and compiles nothing (a fresh
    home's compile is the session's own, and tests/test_native_build.py's)."""
    logger, log = _home_with_the_session_build(tmp_path)
    monkeypatch.setenv("KVCLI_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(logger))
    monkeypatch.delenv("KVCLI_KERNELS_DIR", raising=False)
    native.load_variant.cache_clear()
    try:
        built = list((tmp_path / "kernels").glob("kvcli-kernels-*.so"))
        mtime = built[0].stat().st_mtime_ns
        assert native.load() is not None
        assert list((tmp_path / "kernels").glob("kvcli-kernels-*.so")) == built
        assert {c.split()[0] for c in log.read_text().splitlines()} == {"--version"}  # no compile
        native.load_variant.cache_clear()
        assert native.load() is not None and built[0].stat().st_mtime_ns == mtime  # reused
        monkeypatch.delenv("CC")
        native.load_variant.cache_clear()
        monkeypatch.setenv("KVCLI_NATIVE", "0")
        assert native.load() is None
        native.load_variant.cache_clear()
        monkeypatch.delenv("KVCLI_NATIVE")
        monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
        assert native.load() is None  # the engine keeps its torch path
        native.load_variant.cache_clear()
        monkeypatch.delenv("CC")
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("")
        monkeypatch.setenv("KVCLI_HOME", str(blocker))  # the cache cannot be written
        assert native.load() is None
    finally:
        native.load_variant.cache_clear()


def test_loading_the_kernel_keeps_denormals():
    """-ffast-math at link time would flush denormals to zero for torch and NumPy too."""
    import numpy as np

    assert native.load() is not None
    assert np.float32(1e-39) * np.float32(1.5) != 0
    assert (torch.tensor([1e-39]) * 1.5).item() != 0


@pytest.mark.parametrize("rows", [1, 17, 200])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_elementwise_kernels_equal_torch(rows, threads, monkeypatch, native_lib):  # noqa: F811
    from kvcli.model.layers import apply_rotary

    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    torch.manual_seed(rows)
    x, weight = torch.randn(rows, 96) * 3, torch.randn(96)
    want = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.allclose(native.rms_norm(native_lib, x, weight, 1e-5), want, atol=1e-5, rtol=1e-5)

    gate_up = torch.randn(rows, 2 * 48) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    got = native.silu_and_mul(native_lib, gate_up)
    assert torch.allclose(got, torch.nn.functional.silu(gate) * up, atol=1e-5, rtol=1e-5)

    heads, kv, dim = 4, 2, 16  # q heads then k heads, then v heads left untouched
    qkv = torch.randn(rows, (heads + 2 * kv) * dim)
    angles = torch.rand(rows, dim // 2) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    qk = qkv[:, : (heads + kv) * dim].reshape(rows, heads + kv, dim)
    want = apply_rotary(qk, cos[:, None], sin[:, None])
    v_before = qkv[:, (heads + kv) * dim :].clone()
    native.rope_(native_lib, qkv, cos.contiguous(), sin.contiguous(), heads + kv, dim)
    got = qkv[:, : (heads + kv) * dim].reshape(rows, heads + kv, dim)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, (heads + kv) * dim :], v_before)

    # fast's bfloat16 q/k/v product: widened and rotated in one pass, the numbers of widening
    # and then rotating, the v heads only widened
    narrow = torch.randn(rows, (heads + 2 * kv) * dim).bfloat16()
    wide = narrow.float()
    native.rope_(native_lib, wide, cos.contiguous(), sin.contiguous(), heads + kv, dim)
    got = native.rope_widen(native_lib, narrow, cos.contiguous(), sin.contiguous(), heads + kv, dim)
    assert got.dtype == torch.float32 and torch.equal(got, wide)


def test_kernel_threads_follow_torch(monkeypatch):
    monkeypatch.delenv("KVCLI_NATIVE_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert native.num_threads() == 1  # a Ray actor's or --threads' share bounds the kernels
        monkeypatch.setenv("KVCLI_NATIVE_THREADS", "3")
        assert native.num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_isa_override_is_built_apart_and_reported(monkeypatch):
    """KVCLI_NATIVE_ISA picks the variant; the backend names what was built."""
    from native_variants import VARIANTS

    from kvcli.model.platform import kernel_isa

    with pytest.raises(ValueError, match="KVCLI_NATIVE_ISA='sse2': expected one of"):
        native.isa_flags("sse2")
    if "avx2" not in VARIANTS:
        pytest.skip("one variant on this CPU")
    assert kernel_isa(native.load_variant("avx2")) == "avx2+fma"
    assert kernel_isa(native.load_variant("native")) == "avx512"
    monkeypatch.setenv("KVCLI_NATIVE_ISA", "avx2")
    assert native.load() is native.load_variant("avx2") is not native.load_variant("native")


def test_cpu_flags_choose_the_kernel_variant(monkeypatch) -> None:
    """KVCLI_NATIVE_ISA builds the kernels for a variant the CPU's flags must allow. (Here, late
    in the suite, rather than with the selector's tests: a whole-suite run compiles the AVX2
    variant in the time its tests leave idle, tests/kernel_builds.py.)"""
    if "avx2" not in native._cpu_flags().split():
        pytest.skip("not an AVX2 CPU")
    monkeypatch.setenv("KVCLI_NATIVE_ISA", "avx2")
    assert detect_platform("cpu", torch.float32).isa == "avx2+fma"
    monkeypatch.setattr(native.build, "cpu_flags", lambda: "flags : sse2")  # what isa_flags reads
    native.load_variant.cache_clear()  # the variant is built (and its flags checked) once
    try:
        with pytest.raises(ValueError, match="this CPU lacks avx2"):
            detect_platform("cpu", torch.float32)
    finally:
        native.load_variant.cache_clear()


def test_many_row_calls_on_torchs_team_equal_this_pool(monkeypatch):
    """Prefill-sized calls run on torch's OpenMP team (pool.c kvcli_parallel_wide): the parts
    are the caller's split, so who runs them changes no bit."""
    from test_kv_int8_kernels import backend, quantized

    from kvcli.model.attention import LayerAttention, build_attention_metadata

    lib = native.load()
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", "2")
    torch.manual_seed(3)
    x, weight = torch.randn(300, 96), torch.randn(96)
    kv = torch.randn(2, 224, 3, 64)
    q = torch.randn(224, 9, 64)
    meta = backend(lib).build_metadata(build_attention_metadata(
        [list(range(7)), list(range(7, 14))], [0, 0], [112, 112], 16, "cpu"))
    layer = backend(lib).layer(LayerAttention(0.125))
    runs = []
    try:
        for on in (False, True):
            assert lib.kvcli_pool_team(int(on)) == int(on)  # torch's CPU wheel has libgomp
            kv8 = quantized(lib, kv)
            out = layer.forward(q, kv[0], kv[1], kv8, meta)
            runs.append((native.rms_norm(lib, x, weight, 1e-5), kv8, out))
    finally:
        lib.kvcli_pool_team(1)
    for before, after in zip(*runs, strict=True):
        assert torch.equal(before, after)


def test_a_forked_child_runs_many_row_calls_on_its_own_pool(monkeypatch):
    """An OpenMP team does not survive fork(): the child's prefill-sized calls take kvcli's own
    pool (pool.c after_fork_in_child) instead of hanging on the parent's team."""
    import time

    lib = native.load()
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", "2")
    x, weight = torch.randn(300, 96), torch.randn(96)
    want = native.rms_norm(lib, x, weight, 1e-5)  # the parent's team runs a call first
    pid = os.fork()
    if pid == 0:  # the child: the same call, then out without pytest's teardown
        got = native.rms_norm(lib, x, weight, 1e-5)
        os._exit(0 if lib.kvcli_pool_team(1) == 0 and torch.equal(got, want) else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child's native call hung")

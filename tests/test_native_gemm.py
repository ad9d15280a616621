"""The native few-row matmuls (native/gemm.c, native/gemm_nt.c, native/gemv.c) and the worker
pool every native kernel runs on.

The kernel is checked against float64 for row counts across its register tiles (1..70 rows:
whole tiles, the last partial tile), column counts that leave a remainder past the last
whole tile, K spanning several panels and one partial panel, with and without bias, on 1, 2
and more threads than tiles. The pool must survive concurrent callers and fork.
"""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch
from native_variants import native_lib  # noqa: F401 - fixture

from kvcli.model import layers, native

lib = native.load()
pytestmark = pytest.mark.skipif(lib is None, reason="no C compiler: the torch path is used")


def reference(x, w_in_out, bias):
    y = x.double() @ w_in_out.double()
    return (y if bias is None else y + bias.double()).float()


@pytest.mark.parametrize("rows", [1, 5, 8, 13, 32, 70])
@pytest.mark.parametrize("shape", [(576, 960), (200, 72), (1536, 40), (64, 3)])
@pytest.mark.parametrize("threads", ["1", "2", "5"])
def test_gemm_equals_float64(rows, shape, threads, monkeypatch, native_lib):  # noqa: F811
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    torch.manual_seed(rows * 7 + shape[1])
    in_f, out_f = shape
    x, w = torch.randn(rows, in_f), torch.randn(in_f, out_f) / in_f**0.5
    for bias in (None, torch.randn(out_f)):
        got = native.gemm(native_lib, x, w, bias)
        assert got.shape == (rows, out_f)
        assert torch.allclose(got, reference(x, w, bias), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", [(576, 960), (1536, 40), (131, 37), (64, 3), (7, 9)])
@pytest.mark.parametrize("threads", ["1", "2", "5"])
def test_gemv_equals_float64(shape, threads, monkeypatch, native_lib):  # noqa: F811
    """One row: K split in slabs (whole 4-row passes and a tail; 7 rows: one slab), N past the
    last whole vector, with and without bias, on 1, 2 and more threads than 64-row slabs."""
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    torch.manual_seed(shape[0] + shape[1])
    in_f, out_f = shape
    x, w = torch.randn(1, in_f), torch.randn(in_f, out_f) / in_f**0.5
    for bias in (None, torch.randn(out_f)):
        got = native.gemv(native_lib, x[0], w, bias)
        assert torch.allclose(got, reference(x, w, bias)[0], atol=2e-5, rtol=1e-4)


def test_linear_routes_decode_rows_to_the_kernel(monkeypatch):
    """layers.linear sends 2..64-row float32 matmuls on an [in, out] weight to the kernel."""
    calls = []
    real = native.gemm
    monkeypatch.setattr(native, "gemm", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    torch.manual_seed(0)
    w = torch.randn(96, 48).t()  # [out, in] view of an [in, out] buffer, as the loader stores it
    for rows in (1, 2, 5, 32, 64, 65):
        x = torch.randn(rows, 96)
        torch.testing.assert_close(layers.linear(x, w), x @ w.t(), atol=1e-5, rtol=1e-5)
    assert calls == [2, 5, 32, 64]
    nt_calls = []
    real_nt = native.gemm_nt
    monkeypatch.setattr(native, "gemm_nt", lambda *a: nt_calls.append(a[1].shape[0]) or real_nt(*a))
    out_in = w.contiguous()  # [out, in] storage: a tied embedding as the LM head
    for rows in (1, 8, 64, 65):
        x = torch.randn(rows, 96)
        torch.testing.assert_close(layers.linear(x, out_in), x @ w.t(), atol=1e-5, rtol=1e-5)
    assert calls == [2, 5, 32, 64] and nt_calls == [8, 64]  # 1 row: NumPy; 65: torch


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 8, 9, 32, 70])
@pytest.mark.parametrize("shape", [(576, 1000), (200, 7), (37, 9), (8, 1)])  # (in, out)
@pytest.mark.parametrize("threads", ["1", "2", "5"])
def test_gemm_nt_equals_float64(rows, shape, threads, monkeypatch, native_lib):  # noqa: F811
    """x @ W^T on an [out, in] W: every row tile (AVX2 3 rows, AVX-512 5, then every shorter
    one), every column tile (4 or 5 rows of W, then single ones), k tails past the last vector (in 200, 37) and no whole vector
    (in 8 on AVX-512), on 1, 2 and more threads than W has tiles."""
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", threads)
    torch.manual_seed(rows * 5 + shape[1])
    in_f, out_f = shape
    x, w = torch.randn(rows, in_f), torch.randn(out_f, in_f) / in_f**0.5
    got = native.gemm_nt(native_lib, x, w)
    assert got.shape == (rows, out_f)
    assert torch.allclose(got, reference(x, w.t(), None), atol=2e-5, rtol=1e-4)


def test_pool_serves_concurrent_callers(monkeypatch):
    """A second thread finding the pool busy runs its parts itself; results stay exact."""
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", "2")
    torch.manual_seed(1)
    w = torch.randn(256, 320)
    xs = [torch.randn(24, 256) for _ in range(4)]
    want = [native.gemm(lib, x, w, None) for x in xs]
    errors: list[str] = []

    def work(i: int) -> None:
        for _ in range(200):
            if not torch.equal(native.gemm(lib, xs[i], w, None), want[i]):
                errors.append(f"thread {i}")
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)


def _gemm_in_child(queue) -> None:
    x, w = torch.ones(8, 64), torch.ones(64, 32)
    queue.put(float(native.gemm(native.load(), x, w, None).sum()))


def test_pool_works_after_fork(monkeypatch):
    monkeypatch.setenv("KVCLI_NATIVE_THREADS", "2")
    native.gemm(lib, torch.ones(8, 64), torch.ones(64, 32), None)  # the parent's workers exist
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_gemm_in_child, args=(queue,))
    child.start()
    child.join(timeout=300)
    assert child.exitcode == 0 and queue.get(timeout=5) == 8 * 32 * 64.0


"""The CPU kernel of one row or a few (attnlab.fast.matvec) against F.linear: values in fp32
and bf16, odd widths and row counts, bias, the Linear layer's dispatch (a few rows without
gradients only), inside torch.compile, the fallback where the kernel is off, and use_matvec's
in-place swap.

The kernel is built (about 6 s the first time, then loaded from torch's on-disk cache) inside
the module-scoped ``kernel`` fixture, by the first test that needs it: never at collection."""

from __future__ import annotations

import os
import shutil
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.fast import matvec as mv
from attnlab.fast.matvec import Linear, matvec, matvec_available, use_matvec


@pytest.fixture(scope="module")
def kernel() -> None:
    """Build (or load) the kernel once for this module, or skip saying why it cannot be."""
    if not mv._cpu_has_avx2_fma():
        pytest.skip("the one-row kernel needs an x86 CPU with AVX2 and FMA")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("the one-row kernel needs a C++ compiler (c++/g++ on PATH)")
    if not matvec_available():
        pytest.skip("the one-row kernel could not be built (see the logged warning)")


def _ops_called(fn) -> set[str]:
    with torch.profiler.profile() as prof:
        fn()
    return {e.name for e in prof.events()}


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("K", [384, 37, 8, 1])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp32_one_row_equals_f_linear(K, with_bias):
    g = torch.Generator().manual_seed(K)
    W = torch.randn(300, K, generator=g)
    b = torch.randn(300, generator=g) if with_bias else None
    x = torch.randn(1, 1, K, generator=g)
    got = matvec(x, W, b)
    assert got.shape == (1, 1, 300) and got.dtype == torch.float32
    want = F.linear(x.double(), W.double(), None if b is None else b.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("M", [2, 3, 4, 5, 7, 17, 64])  # blocks of 4 rows and every remainder
@pytest.mark.parametrize("K", [384, 37, 8, 1])
@pytest.mark.parametrize("N", [300, 301])  # weight rows two at a time, and one left over
def test_fp32_few_rows_equal_f_linear(M, K, N):
    g = torch.Generator().manual_seed(M * K + N)
    W = torch.randn(N, K, generator=g)
    b = torch.randn(N, generator=g)
    x = torch.randn(M, 1, K, generator=g)
    got = matvec(x, W, b)
    assert got.shape == (M, 1, N) and got.dtype == torch.float32
    want = F.linear(x.double(), W.double(), b.double())
    # fp32 sums of K products: at most ~K/8 + 8 additions per chunk sum, each rounding by 2^-24
    # of the running magnitude (bounded by Σ|w·x| + |b|)
    scale = x.double().abs() @ W.double().abs().T + b.double().abs()
    assert ((got.double() - want).abs() <= (K / 8 + 10) * 2**-24 * scale).all()
    no_bias = F.linear(x.double(), W.double())
    assert ((matvec(x, W).double() - no_bias).abs() <= (K / 8 + 10) * 2**-24 * scale).all()


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("M", [1, 6])
@pytest.mark.parametrize("K", [384, 40, 3])
def test_bf16_accumulates_in_fp32_and_rounds_once(K, M):
    g = torch.Generator().manual_seed(0)
    W = torch.randn(1000, K, generator=g).bfloat16()
    b = torch.randn(1000, generator=g).bfloat16()
    x = torch.randn(M, K, generator=g).bfloat16()
    got = matvec(x, W, b)
    assert got.dtype == torch.bfloat16
    exact = F.linear(x.double(), W.double(), b.double())  # the same bf16 inputs, exactly
    # one rounding to bf16 (relative 2^-8) plus fp32 summation error
    err = (got.double() - exact).abs()
    assert (err <= exact.abs() * 2**-8 + 1e-4 * K).all()
    # never worse than torch's own bf16 product, by more than a bf16 rounding
    torch_err = (F.linear(x, W, b).double() - exact).abs()
    assert err.mean() <= torch_err.mean() + 2**-8 * exact.abs().mean()


@pytest.mark.usefixtures("kernel")
def test_linear_takes_the_kernel_for_a_few_rows_without_gradients_only():
    torch.manual_seed(0)
    layer = Linear(64, 48)
    plain = nn.Linear(64, 48)
    plain.load_state_dict(layer.state_dict())  # same parameters, same names
    x1, xf = torch.randn(1, 1, 64), torch.randn(2, mv.ROWS_FP32 // 2, 64)
    xb = torch.randn(2, mv.ROWS_FP32 // 2 + 1, 64)  # more rows than the kernel takes in fp32
    with torch.no_grad():
        assert "attnlab::matvec" in _ops_called(lambda: layer(x1))
        assert "attnlab::matvec" in _ops_called(lambda: layer(xf))  # a few rows
        assert "attnlab::matvec" not in _ops_called(lambda: layer(xb))  # a batch: F.linear
        torch.testing.assert_close(layer(x1), plain(x1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer(xf), plain(xf), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer(xb), plain(xb))
        bf16 = Linear(64, 48).bfloat16()  # bf16: the kernel up to ROWS_BF16 rows
        xs = torch.randn(1, mv.ROWS_BF16, 64).bfloat16()
        assert "attnlab::matvec" in _ops_called(lambda: bf16(xs))
        assert "attnlab::matvec" not in _ops_called(lambda: bf16(torch.cat([xs, xs], 1)))
    # with gradients: F.linear, and the gradients are nn.Linear's
    x = torch.randn(1, 64, requires_grad=True)
    assert "attnlab::matvec" not in _ops_called(lambda: layer(x))
    layer(x).sum().backward()
    assert layer.weight.grad is not None and x.grad is not None


@pytest.mark.usefixtures("kernel")
@pytest.mark.slow
def test_compiled_few_rows_linear_calls_the_kernel_without_a_graph_break():
    torch.manual_seed(0)
    model = nn.Sequential(Linear(32, 64), nn.GELU(), Linear(64, 16)).eval()
    x = torch.randn(1, 3, 32)  # three rows (a verification of two drafts)
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 0
        compiled = torch.compile(model, dynamic=False)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
        assert "attnlab::matvec" in _ops_called(lambda: compiled(x))


def test_without_the_kernel_every_product_is_f_linears(monkeypatch):
    was = matvec_available()
    monkeypatch.setenv("ATTNLAB_MATVEC", "0")
    mv._extension.cache_clear()
    try:
        assert not matvec_available()
        layer = Linear(16, 8)
        x = torch.randn(1, 16)
        with torch.no_grad():
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
            torch.testing.assert_close(matvec(x, layer.weight), F.linear(x, layer.weight))
    finally:
        monkeypatch.delenv("ATTNLAB_MATVEC")
        mv._extension.cache_clear()
    assert matvec_available() == was  # turned on again in the same process (loaded once)


def test_matvec_refuses_too_many_rows_or_another_width():
    with pytest.raises(ValueError, match=f"1 to {mv.MAX_ROWS} rows of width 8"):
        matvec(torch.randn(mv.MAX_ROWS + 1, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="rows of width 8, got x of shape \\(2, 7\\)"):
        matvec(torch.randn(2, 7), torch.randn(4, 8))


def test_use_matvec_swaps_plain_linears_in_place_keeping_names_and_ties():
    torch.manual_seed(0)
    emb = nn.Embedding(10, 8)
    model = nn.ModuleDict({"emb": emb, "proj": nn.Linear(8, 8), "head": nn.Linear(8, 10)})
    model["head"].weight = emb.weight  # tied
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 8)
    want = model["head"](model["proj"](x))
    assert use_matvec(model) is model
    assert type(model["proj"]) is Linear and type(model["head"]) is Linear
    assert model["head"].weight is emb.weight
    assert before.keys() == model.state_dict().keys()
    torch.testing.assert_close(model["head"](model["proj"](x)), want)  # a batch: F.linear


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    """A build killed mid-way leaves torch's lock file, on which every later build would wait
    forever; an old lock is removed, a recent one (a build in progress) is left alone."""
    lock = tmp_path / "lock"
    lock.write_text("")
    mv._clear_stale_lock(str(lock))
    assert lock.exists()  # seconds old: another process may be building
    old = time.time() - 2 * mv._STALE_LOCK_S
    os.utime(lock, (old, old))
    mv._clear_stale_lock(str(lock))
    assert not lock.exists()
    mv._clear_stale_lock(str(lock))  # no lock: nothing to do

"""The CPU kernel of one row or a few (attnlab.fast.matvec) against F.linear: values in fp32
and bf16, odd widths and row counts, bias, the Linear layer's dispatch (a few rows without
gradients only), inside torch.compile, the fallback where the kernel is off, and use_matvec's
in-place swap; int8 weights with per-row scales against the float64 product with the
dequantised weights, and Int8Linear's dispatch to them.

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
from torch.utils.flop_counter import FlopCounterMode

from attnlab.fast import kernel_build
from attnlab.fast import matvec as mv
from attnlab.fast.matvec import Linear, int8_matvec, matvec, matvec_available, use_matvec
from attnlab.fast.quant import Int8Linear
from kernel_checks import assert_compiled_calls, ops_called


@pytest.fixture(scope="module")
def kernel() -> None:
    """Build (or load) the kernel once for this module, or skip saying why it cannot be."""
    if not mv._cpu_has_avx2_fma():
        pytest.skip("the one-row kernel needs an x86 CPU with AVX2 and FMA")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("the one-row kernel needs a C++ compiler (c++/g++ on PATH)")
    if not matvec_available():
        pytest.skip("the one-row kernel could not be built (see the logged warning)")


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
@pytest.mark.parametrize("M", [2, 3, 4, 5, 6, 7, 8, 9, 10, 17, 64])  # blocks of 6, every remainder
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
@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("K", [384, 37])
def test_a_rows_result_does_not_depend_on_the_rows_computed_with_it(weights, K):
    """Bit for bit: each row of a product of 1-17 rows equals that row's product alone, so a
    speculative verification's linear layers compute each token as a one-token step does (its
    greedy tokens then follow plain decoding's, not a near-tie flipped by summation order)."""
    g = torch.Generator().manual_seed(K)
    W = torch.randn(301, K, generator=g)
    b = torch.randn(301, generator=g)
    q, s = _int8(301, K, g)
    x = torch.randn(17, K, generator=g)
    if weights == "bf16":
        W, b, x = W.bfloat16(), b.bfloat16(), x.bfloat16()

    def product(rows: torch.Tensor) -> torch.Tensor:
        return int8_matvec(rows, q, s, b) if weights == "int8" else matvec(rows, W, b)

    alone = torch.cat([product(x[r : r + 1]) for r in range(17)])
    for m in (2, 3, 5, 6, 7, 12, 17):
        assert torch.equal(product(x[:m]), alone[:m]), m


@pytest.mark.usefixtures("kernel")
def test_linear_takes_the_kernel_for_a_few_rows_without_gradients_only():
    torch.manual_seed(0)
    layer = Linear(64, 48)
    plain = nn.Linear(64, 48)
    plain.load_state_dict(layer.state_dict())  # same parameters, same names
    x1, xf = torch.randn(1, 1, 64), torch.randn(2, mv.ROWS_FP32 // 2, 64)
    xb = torch.randn(2, mv.ROWS_FP32 // 2 + 1, 64)  # more rows than the kernel takes in fp32
    with torch.no_grad():
        assert "attnlab::matvec" in ops_called(lambda: layer(x1))
        assert "attnlab::matvec" in ops_called(lambda: layer(xf))  # a few rows
        assert "attnlab::matvec" not in ops_called(lambda: layer(xb))  # a batch: F.linear
        torch.testing.assert_close(layer(x1), plain(x1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer(xf), plain(xf), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer(xb), plain(xb))
        bf16 = Linear(64, 48).bfloat16()  # bf16: the kernel up to ROWS_BF16 rows
        xs = torch.randn(1, mv.ROWS_BF16, 64).bfloat16()
        assert "attnlab::matvec" in ops_called(lambda: bf16(xs))
        assert "attnlab::matvec" not in ops_called(lambda: bf16(torch.cat([xs, xs], 1)))
    # with gradients: F.linear, and the gradients are nn.Linear's
    x = torch.randn(1, 64, requires_grad=True)
    assert "attnlab::matvec" not in ops_called(lambda: layer(x))
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
        assert "attnlab::matvec" in ops_called(lambda: compiled(x))


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
    kernel_build.clear_stale_lock(str(lock))
    assert lock.exists()  # seconds old: another process may be building
    old = time.time() - 2 * kernel_build.STALE_LOCK_S
    os.utime(lock, (old, old))
    kernel_build.clear_stale_lock(str(lock))
    assert not lock.exists()
    kernel_build.clear_stale_lock(str(lock))  # no lock: nothing to do


def _int8(N: int, K: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random int8 weights Q (N, K) in [-127, 127] and positive fp32 scales (N,)."""
    q = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    return q, torch.rand(N, generator=g) * 0.02 + 1e-3


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("M", [1, 2, 3, 5, 6, 7, 11, 17, 64])
@pytest.mark.parametrize("K", [384, 37, 8, 1])
@pytest.mark.parametrize("N", [300, 301])
def test_int8_rows_equal_the_float64_product_with_the_dequantised_weights(M, K, N):
    g = torch.Generator().manual_seed(M * K + N)
    q, s = _int8(N, K, g)
    b = torch.randn(N, generator=g)
    x = torch.randn(M, 1, K, generator=g)
    W = q.double() * s.double()[:, None]  # the weights the layer stands for: s_n · Q_nk
    got = int8_matvec(x, q, s, b)
    assert got.shape == (M, 1, N) and got.dtype == torch.float32
    want = F.linear(x.double(), W, b.double())
    # the int8 values convert exactly; the fp32 sum of K products rounds as in the fp32 test,
    # and the scale and the bias add one rounding each
    bound = (K / 8 + 12) * 2**-24 * (x.double().abs() @ W.abs().T + b.double().abs())
    assert ((got.double() - want).abs() <= bound).all()
    no_bias = (int8_matvec(x, q, s).double() - F.linear(x.double(), W)).abs()
    assert (no_bias <= bound).all()


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_rows_with_half_activations_round_once(dtype):
    g = torch.Generator().manual_seed(1)
    q, s = _int8(256, 96, g)
    x = torch.randn(5, 96, generator=g).to(dtype)
    got = int8_matvec(x, q, s.to(dtype))
    assert got.dtype == dtype
    exact = F.linear(x.double(), q.double() * s.to(dtype).double()[:, None])
    assert ((got.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-5 * 96).all()


@pytest.mark.usefixtures("kernel")
def test_int8_kernel_refuses_weights_without_scales_and_scales_without_int8():
    q, s = _int8(8, 16, torch.Generator().manual_seed(0))
    x = torch.randn(2, 16)
    with pytest.raises(RuntimeError, match="int8 weights take scales"):
        torch.ops.attnlab.matvec(x, q, None)  # int8 read as if it were floats: refused
    with pytest.raises(RuntimeError, match="int8 weights take scales"):
        torch.ops.attnlab.int8_matvec(x, q.float(), s, None)
    with pytest.raises(RuntimeError, match="one scale per weight row"):
        torch.ops.attnlab.int8_matvec(x, q, s[:5], None)
    with pytest.raises(ValueError, match="an int8 weight \\(N, K\\) and N scales"):
        int8_matvec(x, q, s[:5])
    with pytest.raises(ValueError, match="1 to 64 rows of width 16, got x of shape \\(2, 15\\)"):
        int8_matvec(torch.randn(2, 15), q, s)


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_takes_the_kernel_after_use_matvec_for_a_few_rows_only(monkeypatch, dtype):
    torch.manual_seed(0)
    layer = Int8Linear.from_linear(nn.Linear(64, 48).to(dtype))
    limit = mv.ROWS_INT8_FP32 if dtype == torch.float32 else mv.ROWS_INT8
    few, many = torch.randn(1, limit, 64).to(dtype), torch.randn(1, limit + 1, 64).to(dtype)
    with torch.no_grad():
        before = layer(few)
        assert "attnlab::int8_matvec" not in ops_called(lambda: layer(few))  # not asked for
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
        use_matvec(nn.Sequential(layer))
        assert not layer.few_rows_kernel  # AVX-512: torch's kernel is kept
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
        use_matvec(nn.Sequential(layer))
        assert layer.few_rows_kernel
        assert "attnlab::int8_matvec" in ops_called(lambda: layer(few))
        called = ops_called(lambda: layer(many))
        assert "attnlab::int8_matvec" not in called
        if dtype == torch.bfloat16:  # more than ROWS_INT8 rows (a prompt): MKL's fp32 product
            # of the dequantised weights, not torch's int8 kernel (slower without AVX-512)
            assert "aten::_weight_int8pack_mm" not in called
        exact_many = F.linear(many.double(), layer.dequantized().double(), layer.bias.double())
        torch.testing.assert_close(layer(many).double(), exact_many, rtol=2**-7, atol=2**-7)
        exact = F.linear(few.double(), layer.dequantized().double(), layer.bias.double())
        tol = 1e-5 if dtype == torch.float32 else 2**-7
        torch.testing.assert_close(layer(few).double(), exact, rtol=tol, atol=tol)
        torch.testing.assert_close(layer(few), before, rtol=tol, atol=tol)
    assert set(layer.state_dict()) == {"weight", "scale", "bias"}


@pytest.mark.usefixtures("kernel")
@pytest.mark.slow
def test_compiled_int8_rows_call_the_kernel_without_a_graph_break(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16)).bfloat16()
    model = use_matvec(
        nn.Sequential(
            *(Int8Linear.from_linear(m) if isinstance(m, nn.Linear) else m for m in plain)
        )
    ).eval()
    x = torch.randn(1, 5, 32).bfloat16()  # five rows (a verification of four drafts)
    assert_compiled_calls(model, x, "attnlab::int8_matvec")


@pytest.mark.usefixtures("kernel")
def test_the_flop_counter_counts_both_kernels_as_f_linear():
    g = torch.Generator().manual_seed(0)
    q, s = _int8(48, 32, g)
    w = torch.randn(48, 32, generator=g)
    x = torch.randn(2, 3, 32, generator=g)
    for op, args in ((torch.ops.attnlab.matvec, (x, w, None)),
                     (torch.ops.attnlab.int8_matvec, (x, q, s, None))):  # fmt: skip
        with FlopCounterMode(display=False) as counter:
            op(*args)
        assert counter.get_total_flops() == 2 * 6 * 48 * 32  # 2·M·N·K, M = 2·3 rows

"""The AVX-512 BF16 kernel for int8 weights and a few rows of bf16 activations
(attnlab.fast.int8_bf16), and the int8 layers' paths through it once prepared for decoding.

References: the float64 product of the dequantised weights (each output within the bf16
rounding of the exact value and the fp32 sum's error), and the one-row product of the same
kernel (a row's result does not depend on the rows computed with it, bit for bit)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from attnlab.config import ModelConfig
from attnlab.decoding import generate
from attnlab.fast import for_decoding
from attnlab.fast import int8_bf16 as kb
from attnlab.fast import matvec as mv
from attnlab.fast.quant import Int8Linear, quantize_int8
from attnlab.models.lm import DecoderLM
from kernel_checks import assert_compiled_calls, ops_called


@pytest.fixture(scope="module")
def kernel() -> None:
    """Build (or load) the kernel once for this module, or skip saying why it cannot be."""
    if not kb.cpu_has_avx512_bf16():
        pytest.skip("the int8 x bf16 kernel needs a CPU with AVX-512 BF16")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("the int8 x bf16 kernel needs a C++ compiler (c++/g++ on PATH)")
    if not kb.int8_bf16_available():
        pytest.skip("the int8 x bf16 kernel could not be built (see the logged warning)")


def _int8(N: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    s = (torch.rand(N, generator=g) * 0.02 + 1e-3).bfloat16()
    return q, s


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 9, 17, 32])
@pytest.mark.parametrize(("N", "K"), [(300, 64), (301, 96), (7, 32)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_rows_equal_the_float64_product_of_the_dequantised_weights(M, N, K, with_bias):
    q, s = _int8(N, K, seed=M * 1000 + N + K)
    g = torch.Generator().manual_seed(M)
    x = torch.randn(M, K, generator=g).bfloat16()
    b = torch.randn(N, generator=g).bfloat16() if with_bias else None
    y = kb.int8_bf16_rows(x, q, s, b)
    assert y.dtype == torch.bfloat16 and y.shape == (M, N)
    w = q.double() * s.double()[:, None]
    exact = F.linear(x.double(), w, None if b is None else b.double())
    # one rounding to bf16 (half an ulp: 2^-9 relative) after fp32 sums of K exact products
    err = (y.double() - exact).abs()
    bound = exact.abs() * 2.0**-8 + K * 2.0**-22 * (x.double().abs() @ w.abs().t()) + 1e-30
    assert bool((err <= bound).all()), float((err / bound).max())


@pytest.mark.usefixtures("kernel")
def test_a_rows_result_does_not_depend_on_the_rows_computed_with_it():
    """A verification of k + 1 tokens gives each token what a one-token step gives it."""
    q, s = _int8(301, 128, seed=0)  # 301: a tail of weight rows beside the groups of four
    x = torch.randn(33, 128, generator=torch.Generator().manual_seed(1)).bfloat16()
    b = torch.randn(301).bfloat16()
    alone = torch.cat([kb.int8_bf16_rows(x[i : i + 1], q, s, b) for i in range(33)])
    for m in (2, 3, 4, 5, 8, 11, 17, 32, 33):
        assert torch.equal(kb.int8_bf16_rows(x[:m], q, s, b), alone[:m]), m
    # leading dimensions are rows too
    assert torch.equal(kb.int8_bf16_rows(x[:6].view(2, 3, 128), q, s, b), alone[:6].view(2, 3, -1))


@pytest.mark.usefixtures("kernel")
def test_bad_input_is_refused_with_the_shapes():
    q, s = _int8(16, 64, seed=0)
    x = torch.randn(2, 64).bfloat16()
    with pytest.raises(ValueError, match="bf16 rows of width K = 64"):
        kb.int8_bf16_rows(x.float(), q, s)
    with pytest.raises(ValueError, match="got a torch.bfloat16 x of shape \\(2, 63\\)"):
        kb.int8_bf16_rows(x[:, :63], q, s)
    with pytest.raises(ValueError, match="a multiple of 32"):
        kb.int8_bf16_rows(torch.randn(2, 48).bfloat16(), q[:, :48], s)
    with pytest.raises(ValueError, match="an int8 weight \\(N, K\\) and N scales"):
        kb.int8_bf16_rows(x, q, s[:5])
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.attnlab_bf16.int8_rows(torch.randn(2, 48).bfloat16(), q[:, :48], s, None)


@pytest.mark.usefixtures("kernel")
def test_an_int8_layer_prepared_for_decoding_takes_the_kernel_for_a_few_bf16_rows(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    torch.manual_seed(0)
    layer = Int8Linear.from_linear(nn.Linear(64, 48).bfloat16())
    few = torch.randn(1, kb.ROWS_INT8_BF16, 64).bfloat16()
    many = torch.randn(1, kb.ROWS_INT8_BF16 + 1, 64).bfloat16()
    exact = lambda x: F.linear(x.double(), layer.dequantized().double(), layer.bias.double())  # noqa: E731
    with torch.no_grad():
        assert "attnlab_bf16::int8_rows" not in ops_called(lambda: layer(few))  # not asked for
        mv.use_matvec(nn.Sequential(layer))
        assert layer.bf16_kernel and not layer.few_rows_kernel
        assert "attnlab_bf16::int8_rows" in ops_called(lambda: layer(few))
        torch.testing.assert_close(layer(few).double(), exact(few), rtol=2**-7, atol=2**-7)
        # a prompt: oneDNN's bf16 product of the converted weights, not torch's int8 kernel
        called = ops_called(lambda: layer(many))
        assert "attnlab_bf16::int8_rows" not in called
        assert "aten::_weight_int8pack_mm" not in called
        torch.testing.assert_close(layer(many).double(), exact(many), rtol=2**-6, atol=2**-6)
        # fp32 activations are not this kernel's
        layer32 = mv.use_matvec(nn.Sequential(Int8Linear.from_linear(nn.Linear(64, 48))))[0]
        assert "attnlab_bf16::int8_rows" not in ops_called(lambda: layer32(few.float()))
        # K not a multiple of 32: torch's kernel
        odd = mv.use_matvec(nn.Sequential(Int8Linear.from_linear(nn.Linear(40, 8).bfloat16())))[0]
        assert "attnlab_bf16::int8_rows" not in ops_called(
            lambda: odd(torch.randn(3, 40).bfloat16())
        )
    # with a gradient wanted: not the kernel
    x = few.clone().requires_grad_()
    assert "attnlab_bf16::int8_rows" not in ops_called(lambda: layer(x))
    monkeypatch.setenv("ATTNLAB_MATVEC", "0")
    mv.use_matvec(nn.Sequential(layer))
    assert not layer.bf16_kernel


@pytest.mark.usefixtures("kernel")
def test_the_flop_counter_counts_it_as_f_linear():
    q, s = _int8(48, 64, seed=0)
    x = torch.randn(2, 3, 64).bfloat16()
    with FlopCounterMode(display=False) as counter:
        torch.ops.attnlab_bf16.int8_rows(x, q, s, None)
    assert counter.get_total_flops() == 2 * 6 * 48 * 64


@pytest.mark.usefixtures("kernel")
@pytest.mark.slow
def test_compiled_rows_call_the_kernel_without_a_graph_break():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32)).bfloat16()
    model = mv.use_matvec(quantize_int8(plain)).eval()
    x = torch.randn(1, 5, 64).bfloat16()  # five rows (a verification of four drafts)
    assert_compiled_calls(model, x, "attnlab_bf16::int8_rows")


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("position", ["rope", "learned"])
def test_greedy_speculation_of_an_int8_bf16_lm_is_plain_greedy_decoding(position):
    """The int8 layers of a bf16 LM prepared for decoding: steps and verifications through the
    kernel, the prompt (more rows than it takes) through oneDNN's product, and the tokens of
    draft speculation and prompt lookup those of plain greedy decoding."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=37, d_model=64, n_layers=2, n_heads=4, max_seq_len=96, position=position)
    target = for_decoding(DecoderLM(ModelConfig.from_dict(cfg)).eval(), dtype="bfloat16",
                          quantize="int8")  # fmt: skip
    torch.manual_seed(1)
    draft = DecoderLM(ModelConfig.from_dict({**cfg, "n_layers": 1})).eval()
    idx = torch.randint(0, 37, (1, kb.ROWS_INT8_BF16 + 8))  # a prompt past the kernel's rows
    called = ops_called(lambda: generate(target, idx, 3, temperature=0))
    assert "attnlab_bf16::int8_rows" in called
    plain = generate(target, idx, 40, temperature=0)
    for kw in (dict(draft=draft, speculate=4), dict(prompt_lookup=2, speculate=6)):
        assert torch.equal(generate(target, idx, 40, temperature=0, **kw), plain), kw

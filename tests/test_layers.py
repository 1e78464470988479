"""Norms and feed-forward layers against torch.nn and their formulas."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.layers import MLP, BatchNorm, LayerNorm, RMSNorm, SwiGLU, evaluating, make_norm


def _randomise(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rmsnorm_equals_torch_rmsnorm(eps):
    ours, ref = RMSNorm(24, eps=eps), nn.RMSNorm(24, eps=eps)
    _randomise(ours)
    ref.weight.data.copy_(ours.weight)
    x = torch.randn(3, 5, 24) * 3 + 1
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-6)


def test_rmsnorm_has_epsilon_inside_the_square_root():
    x = torch.randn(4, 8, dtype=torch.float64)
    eps = 0.7  # large, so inside vs outside the root differ clearly
    by_hand = x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps)
    torch.testing.assert_close(RMSNorm(8, eps=eps).double()(x), by_hand)


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_equals_torch_layernorm(bias):
    ours, ref = LayerNorm(24, eps=1e-5, bias=bias), nn.LayerNorm(24, eps=1e-5, bias=bias)
    _randomise(ours)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 24) * 3 + 1
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-6)
    assert (ours.bias is None) == (not bias)


def test_make_norm_by_name():
    assert isinstance(make_norm("layernorm", 8, bias=False), LayerNorm)
    assert isinstance(make_norm("rmsnorm", 8, eps=1e-3), RMSNorm)
    assert isinstance(make_norm("batchnorm", 8, bias=False), BatchNorm)
    with pytest.raises(ValueError, match="'layernorm', 'rmsnorm' or 'batchnorm'"):
        make_norm("groupnorm", 8)


@pytest.mark.parametrize("bias", [True, False])
def test_batchnorm_is_torch_batchnorm1d_over_batch_times_time(bias):
    """Statistics per feature over every token (B·T rows), running averages, evaluation mode."""
    ours, ref = BatchNorm(24, eps=1e-5, bias=bias), nn.BatchNorm1d(24, eps=1e-5)
    with torch.no_grad():
        ours.weight.normal_()
        ref.weight.copy_(ours.weight)
        if bias:
            ours.bias.normal_()
            ref.bias.copy_(ours.bias)
        else:
            ref.bias.zero_()
    for _ in range(3):  # training mode: the batch's statistics, running averages updated
        x = torch.randn(3, 5, 24) * 3 + 1
        torch.testing.assert_close(ours(x), ref(x.reshape(15, 24)).reshape(3, 5, 24))
    torch.testing.assert_close(ours.running_mean, ref.running_mean)
    torch.testing.assert_close(ours.running_var, ref.running_var)
    ours.eval(), ref.eval()
    x = torch.randn(2, 7, 24)
    torch.testing.assert_close(ours(x), ref(x.reshape(14, 24)).reshape(2, 7, 24))
    assert (ours.bias is None) == (not bias)


def test_batchnorm_in_training_mode_refuses_a_single_token():
    with pytest.raises(ValueError, match="at least 2 tokens"):
        BatchNorm(8)(torch.randn(1, 1, 8))
    assert BatchNorm(8).eval()(torch.randn(1, 1, 8)).shape == (1, 1, 8)


@pytest.mark.parametrize(
    ("activation", "formula"),
    [
        ("relu", lambda h: h.clamp(min=0)),
        ("gelu", lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))),
        (
            "gelu_tanh",
            lambda h: 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3))),
        ),
        ("silu", lambda h: h * torch.sigmoid(h)),
    ],
)
def test_mlp_is_act_of_x_w1_then_w2(activation, formula):
    mlp = MLP(8, activation=activation).double()
    assert mlp.fc1.weight.shape == (32, 8)  # 4× hidden by default
    x = torch.randn(5, 8, dtype=torch.float64)
    h = x @ mlp.fc1.weight.T + mlp.fc1.bias
    torch.testing.assert_close(mlp(x), formula(h) @ mlp.fc2.weight.T + mlp.fc2.bias)
    with pytest.raises(ValueError, match="'tanh'"):
        MLP(8, activation="tanh")


def test_swiglu_is_silu_gate_times_up_then_down():
    ffn = SwiGLU(12, 20).double()
    x = torch.randn(4, 12, dtype=torch.float64)
    a, b = x @ ffn.gate.weight.T, x @ ffn.up.weight.T
    torch.testing.assert_close(ffn(x), (a * torch.sigmoid(a) * b) @ ffn.down.weight.T)
    # default width ≈ 8/3·d_model (so the three matrices match a 4× MLP's two), rounded up to 8
    assert SwiGLU(96).gate.weight.shape[0] == 256
    assert ffn.gate.bias is None


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Sequential(nn.BatchNorm1d(4)))


@pytest.mark.parametrize("training", [True, False])
def test_evaluating_switches_to_eval_and_restores_the_flag_on_exit(training):
    net = _net().train(training)
    with evaluating(net) as inside:
        assert inside is net
        assert not any(m.training for m in net.modules())
    assert all(m.training == training for m in net.modules())


@pytest.mark.parametrize("training", [True, False])
def test_evaluating_restores_the_flag_when_the_block_raises(training):
    net = _net().train(training)
    with pytest.raises(RuntimeError, match="boom"):
        with evaluating(net):
            assert not net.training
            raise RuntimeError("boom")
    assert all(m.training == training for m in net.modules())


def test_evaluating_in_a_generator_restores_the_flag_when_it_is_closed_early():
    net = _net().train()

    def steps():
        with evaluating(net):
            for _ in range(5):
                yield net.training

    gen = steps()
    assert next(gen) is False and not net.training  # suspended inside the block
    gen.close()
    assert net.training
    assert list(steps()) == [False] * 5 and net.training  # and when it runs to the end

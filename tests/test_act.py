"""Adaptive computation time: the halting arithmetic against Graves's definitions written out
per position, the gradient of the ponder cost to the halting unit, the Universal Transformer's
steps and padding, and a ponder budget below one step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.config.base import ConfigError
from attnlab.config.variants import UniversalConfig
from attnlab.layers.act import AdaptiveComputation
from attnlab.models.universal import UniversalTransformer

B, T, N, EPS = 3, 5, 6, 0.05


class _TableHalting(nn.Module):
    """h_n = σ(logit_table[b, t, n] + bias): the state's channel 0 holds the step number n."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.logits = torch.logit(table)
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        n = s[..., 0].round().long() - 1  # (B, T)
        return self.logits.gather(-1, n[..., None]) + self.bias  # (B, T, 1)


def _run(table):
    halting = _TableHalting(table)
    act = AdaptiveComputation(halting, N, epsilon=EPS)
    s0 = torch.zeros(B, T, 2)
    return act(s0, lambda s, n: s + torch.tensor([1.0, 0.0])), halting


def _written_out(h: list[float]) -> tuple[int, float, list[float]]:
    """Graves 2016: N = min{n : Σ_{n'≤n} h ≥ 1 − ε} (at most N_max), R = 1 − Σ_{n<N} h_n,
    p_n = h_n before N and R at N."""
    total = 0.0
    for n in range(1, N + 1):
        if total + h[n - 1] >= 1 - EPS or n == N:
            return n, 1 - total, [*h[: n - 1], 1 - total]
        total += h[n - 1]
    raise AssertionError


def test_halting_arithmetic_equals_the_formula_written_out():
    torch.manual_seed(0)
    table = torch.rand(B, T, N) * 0.6 + 0.01  # some positions halt early, some hit N_max
    table[0, 0, 0] = 0.999  # halts at once: N = 1, R = 1
    table[1, 1] = 0.02  # never reaches the threshold: stops at the budget
    r, _ = _run(table)
    for b in range(B):
        for t in range(T):
            steps, rem, p = _written_out(table[b, t].tolist())
            assert r.steps[b, t] == steps
            assert r.remainder[b, t].item() == pytest.approx(rem, abs=1e-6)
            assert r.ponder[b, t].item() == pytest.approx(steps + rem, abs=1e-6)
            torch.testing.assert_close(r.weights[b, t, :steps], torch.tensor(p))
            assert r.weights[b, t, steps:].abs().sum() == 0
            # the output mixes the states s_n (channel 0 = n) with the weights p_n
            assert r.output[b, t, 0].item() == pytest.approx(
                sum((n + 1) * pn for n, pn in enumerate(p)), abs=1e-5
            )
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(B, T))
    assert r.steps[0, 0] == 1 and r.steps[1, 1] == N


def test_the_ponder_cost_sends_a_gradient_to_the_halting_unit():
    """∂ρ/∂b = −Σ_{n<N} h_n (1 − h_n): the remainder is the only differentiable part of N + R."""
    torch.manual_seed(1)
    table = torch.rand(B, T, N) * 0.5 + 0.05
    r, halting = _run(table)
    r.ponder.sum().backward()
    expected = 0.0
    for b in range(B):
        for t in range(T):
            steps, _, _ = _written_out(table[b, t].tolist())
            h = table[b, t, : steps - 1]
            expected -= (h * (1 - h)).sum().item()
    assert halting.bias.grad.item() == pytest.approx(expected, rel=1e-5)
    assert expected < 0  # raising the halting bias lowers the ponder cost


def _tiny(**kw) -> UniversalTransformer:
    torch.manual_seed(0)
    return UniversalTransformer(
        UniversalConfig.preset("tiny", vocab_size=5, d_model=16, **kw)
    ).eval()


def test_universal_transformer_reports_steps_and_trains_the_halting_unit():
    model = _tiny().train()
    idx = torch.randint(0, 5, (4, 7))
    out = model(idx, labels=torch.tensor([0, 1, 0, 1]))
    assert out.steps.shape == (4, 7) and ((out.steps >= 1) & (out.steps <= 8)).all()
    torch.testing.assert_close(out.ponder, out.steps + out.remainder)
    out.loss.backward()
    assert model.act.halting.weight.grad.abs().sum() > 0
    assert model.block.attn.qkv.weight.grad.abs().sum() > 0


def test_padding_takes_no_steps_and_changes_nothing():
    model = _tiny()
    idx = torch.randint(1, 5, (1, 5))
    alone = model(idx)
    padded = model(
        torch.cat([idx, torch.zeros(1, 3, dtype=torch.long)], 1),
        attention_mask=torch.tensor([[True] * 5 + [False] * 3]),
    )
    torch.testing.assert_close(padded.logits, alone.logits, atol=1e-5, rtol=1e-5)
    assert padded.steps[0, 5:].eq(0).all() and padded.steps[0, :5].equal(alone.steps[0])


def test_fixed_depth_takes_every_step():
    model = _tiny(halting="fixed", max_steps=3)
    out = model(torch.randint(0, 5, (2, 4)))
    assert out.steps.eq(3).all() and out.remainder.eq(0).all()


def test_a_ponder_budget_below_one_step_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"ponder budget max_steps=0 is below one step"):
        UniversalConfig.preset("tiny", max_steps=0)
    with pytest.raises(ValueError, match=r"below one step"):
        AdaptiveComputation(nn.Linear(4, 1), 0)

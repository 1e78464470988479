"""Mixture of experts: parameter and FLOP scaling, exactly top-k experts per token, the aux loss
and expert counts reported to collect_aux_losses (never kept on the layer)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from attnlab.attention import collect_aux_losses
from attnlab.layers import MLP, MoE, SwiGLU, load_balancing_loss

C, I, E = 16, 24, 8  # d_model, expert hidden width, experts


def _n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _flops(module, x) -> int:
    with FlopCounterMode(display=False) as counter:
        module(x)
    return counter.get_total_flops()


def _dense(expert: str, hidden: int = I):
    return SwiGLU(C, hidden, bias=False) if expert == "swiglu" else MLP(C, hidden, bias=False)


@pytest.mark.parametrize("expert", ["swiglu", "mlp"])
def test_parameters_grow_e_times_a_dense_ffn(expert):
    moe, dense = MoE(C, I, E, top_k=2, expert=expert), _dense(expert)
    router = C * E
    assert _n_params(moe) == E * _n_params(dense) + router
    assert _n_params(moe) / _n_params(dense) == pytest.approx(E, rel=0.05)


@pytest.mark.parametrize("expert", ["swiglu", "mlp"])
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_flops_per_token_grow_top_k_times(expert, top_k):
    hidden = 128  # at realistic widths the router (C·E per token) is a small extra
    moe, dense = MoE(C, hidden, E, top_k=top_k, expert=expert), _dense(expert, hidden)
    x = torch.randn(4, 16, C)
    n_tokens = 4 * 16
    router = 2 * n_tokens * C * E  # one (N, C) @ (C, E) matmul
    moe_flops, dense_flops = _flops(moe, x), _flops(dense, x)
    assert moe_flops == top_k * dense_flops + router
    assert moe_flops / dense_flops == pytest.approx(top_k, rel=0.1)


def _expert_by_hand(moe: MoE, e: int, x: torch.Tensor) -> torch.Tensor:
    w_in, w_out = moe.w_in[e], moe.w_out[e]
    if moe.expert == "swiglu":
        gate, up = w_in[: moe.hidden], w_in[moe.hidden :]
        return (F.silu(x @ gate.T) * (x @ up.T)) @ w_out.T
    return F.gelu(x @ w_in.T) @ w_out.T  # the exact GELU the MoE above is built with


@pytest.mark.parametrize("expert", ["swiglu", "mlp"])
@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_each_token_mixes_exactly_top_k_experts(expert, top_k):
    moe = MoE(C, I, E, top_k=top_k, expert=expert, activation="gelu").double()
    x = torch.randn(2, 5, C, dtype=torch.float64)
    out = moe(x)
    flat = x.reshape(-1, C)
    expected = []
    for token in flat:  # a plain loop over tokens with the router's weights
        probs = torch.softmax(token @ moe.router.weight.T, dim=-1)
        chosen = probs.argsort(descending=True)[:top_k]
        weights = probs[chosen] / probs[chosen].sum()
        expected.append(
            sum(w * _expert_by_hand(moe, int(e), token) for w, e in zip(weights, chosen))
        )
    torch.testing.assert_close(out.reshape(-1, C), torch.stack(expected))
    # and a single token's output depends on the weights of exactly top_k experts
    moe(x[:1, :1]).sum().backward()
    touched = (moe.w_in.grad.flatten(1).abs().sum(-1) > 0).sum().item()
    assert touched == top_k


def test_expert_counts_sum_to_tokens_times_top_k():
    moe = MoE(C, I, E, top_k=3)
    with collect_aux_losses() as aux:
        moe(torch.randn(3, 7, C))
    (counts,) = aux.expert_counts
    assert counts.shape == (E,)
    assert counts.sum().item() == 3 * 7 * 3
    assert (counts >= 0).all()
    assert not hasattr(moe, "expert_counts") and not hasattr(moe, "aux_loss")  # nothing kept


def _aux(moe, x):
    """The load-balancing loss and expert counts one forward reports."""
    with collect_aux_losses() as aux:
        moe(x)
    (loss,), (counts,) = aux.losses, aux.expert_counts
    return loss, counts


@pytest.mark.parametrize("top_k", [1, 2])
def test_aux_loss_is_top_k_under_uniform_routing_and_larger_when_skewed(top_k):
    moe = MoE(C, I, E, top_k=top_k)
    x = torch.randn(64, C)
    with torch.no_grad():
        moe.router.weight.zero_()  # every expert equally likely for every token
    assert _aux(moe, x)[0].item() == pytest.approx(top_k, abs=1e-6)
    # balanced hard routing: token n prefers expert n mod E
    probs = F.one_hot(torch.arange(64) % E, E).float() * 0.9 + 0.1 / E
    top_idx = probs.topk(top_k, dim=-1).indices
    balanced = load_balancing_loss(probs, top_idx, E).item()
    assert balanced == pytest.approx(top_k, rel=0.1)
    # skewed routing: every token strongly prefers expert 0
    with torch.no_grad():
        direction = torch.randn(C)
        direction /= direction.norm()
        moe.router.weight[0] = 4 * direction
    loss, counts = _aux(moe, 0.3 * torch.randn(64, C) + 3 * direction)
    assert counts[0].item() == 64
    assert loss.item() > top_k + 1
    # the loss is differentiable w.r.t. the router, so training can push towards balance
    _aux(moe, x)[0].backward()
    assert moe.router.weight.grad.abs().sum() > 0


def test_bad_moe_options_raise():
    with pytest.raises(ValueError, match=r"top_k must be in \[1, n_experts=4\], got 5"):
        MoE(C, I, 4, top_k=5)
    with pytest.raises(ValueError, match="'glu'"):
        MoE(C, I, 4, expert="glu")

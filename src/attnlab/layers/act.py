"""Adaptive computation time (Graves 2016): each position decides how many steps it takes.

After step n a halting unit gives every still-running position a probability

    h_n = σ(W_h s_n + b_h)

and the position stops at N = min{n : h_1 + … + h_n ≥ 1 − ε} (or at the budget N_max). Its
output is the mixture of its states with the weights p_n = h_n for n < N and the remainder
R = 1 − (h_1 + … + h_{N−1}) for n = N, so the weights sum to 1. The ponder cost ρ = N + R
(added to the loss times τ) is differentiable through R, which is how the gradient teaches the
halting unit to stop earlier. A halted position's state is copied forward unchanged (the
Universal Transformer's rule), so running positions still attend to it.

Shape legend: B batch, T positions, C width, N max_steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["AdaptiveComputation", "ACTResult"]


class ACTResult(NamedTuple):
    """What :class:`AdaptiveComputation` returns (padding positions: 0 steps, 0 cost).

    Attributes:
        output: ``(B, T, C)``, Σ_n p_n s_n.
        steps: ``(B, T)`` long, N per position.
        remainder: ``(B, T)``, R per position.
        ponder: ``(B, T)``, ρ = N + R.
        weights: ``(B, T, n_run)``, p_n for each step run (n_run ≤ N_max; 0 after halting).
    """

    output: Tensor
    steps: Tensor
    remainder: Tensor
    ponder: Tensor
    weights: Tensor


class AdaptiveComputation(nn.Module):
    """Runs a step function until every position has halted (ACT).

    Args:
        halting: the halting unit, ``(B, T, C) -> (B, T, 1)`` logits (``nn.Linear(C, 1)``).
        max_steps: N_max, the ponder budget (at least 1).
        epsilon: ε of the threshold 1 − ε.

    Raises:
        ValueError: ``max_steps < 1`` or ε outside (0, 1).
    """

    def __init__(self, halting: nn.Module, max_steps: int, *, epsilon: float = 0.01) -> None:
        super().__init__()
        if max_steps < 1:
            raise ValueError(f"the ponder budget max_steps={max_steps} is below one step")
        if not 0.0 < epsilon < 1.0:
            raise ValueError(f"epsilon must be in (0, 1), got {epsilon}")
        self.halting, self.max_steps, self.epsilon = halting, max_steps, epsilon

    def forward(
        self, state: Tensor, step: Callable[[Tensor, int], Tensor], real: Tensor | None = None
    ) -> ACTResult:
        """Ponder: ``s_n = step(s_{n−1}, n)`` for n = 1, 2, … while any position runs.

        Args:
            state: ``s_0 (B, T, C)``.
            step: one step of computation (the shared block), given the step number n.
            real: ``(B, T)`` bool, True = a real position (padding never runs).
        """
        B, T, _ = state.shape
        running = torch.ones(B, T, dtype=torch.bool, device=state.device) if real is None else real
        real = running
        cum = state.new_zeros(B, T)  # Σ h of the steps before halting
        remainder = state.new_zeros(B, T)
        steps = torch.zeros(B, T, dtype=torch.long, device=state.device)
        output = torch.zeros_like(state)
        weights = []
        for n in range(1, self.max_steps + 1):
            state = torch.where(running[..., None], step(state, n), state)  # halted: copied
            h = torch.sigmoid(self.halting(state)).squeeze(-1)  # (B, T)
            halts = running & ((cum + h >= 1 - self.epsilon) | (n == self.max_steps))
            p = torch.where(halts, 1 - cum, torch.where(running, h, torch.zeros_like(h)))
            output = output + p[..., None] * state
            remainder = torch.where(halts, 1 - cum, remainder)
            steps = steps + running.long()
            cum = cum + torch.where(running & ~halts, h, torch.zeros_like(h))
            running = running & ~halts
            weights.append(p)
            if not bool(running.any()):
                break
        ponder = torch.where(real, steps + remainder, torch.zeros_like(remainder))
        return ACTResult(output, steps, remainder, ponder, torch.stack(weights, dim=-1))

"""Mixture of experts (sparse FFN), Mixtral style.

    p = softmax(x W_r)                     router probabilities over E experts
    top-k experts per token, weights renormalised to sum to 1
    y = Σ_{e ∈ top-k} w_e · FFN_e(x)

Parameters grow E× a dense FFN, but each token only runs k experts, so FLOPs per token grow k×.
The load-balancing loss (Switch/Mixtral) is E · Σ_e f_e · P_e, with f_e the fraction of routing
assignments that went to expert e (Σ f = k) and P_e the mean router probability of e; it is k when
routing is uniform and grows as tokens pile onto a few experts.

Shape legend: B batch, T time, C d_model, N = B·T tokens, E experts, I expert hidden width, K top-k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.block import ACTIVATIONS
from attnlab.layers.hook import HookPoint, report_aux_loss

__all__ = ["MoE", "load_balancing_loss"]


def load_balancing_loss(probs: Tensor, top_idx: Tensor, n_experts: int) -> Tensor:
    """E · Σ_e f_e P_e from router probabilities ``(N, E)`` and chosen experts ``(N, K)``."""
    n_tokens = probs.shape[0]
    counts = torch.bincount(top_idx.flatten(), minlength=n_experts).to(probs.dtype)
    f = counts / max(n_tokens, 1)  # (E,), sums to K
    P = probs.mean(dim=0)  # (E,), sums to 1
    return n_experts * (f * P).sum()


class MoE(nn.Module):
    """Top-k routed mixture of expert FFNs.

    Expert weights are stored stacked, ``(E, ...)``, in the layout of HF Mixtral's fused experts.

    Args:
        d_model: token width C.
        hidden: each expert's inner width I.
        n_experts: E.
        top_k: experts per token K (1 ≤ K ≤ E).
        expert: ``swiglu`` (Mixtral) or ``mlp`` (two layers with ``activation``).
        activation: the MLP expert's activation.

    Each forward reports its load-balancing loss and the number of tokens routed to each expert
    to an open :func:`attnlab.attention.collect_aux_losses` context; the layer keeps neither.
    """

    def __init__(
        self,
        d_model: int,
        hidden: int,
        n_experts: int,
        top_k: int = 2,
        *,
        expert: str = "swiglu",
        activation: str = "gelu_tanh",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        if expert not in ("swiglu", "mlp"):
            raise ValueError(f"unknown expert {expert!r}; choose 'swiglu' or 'mlp'")
        kw = {"device": device, "dtype": dtype}
        self.d_model, self.hidden, self.n_experts, self.top_k, self.expert = (
            d_model,
            hidden,
            n_experts,
            top_k,
            expert,
        )
        self.router = nn.Linear(d_model, n_experts, bias=False, **kw)
        n_in = 2 * hidden if expert == "swiglu" else hidden
        self.w_in = nn.Parameter(torch.empty(n_experts, n_in, d_model, **kw))  # gate | up, or fc1
        self.w_out = nn.Parameter(torch.empty(n_experts, d_model, hidden, **kw))  # down, or fc2
        self.act = ACTIVATIONS[activation]
        for w in (self.w_in, self.w_out):
            nn.init.normal_(w, std=w.shape[-1] ** -0.5)
        # hook points: router logits (..., E); chosen experts and their weights (..., K)
        self.hook_router_logits = HookPoint()
        self.hook_expert_indices, self.hook_expert_weights = HookPoint(), HookPoint()

    def expert_forward(self, e: int, h: Tensor) -> Tensor:
        """Expert e on tokens ``h (n, C)``."""
        z = F.linear(h, self.w_in[e])  # (n, 2I) or (n, I)
        if self.expert == "swiglu":
            gate, up = z.chunk(2, dim=-1)
            z = F.silu(gate) * up
        else:
            z = self.act(z)
        return F.linear(z, self.w_out[e])  # (n, C)

    def forward(self, x: Tensor) -> Tensor:
        shape, E, K = x.shape, self.n_experts, self.top_k
        flat = x.reshape(-1, shape[-1])  # (N, C)
        logits = self.hook_router_logits(self.router(x)).reshape(-1, E)  # (N, E)
        probs = logits.float().softmax(dim=-1)  # (N, E)
        top_w, top_idx = probs.topk(K, dim=-1)  # (N, K)
        top_idx = self.hook_expert_indices(top_idx.view(*shape[:-1], K)).reshape(-1, K)
        top_w = (top_w / top_w.sum(dim=-1, keepdim=True)).to(x.dtype)
        top_w = self.hook_expert_weights(top_w.view(*shape[:-1], K)).reshape(-1, K)  # (N, K)
        out = torch.zeros_like(flat)
        # loop over experts (not tokens): each expert handles all of its tokens in one matmul
        for e in range(self.n_experts):
            tok, slot = (top_idx == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            y = self.expert_forward(e, flat[tok]) * top_w[tok, slot, None]
            out.index_add_(0, tok, y)
        report_aux_loss(
            load_balancing_loss(probs, top_idx, self.n_experts),
            torch.bincount(top_idx.flatten(), minlength=self.n_experts).detach(),
        )
        return out.reshape(shape)

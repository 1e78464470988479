# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2. Scaled dot-product and multi-head attention
#
# Attention(Q, K, V) = softmax(QKᵀ / √d_k) V, the masks that say which key a query may read,
# multi-head attention as four batched matrix products, and why the scores are divided by √d_k:
# the variance of q·k, measured.

# %%
import math
import os

import matplotlib.pyplot as plt
import torch

from attnlab.attention import (
    MultiHeadAttention,
    causal_mask,
    key_padding_mask,
    scaled_dot_product_attention,
)

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
torch.manual_seed(0)

# %% [markdown]
# ## The formula, written out
#
# Queries (B, H, T, D) against keys and values (B, H, S, D): scores QKᵀ/√D, a softmax over the
# keys, a weighted sum of the values. Every backend of attnlab (`math`, PyTorch's fused `sdpa`,
# the exact `tiled` one) computes the same thing.

# %%
B, H, T, S, D = 2, 4, 5, 7, 16
q, k, v = torch.randn(B, H, T, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)

by_hand = (q @ k.transpose(-2, -1) / math.sqrt(D)).softmax(-1) @ v
for backend in ("math", "sdpa", "tiled"):
    out = scaled_dot_product_attention(q, k, v, backend=backend)
    print(f"{backend:6s} max |difference| = {(out - by_hand).abs().max():.2e}")
    assert torch.allclose(out, by_hand, atol=1e-5)

# %% [markdown]
# ## Masks
#
# One convention: a boolean mask is `True` where a query may attend. A causal mask lets position
# i read positions 0 … i; a padding mask hides the keys past each sequence's length. Masked keys
# get weight exactly 0 (their scores are −∞ before the softmax).

# %%
print(causal_mask(4).int())
x = torch.randn(2, 1, 6, 8)
_, w = scaled_dot_product_attention(
    x, x, x, mask=key_padding_mask([6, 3]), is_causal=True, return_weights=True
)
print(w[1, 0].round(decimals=2))
assert (w[0, 0].triu(1) == 0).all()  # nothing above the diagonal
assert (w[1, 0, :, 3:] == 0).all()  # the second sequence's padding gets no weight
assert torch.allclose(w.sum(-1), torch.ones(2, 1, 6))

# %% [markdown]
# ## Multi-head attention
#
# Q = XW_Q, K = XW_K, V = XW_V, split into H heads of width D = C/H, attention per head, the heads
# concatenated and projected: Concat(head_1 … head_H) W_O. `MultiHeadAttention` takes its parts
# ready made (a fused Q|K|V projection and the output projection); here it is compared with the
# same computation written with plain tensor operations.

# %%
C, H = 32, 4
D = C // H
qkv, out_proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
mha = MultiHeadAttention(H, out_proj, qkv=qkv)
x = torch.randn(2, 6, C)
y, weights = mha(x, is_causal=True, need_weights=True)

Q, K, Vv = qkv(x).split(C, dim=-1)  # (B, T, C) each
Q, K, Vv = (t.view(2, 6, H, D).transpose(1, 2) for t in (Q, K, Vv))  # (B, H, T, D)
scores = Q @ K.transpose(-2, -1) / math.sqrt(D)
scores = scores.masked_fill(~causal_mask(6), float("-inf"))
heads = scores.softmax(-1) @ Vv  # (B, H, T, D)
y_hand = out_proj(heads.transpose(1, 2).reshape(2, 6, C))
assert torch.allclose(y, y_hand, atol=1e-5) and torch.allclose(
    weights, scores.softmax(-1), atol=1e-6
)
print("multi-head output equals the formula; weights", tuple(weights.shape))

# %% [markdown]
# ## Why √d_k
#
# With q and k of independent unit-variance entries, q·k = Σ_i q_i k_i is a sum of d_k terms of
# variance 1: Var(q·k) = d_k. Unscaled, the scores grow with the width and the softmax saturates
# (one key takes all the weight, the gradient vanishes); divided by √d_k they have variance 1 at
# every width. We measure both on the scores attnlab computes (the weights returned, read back
# through V = I).

# %%
N = 2_000 if QUICK else 20_000
widths = [4, 16, 64, 256]
raw_var, scaled_var, top_weight = [], [], []
for d in widths:
    q, k = torch.randn(N, 1, d), torch.randn(N, 8, d)
    raw = (q @ k.transpose(-2, -1)).flatten()
    w = scaled_dot_product_attention(q, k, torch.eye(8).expand(N, 8, 8))  # V = I: out = weights
    centred = torch.log(w) - torch.log(w).mean(-1, keepdim=True)  # scores minus their row mean
    raw_var.append(raw.var().item())
    scaled_var.append(centred.var().item() * 8 / 7)  # a row mean of 8 removes 1/8 of the variance
    _, w_raw = scaled_dot_product_attention(q, k, k, scale=1.0, return_weights=True)
    top_weight.append(w_raw.max(-1).values.mean().item())
    print(
        f"d_k={d:4d}  Var(q·k)={raw_var[-1]:7.1f}  Var(q·k/√d_k)={scaled_var[-1]:.3f}  "
        f"unscaled top weight={top_weight[-1]:.3f}"
    )
    assert abs(raw_var[-1] / d - 1) < 0.15  # Var(q·k) = d_k
    assert abs(scaled_var[-1] - 1) < 0.15  # ... and 1 after the scaling

# %% [markdown]
# The variance of the raw dot product follows the line d_k; the scaled scores stay at 1. Without
# the scale, at d_k = 256 the largest of 8 weights averages close to 1: the softmax has become an
# arg-max.

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
ax1.loglog(widths, raw_var, "o-", label="Var(q·k)")
ax1.loglog(widths, scaled_var, "s-", label="Var(q·k / √d_k)")
ax1.loglog(widths, widths, "k:", label="d_k")
ax1.set(xlabel="d_k", ylabel="variance of the scores", title="the scores' variance")
ax1.legend()
ax2.semilogx(widths, top_weight, "o-")
ax2.set(xlabel="d_k", ylabel="mean largest weight (of 8)", title="unscaled: the softmax saturates")
plt.tight_layout()
plt.show()

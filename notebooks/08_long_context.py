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
# # 8. Long context: tiled, sparse and linear attention, and their memory
#
# The score matrix QKᵀ has N × N entries: at N = 16,384 one head's scores alone are a gigabyte.
# Three ways around it: compute the exact result tile by tile without ever holding the matrix
# (flash-style), compute only the tiles a sparse pattern allows (Longformer, BigBird), or change
# the formula so that no N × N product appears (linear attention).

# %%
import os

import matplotlib.pyplot as plt
import torch

from attnlab.attention import (
    count_tiles,
    longformer_mask,
    scaled_dot_product_attention,
)
from attnlab.attention.efficient import elu_feature_map
from attnlab.experiments.attention_bench import measure_case

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
torch.manual_seed(0)

# %% [markdown]
# ## Tiled attention: exact, in O(N) memory
#
# For each block of queries, the keys are visited block by block with a running maximum m, a
# running denominator ℓ and a running weighted sum; a new block rescales what came before by
# exp(m_old − m_new). The result is the softmax exactly, and only one block_q × block_k tile of
# scores exists at a time. Causal attention skips the tiles above the diagonal: with N/b blocks
# per side, (N/b)(N/b + 1)/2 tiles are computed.

# %%
B, H, N, D, b = 1, 4, 512, 32, 64
q, k, v = (torch.randn(B, H, N, D) for _ in range(3))
reference = scaled_dot_product_attention(q, k, v, is_causal=True, backend="math")
with count_tiles() as tiles:
    tiled = scaled_dot_product_attention(
        q, k, v, is_causal=True, backend="tiled", block_q=b, block_k=b
    )
nb = N // b
print(
    f"max |tiled − math| = {(tiled - reference).abs().max():.1e}; "
    f"{len(tiles.forward)} tiles computed, (N/b)(N/b+1)/2 = {nb * (nb + 1) // 2}"
)
assert torch.allclose(tiled, reference, atol=1e-5)
assert len(set(tiles.forward)) == nb * (nb + 1) // 2

# %% [markdown]
# ## Sparse attention: only the live tiles
#
# Longformer lets query i read keys with |i − j| < w plus a few global tokens that read and are
# read by everything. `block_sparse` applies the pattern and computes only the tiles that hold an
# allowed pair; the result equals the math path with the pattern's mask.

# %%
w = 64
mask = longformer_mask(N, window=w, global_tokens=[0])
with count_tiles() as sparse_tiles:
    sparse = scaled_dot_product_attention(
        q,
        k,
        v,
        backend="block_sparse",
        pattern="longformer",
        window=w,
        global_tokens=[0],
        block_size=b,
    )
masked = scaled_dot_product_attention(q, k, v, mask=mask, backend="math")
assert torch.allclose(sparse, masked, atol=1e-5)
live = {(i // b, j // b) for i, j in mask.nonzero().tolist()}
print(
    f"{len(set(sparse_tiles.forward))} of {nb * nb} tiles computed; "
    f"{len(live)} tiles hold an allowed pair"
)
assert set(sparse_tiles.forward) == live

# %% [markdown]
# ## Linear attention: no N × N product
#
# Replace exp(q·k) by φ(q)·φ(k) with a positive feature map φ (here elu(x) + 1). Then
# out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j): the sums over keys are computed once,
# D × D and D numbers, whatever N is. It is a different model, not an approximation of softmax.

# %%
linear = scaled_dot_product_attention(q, k, v, backend="linear", feature_map="elu")
fq, fk = elu_feature_map(q), elu_feature_map(k)
kv = fk.transpose(-2, -1) @ v  # (B, H, D, D): Σ_j φ(k_j) v_jᵀ
z = fk.sum(-2)  # (B, H, D): Σ_j φ(k_j)
by_hand = (fq @ kv) / (fq @ z[..., None])
assert torch.allclose(linear, by_hand, atol=1e-4)
print("linear attention equals φ(q)(φ(k)ᵀV) / φ(q)Σφ(k)")

# %% [markdown]
# ## Memory, measured
#
# The peak memory of one causal forward pass (B = 1, H = 4, D = 64, no autograd) against N,
# measured as the process's peak resident memory above where it started. The math path holds a
# few N × N float32 tensors per head (scores, masked scores, weights: about 3·H·N²·4 bytes); the
# others grow linearly. Small readings are at the allocator's resolution (memory an earlier case
# freed is reused without the process growing): read the large-N points.

# %%
ns = [256, 512] if QUICK else [512, 1024, 2048, 4096]
backends = {
    "math": {},
    "tiled": {},
    "block_sparse": {"pattern": "longformer", "window": 128, "global_tokens": [0]},
    "linear": {"feature_map": "elu"},
}
peak = {name: [] for name in backends}
for n in ns:
    for name, options in backends.items():
        spec = dict(
            n=n,
            backend=name,
            options=options,
            mode="fwd",
            batch=1,
            heads=4,
            head_dim=64,
            causal=True,
            device="cpu",
            dtype="float32",
            threads=None,
            min_time=0.0,
            max_reps=1,
        )
        peak[name].append(measure_case(spec)["peak_bytes"] / 2**20)
    print(f"N={n:5d}: " + ", ".join(f"{name} {peak[name][-1]:7.1f} MiB" for name in backends))
formula = [3 * 4 * n * n * 4 / 2**20 for n in ns]
if not QUICK:  # at the largest N the quadratic term dominates what math holds
    assert 0.5 < peak["math"][-1] / formula[-1] < 2.0
    assert peak["tiled"][-1] < peak["math"][-1] / 4

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
for name in backends:
    ax.loglog(ns, [max(p, 0.1) for p in peak[name]], "o-", label=name)
ax.loglog(ns, formula, "k:", label="3·H·N²·4 bytes")
ax.set(xlabel="sequence length N", ylabel="peak memory (MiB)", title="one causal forward pass")
ax.legend()
plt.show()

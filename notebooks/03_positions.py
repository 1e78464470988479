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
# # 3. Positions
#
# Self-attention by itself has no notion of order: permute the tokens and the outputs are
# permuted the same way. Positions break that symmetry: the sinusoidal table of the paper, RoPE
# (whose scores depend only on the offset between two tokens), ALiBi (a penalty growing with the
# distance), and what each does on sequences longer than any seen in training.

# %%
import math
import os

import matplotlib.pyplot as plt
import torch

import attnlab
from attnlab.config import LMTaskConfig
from attnlab.experiments.extrapolation import loss_by_position
from attnlab.layers import RotaryEmbedding, alibi_bias, alibi_slopes, sinusoidal_table
from attnlab.models.builders import multi_head_attention
from attnlab.tasks.lm import LMTask

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
torch.manual_seed(0)
torch.set_num_threads(
    1
)  # models this small gain nothing from a second thread; a busy machine loses

# %% [markdown]
# ## Permutation equivariance
#
# For any permutation P of the tokens, Attention(PX) = P·Attention(X) when nothing tells the
# layer where a token sits. RoPE rotates queries and keys by their positions, and the symmetry is
# gone.

# %%
x = torch.randn(1, 6, 32)
perm = torch.randperm(6)
for position in ("none", "rope"):
    mha = multi_head_attention(32, 4, position=position).eval()
    with torch.no_grad():
        y, _ = mha(x)
        y_perm, _ = mha(x[:, perm])
    gap = (y_perm - y[:, perm]).abs().max().item()
    print(f"position={position:5s}  max |Attn(PX) − P·Attn(X)| = {gap:.2e}")
    if position == "none":
        assert gap < 1e-5
    else:
        assert gap > 1e-3

# %% [markdown]
# ## Sinusoidal positions
#
# PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)). Each pair of channels
# is a point on a circle turning at its own frequency, so moving k positions on is the same
# rotation for every p: PE(p + k) is a fixed linear map of PE(p).

# %%
d, n = 16, 64
table = sinusoidal_table(n, d)
by_formula = torch.tensor(
    [
        [
            math.sin(p / 10000 ** (2 * (c // 2) / d))
            if c % 2 == 0
            else math.cos(p / 10000 ** (2 * (c // 2) / d))
            for c in range(d)
        ]
        for p in range(n)
    ]
)
assert torch.allclose(table, by_formula, atol=1e-6)

k = 5
shift, *_ = torch.linalg.lstsq(table[:-k].double(), table[k:].double())  # PE(p+k) ≈ PE(p) @ M
assert torch.allclose(table[:-k].double() @ shift, table[k:].double(), atol=1e-6)
print("PE(p + 5) = PE(p) · M for all", n - k, "positions, one matrix M")

# %% [markdown]
# ## RoPE: the score depends on the offset only
#
# RoPE rotates each pair of q's (and k's) channels by the angle p·θ_i. A rotation by mθ followed
# by the transpose of one by nθ is a rotation by (n − m)θ, so (R_m q)ᵀ(R_n k) depends only on
# n − m.

# %%
rope = RotaryEmbedding(16)
q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)


def rope_score(m, n):
    qr, kr = rope(q, k, torch.tensor([m]), torch.tensor([n]))
    return (qr * kr).sum().item()


print([round(rope_score(m, m + 3), 5) for m in (0, 7, 100, 1000)])
assert all(abs(rope_score(m, m + 3) - rope_score(0, 3)) < 1e-3 for m in (7, 100, 1000))

# %% [markdown]
# ## ALiBi
#
# No embedding at all: head h adds −m_h·|i − j| to the score of query i on key j, with slopes
# m_h = 2^(−8h/H) (for 8 heads 1/2, 1/4, …, 1/256): some heads look near, some far.

# %%
slopes = alibi_slopes(8)
assert torch.allclose(slopes, torch.tensor([2.0 ** (-(h + 1)) for h in range(8)]))
pos = torch.arange(6)
bias = alibi_bias(slopes, pos, pos)  # (H, Tq, Tk)
assert torch.allclose(bias[0], -0.5 * (pos[:, None] - pos[None]).abs().float())
print(bias[0])

# %% [markdown]
# ## Extrapolation: reading longer sequences than in training
#
# Three small language models differ only in their positions (a learned table, RoPE, ALiBi);
# each is trained on 32-character windows of Python's documentation and then reads windows of
# 128. The learned table has no row past 32, so that model cannot even be asked (the relative
# schemes are built with room for 128 positions, which changes none of their weights); the loss
# at each position shows how the others fare beyond what they saw.

# %%
T, STEPS = 32, (5 if QUICK else 200)
task = LMTask.build(LMTaskConfig(seq_len=T, max_chars=200_000 if QUICK else None))
long_task = LMTask(task.ids, task.tokenizer, task.config.replace(seq_len=4 * T))
idx, tgt = next(long_task.eval_batches(16 if QUICK else 64, 1))

curves = {}
for position in ("learned", "rope", "alibi"):
    torch.manual_seed(0)
    cfg = attnlab.ModelConfig.preset(
        "tiny",
        vocab_size=task.vocab_size,
        max_seq_len=T if position == "learned" else 4 * T,
        position=position,
    )
    model = attnlab.DecoderLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(STEPS):
        loss, _ = task.loss(model, task.get_batch("train", step, 32))
        opt.zero_grad()
        loss.backward()
        opt.step()
    try:
        curves[position] = loss_by_position(model, idx, tgt, 4 * T)
    except ValueError as err:  # the learned table refuses
        print(f"{position}: {err}")
    else:
        print(
            f"{position}: loss at positions <32 {curves[position][:T].mean():.3f}, "
            f">=32 {curves[position][T:].mean():.3f}"
        )
assert "learned" not in curves and set(curves) == {"rope", "alibi"}

# %%
fig, ax = plt.subplots(figsize=(8, 4))
for position, curve in curves.items():
    ax.plot(curve, label=position)
ax.axvline(T, color="k", linestyle=":", label="training length")
ax.set(xlabel="position in a 128-character window", ylabel="loss (nats)", title="extrapolation")
ax.legend()
plt.show()

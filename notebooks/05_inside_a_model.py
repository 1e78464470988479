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
# # 5. Inside a model
#
# Every activation of an attnlab model passes through a named hook point (the names are
# TransformerLens's): read them with `run_with_cache`, edit them with `run_with_hooks`, knock out
# heads with `ablate_heads`, and move activations from one input's run into another's with
# activation patching. Per-head diagnostics summarise each head, and the explorer shows all of it
# under a cell.

# %%
import os
import tempfile

import matplotlib.pyplot as plt
import torch

import attnlab
from attnlab.config import LMTaskConfig
from attnlab.explore import show
from attnlab.inspect import (
    ablate_heads,
    diagnose,
    patch,
    patch_positions,
    pattern_scores,
    repeated_tokens,
    run_with_cache,
    run_with_hooks,
)
from attnlab.tasks.lm import LMTask
from attnlab.train import TrainConfig, train

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
torch.manual_seed(0)
torch.set_num_threads(
    1
)  # models this small gain nothing from a second thread; a busy machine loses

# %% [markdown]
# A small GPT, trained briefly on Python's documentation (notebook 4 explains the training).

# %%
task = LMTask.build(LMTaskConfig(seq_len=64, max_chars=200_000 if QUICK else None))
model = attnlab.DecoderLM(
    attnlab.ModelConfig.preset("tiny", vocab_size=task.vocab_size, max_seq_len=64)
)
budget = dict(steps=5) if QUICK else dict(max_time=30)
train(
    model,
    task,
    TrainConfig(**budget, batch_size=32, lr=3e-3, warmup_steps=2, eval_batches=0, progress=False),
    tempfile.mkdtemp(prefix="attnlab-inside-"),
)
model.eval()
tok = task.tokenizer
text = "The return value of the function is the value returned"
idx = torch.tensor([tok.encode(text)])

# %% [markdown]
# ## Attention maps from the cache
#
# `blocks.{i}.attn.hook_attn_scores` holds QKᵀ/√D (−∞ above the diagonal) and
# `blocks.{i}.attn.hook_pattern` the weights, so pattern = softmax(scores) row by row.

# %%
logits, cache = run_with_cache(model, idx)
scores = cache["blocks.1.attn.hook_attn_scores"]  # (B, H, T, T)
pattern = cache["blocks.1.attn.hook_pattern"]
assert torch.allclose(pattern, scores.softmax(-1), atol=1e-6)
assert (pattern[0].triu(1) == 0).all()
print(len(cache), "activations cached; pattern", tuple(pattern.shape))

# %% [markdown]
# ## Head diagnostics
#
# Each head's scores are simple statistics of its pattern: "previous token" is the mean over
# t ≥ 1 of p[t, t − 1], "diagonal" the mean of p[t, t], "uniformity" the entropy divided by the
# log of the number of keys a query sees. `diagnose` adds the induction score on repeated random
# tokens and the loss increase when the head is ablated.

# %%
by_hand = torch.stack([pattern[0, :, t, t - 1] for t in range(1, idx.shape[1])], -1).mean(-1)
assert torch.allclose(pattern_scores(pattern, causal=True)["previous_token"], by_hand, atol=1e-6)

heads = diagnose(
    model,
    idx,
    repeated=repeated_tokens(task.vocab_size, 20),
    loss_fn=lambda out: torch.nn.functional.cross_entropy(out[0, :-1], idx[0, 1:]),
)
print(f"{'head':22s} {'prev':>6s} {'diag':>6s} {'unif':>6s} {'induct':>6s} {'Δloss':>7s}  flags")
for h in heads:
    print(
        f"{h.name:22s} {h.previous_token:6.3f} {h.diagonal:6.3f} {h.uniformity:6.3f} "
        f"{h.induction:6.3f} {h.loss_delta:7.3f}  "
        f"{','.join(h.flags)}"
    )

# %% [markdown]
# ## Ablation
#
# Zero-ablating a head sets its weighted values z (before W_O) to 0. The same edit by hand, with
# a hook on `blocks.0.attn.hook_z`, gives the same logits.

# %%
with torch.no_grad(), ablate_heads(model, {"blocks.0.attn": [1]}):
    ablated = model(idx)


def zero_head_1(z, name):  # z (B, T, H, D)
    z = z.clone()
    z[:, :, 1] = 0
    return z


by_hook = run_with_hooks(model, idx, hooks=[("blocks.0.attn.hook_z", zero_head_1)])
assert torch.allclose(ablated, by_hook, atol=1e-6)
print("largest change of a logit:", (ablated - logits).abs().max().item())

# %% [markdown]
# ## Activation patching
#
# Two inputs that differ in their last character, "... th" and "... tx": which activations carry
# the difference to the prediction of "e"? Patching the clean run's residual stream at one layer
# and position into the corrupted run, and measuring how much of the clean log-probability comes
# back, answers it position by position. A model trained this briefly reads mostly the character
# before the one it predicts (a bigram model, so far): the effect sits in the last position's
# column, at every layer. Patching every position of the first block's input restores the clean
# output exactly.

# %%
clean_text, corrupt_text = "it returns th", "it returns tx"
clean = torch.tensor([tok.encode(clean_text)])
corrupt = torch.tensor([tok.encode(corrupt_text)])
target = tok.encode("e")[0]
with torch.no_grad():
    clean_out, corrupt_out = model(clean), model(corrupt)
assert torch.allclose(
    patch(model, clean, corrupt, ["blocks.0.hook_resid_pre"]), clean_out, atol=1e-6
)


def metric(out):  # log-probability of "e" as the next character
    return out[:, -1].log_softmax(-1)[:, target].mean()


effect = patch_positions(model, clean, corrupt, metric, hook="resid_pre")  # (L, T)
print(f"log p(e): clean {metric(clean_out):.3f}, corrupted {metric(corrupt_out):.3f}")

# %% [markdown]
# ## The explorer, inline
#
# `attnlab.explore.show` runs the model once and returns the explorer page (every layer and head,
# raw scores and weights, the head diagnostics), displayed under the cell in a sandboxed frame;
# nothing is fetched from the network. `.save("page.html")` writes the same page.

# %%
show(model, idx, tokens=list(text), height=700)

# %% [markdown]
# The second layer's heads on the sentence, and the patching sweep.

# %%
H = pattern.shape[1]
fig, axes = plt.subplots(1, H + 1, figsize=(4 * (H + 1), 4))
for h in range(H):
    axes[h].imshow(pattern[0, h], cmap="viridis")
    axes[h].set_title(f"blocks.1 head {h}")
im = axes[H].imshow(effect, cmap="RdBu", aspect="auto")
axes[H].set(
    title="patched log p(e)",
    xlabel="position",
    ylabel="layer (its input, resid_pre)",
    yticks=range(effect.shape[0]),
    xticks=range(len(clean_text)),
    xticklabels=list(clean_text),
)
fig.colorbar(im, ax=axes[H])
plt.tight_layout()
plt.show()

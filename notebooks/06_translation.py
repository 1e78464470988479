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
# # 6. Translation and its alignments
#
# The encoder–decoder Transformer of the paper, small: the encoder reads an English number in
# words, the decoder writes it in Italian, attending to the encoder's states through
# cross-attention. No one tells it which English word goes with which Italian one; the
# cross-attention weights show what it found.

# %%
import os
import tempfile

import matplotlib.pyplot as plt
import torch

from attnlab.config.translation import TranslationTaskConfig
from attnlab.data.translation import build_data
from attnlab.metrics.translation import evaluate_pairs, translate_texts
from attnlab.models.translation import build_translation_model
from attnlab.tasks.translation import TranslationTask
from attnlab.train import TrainConfig, cross_entropy, train

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
torch.manual_seed(0)
torch.set_num_threads(
    1
)  # models this small gain nothing from a second thread; a busy machine loses

# %% [markdown]
# ## Data
#
# Generated pairs: "three hundred and twelve" → "trecentododici". The held-out splits never share
# a source sentence with the training split.

# %%
data = build_data(
    TranslationTaskConfig(
        task="numbers", lang="it", high=99_999, n_examples=600 if QUICK else 20_000
    )
)
task = TranslationTask(data, eval_examples=0)
print({k: len(v) for k, v in data.splits.items()}, "pairs;", data.splits["train"][0])
longest = max(data.stats["max_src_len"], data.stats["max_tgt_len"])
model = build_translation_model(
    "transformer", len(data.src_vocab), len(data.tgt_vocab), preset="tiny", max_seq_len=2 * longest
)

# %% [markdown]
# ## The loss, with label smoothing
#
# The target distribution is (1 − ε)·onehot + ε/V, so per token the loss is
# (1 − ε)·(−log p_y) + ε·mean_v(−log p_v); padding counts for nothing. The task's loss is this
# formula on the teacher-forced logits (the decoder reads `<start> y` and predicts `y <end>`).

# %%
eps = 0.1
batch = task.get_batch("train", 0, 16)
loss, _ = task.loss(model, batch, TrainConfig(steps=1, label_smoothing=eps))
logp = model(batch.src, batch.src_mask, batch.tgt_in).log_softmax(-1)  # (B, T, V)
real = batch.tgt_out != 0
nll = -logp.gather(-1, batch.tgt_out[..., None])[..., 0]
by_hand = ((1 - eps) * nll + eps * -logp.mean(-1))[real].mean()
assert torch.allclose(loss, by_hand, atol=1e-5)
assert torch.allclose(
    by_hand,
    cross_entropy(logp, batch.tgt_out.masked_fill(~real, -100), label_smoothing=eps),
    atol=1e-5,
)
print(f"loss {loss.item():.4f} = formula {by_hand.item():.4f}")

# %% [markdown]
# ## Training

# %%
budget = dict(steps=5) if QUICK else dict(max_time=50)
result = train(
    model,
    task,
    TrainConfig(
        **budget,
        batch_size=64,
        lr=2e-3,
        warmup_steps=2 if QUICK else 50,
        label_smoothing=eps,
        eval_every=500,
        eval_batches=2,
        progress=False,
    ),
    tempfile.mkdtemp(prefix="attnlab-translate-"),
)
scores = evaluate_pairs(model, data.vocabs(), data.splits["test"][: 50 if QUICK else 500])
print(
    f"{result.steps} steps in {result.elapsed:.0f} s: held-out exact match "
    f"{scores['exact_match']:.1%}, chrF {scores['chrf']:.1f}"
)

# %% [markdown]
# ## Alignments
#
# `translate_texts(..., need_weights=True)` decodes greedily (one cached step per output token)
# and keeps each step's cross-attention: (layers, heads, output tokens, source tokens). Every row
# is a softmax over the source.

# %%
sentence = "seventy two thousand four hundred and thirteen"
(tr,) = translate_texts(model, data.vocabs(), [sentence], need_weights=True)
print(tr.source, "->", tr.text)
align = tr.alignment  # (L, H, T, S)
assert torch.allclose(align.sum(-1), torch.ones(align.shape[:-1]), atol=1e-5)

# %%
L, H = align.shape[:2]
fig, axes = plt.subplots(L, H, figsize=(3.2 * H, 3 * L), squeeze=False)
for layer in range(L):
    for h in range(H):
        ax = axes[layer][h]
        ax.imshow(align[layer, h], cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(tr.src_tokens)), tr.src_tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(len(tr.out_tokens)), tr.out_tokens, fontsize=7)
        ax.set_title(f"layer {layer} head {h}", fontsize=9)
plt.tight_layout()
plt.show()

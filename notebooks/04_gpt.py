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
# # 4. A GPT in a few minutes
#
# A character-level decoder-only Transformer trained on Python's own documentation with
# attnlab's trainer, then sampled; then the KV cache, which makes each new token cost one step
# instead of a pass over the whole prefix.

# %%
import math
import os
import tempfile
import time

import matplotlib.pyplot as plt
import torch

import attnlab
from attnlab.config import LMTaskConfig
from attnlab.tasks.lm import LMTask
from attnlab.train import TrainConfig, train

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
torch.manual_seed(0)
torch.set_num_threads(
    1
)  # models this small gain nothing from a second thread; a busy machine loses

# %% [markdown]
# ## Data and model
#
# `LMTask` prepares the corpus once (character-level here: every distinct character is a token)
# and hands the trainer windows of T characters with the next character as the target. The
# `tiny` preset is GPT-2's design (learned positions, pre-LayerNorm, GELU MLP) at 2 layers of 64.
#
# Before training, the model predicts almost uniformly, so its loss is close to the loss of
# knowing nothing, −log(1/V) = ln V nats per character (a little below it: with the output
# projection tied to the embedding, the untrained model's first guess leans to the character it
# has just read, which is often right, for spaces and doubled letters).

# %%
task = LMTask.build(LMTaskConfig(seq_len=64, max_chars=200_000 if QUICK else None))
V = task.vocab_size
cfg = attnlab.ModelConfig.preset("tiny", vocab_size=V, max_seq_len=64)
model = attnlab.DecoderLM(cfg)
print(f"vocabulary {V}, {sum(p.numel() for p in model.parameters()):,} parameters")

with torch.no_grad():
    loss0 = sum(task.loss(model, b)[0].item() for b in task.eval_batches(32, 4)) / 4
print(f"loss at initialisation {loss0:.3f}, ln V = {math.log(V):.3f}")
assert 0 <= math.log(V) - loss0 < 0.5

# %% [markdown]
# ## Training
#
# `attnlab.train.train` is the one loop of every family: AdamW, warm-up then cosine decay,
# clipping, validation and checkpoints into a run directory. `max_time` is a wall-clock budget
# the schedule fits itself to.

# %%
run_dir = tempfile.mkdtemp(prefix="attnlab-gpt-")
budget = dict(steps=5) if QUICK else dict(max_time=45)
result = train(
    model,
    task,
    TrainConfig(
        **budget,
        batch_size=32,
        lr=3e-3,
        warmup_steps=2 if QUICK else 30,
        eval_every=100,
        eval_batches=4,
        log_every=5,
        progress=False,
    ),
    run_dir,
)
print(f"{result.steps} steps in {result.elapsed:.0f} s: validation loss {result.val_loss:.3f}")

# %% [markdown]
# ## Sampling

# %%
prompt = torch.tensor([task.tokenizer.encode("The ")])
out = attnlab.generate(
    model, prompt, 200, temperature=0.8, top_k=40, generator=torch.Generator().manual_seed(0)
)
print(task.tokenizer.decode(out[0].tolist()))

# %% [markdown]
# ## The KV cache
#
# A token's keys and values never change once computed, so each layer keeps them: a new token
# then needs one row of queries against the cached keys. After t tokens the cache holds
# 2 · layers · t · heads · head width numbers, and decoding with it gives exactly the tokens of
# recomputing the whole prefix at every step.

# %%
model.eval()
n = 40 if QUICK else 150
with torch.no_grad():
    start = time.perf_counter()
    cached = attnlab.generate(model, prompt, n, temperature=0.0)
    t_cached = time.perf_counter() - start
    start = time.perf_counter()
    recomputed = attnlab.generate(model, prompt, n, temperature=0.0, use_cache=False)
    t_recomputed = time.perf_counter() - start
assert torch.equal(cached, recomputed)
print(
    f"{n} greedy tokens: {1000 * t_cached / n:.1f} ms/token cached, "
    f"{1000 * t_recomputed / n:.1f} ms/token recomputing"
)

with torch.no_grad():
    state = model.start_decoding(1, 64)
    logits, state = model.decode_step(cached[:, :20], state)  # the prompt part at once
    full = model(cached[:, :21])[:, -1]  # the whole prefix again
    step_logits, state = model.decode_step(cached[:, 20:21], state)  # one new token
assert torch.allclose(step_logits, full, atol=1e-4)
stored = sum(c.get()[0].numel() + c.get()[1].numel() for c in state.caches)
formula = 2 * cfg.n_layers * 21 * cfg.n_heads * (cfg.d_model // cfg.n_heads)
print(f"cache after 21 tokens: {stored} numbers; 2·L·t·H·D = {formula}")
assert stored == formula

# %% [markdown]
# The training curve, and what the cache buys: each cached step attends over the prefix once,
# a recomputed step runs the whole network over it.

# %%
train_rows = [r for r in result.history if "loss" in r]
val_rows = [r for r in result.history if "val_loss" in r]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
ax1.plot([r["step"] for r in train_rows], [r["loss"] for r in train_rows], label="training")
ax1.plot([r["step"] for r in val_rows], [r["val_loss"] for r in val_rows], "o-", label="validation")
ax1.axhline(math.log(V), color="k", linestyle=":", label="ln V")
ax1.set(xlabel="step", ylabel="loss (nats/char)", title="training the tiny GPT")
ax1.legend()
ax2.bar(["KV cache", "recompute"], [1000 * t_cached / n, 1000 * t_recomputed / n])
ax2.set(ylabel="ms per new token", title=f"{n} greedy tokens")
plt.tight_layout()
plt.show()

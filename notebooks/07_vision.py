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
# # 7. ViT and the CNN on small data
#
# A Vision Transformer cuts an image into patches and treats each as a token; after that it is
# the same encoder as for text, with no causal mask. A CNN builds in what images have (nearby
# pixels belong together, a shifted digit is the same digit), a ViT must learn it: with few
# training images the CNN wins.

# %%
import os
import tempfile

import matplotlib.pyplot as plt
import torch

from attnlab.config.vision import ImageTaskConfig
from attnlab.layers import PatchEmbedding
from attnlab.models.vision.factory import build_image_classifier
from attnlab.tasks.image import ImageClassificationTask, load_task_data
from attnlab.train import TrainConfig, train

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
torch.manual_seed(0)
torch.set_num_threads(
    1
)  # models this small gain nothing from a second thread; a busy machine loses

# %% [markdown]
# ## Patches become tokens
#
# An H × W image in P × P patches gives N = HW/P² tokens: a 224-pixel image in 16-pixel patches
# is 14 × 14 = 196 tokens, each a linear map of its 16·16·3 = 768 pixel values.

# %%
embed = PatchEmbedding(3, 768, 16)
images = torch.randn(1, 3, 224, 224)
tokens = embed(images)
assert tokens.shape == (1, (224 // 16) ** 2, 768)
patch = images[0, :, 16:32, 16:32].reshape(-1)  # row 1, column 1: token 14 + 1
by_hand = embed.proj.weight.reshape(768, -1) @ patch + embed.proj.bias
assert torch.allclose(tokens[0, 15], by_hand, atol=1e-4)
print("tokens", tuple(tokens.shape), "; token 15 = W · (its 768 pixels) + b")

# %% [markdown]
# ## The same steps, fewer or more images
#
# scikit-learn's 8 × 8 digits (shipped with the package): a small ViT (2 × 2 patches) and a small
# residual CNN of similar size, trained with the same optimizer, steps and batch on a share of the
# training split, scored on the whole test split.

# %%
data = load_task_data(ImageTaskConfig(data="digits"), seed=0)
fractions = [0.05, 0.2] if QUICK else [0.05, 0.1, 0.25, 1.0]
STEPS = 3 if QUICK else 150
accuracy = {"vit": [], "cnn": []}
n_train = []
for fraction in fractions:
    task = ImageClassificationTask(data, seed=0, train_fraction=fraction)
    n_train.append(len(task.train_y))
    for kind in accuracy:
        torch.manual_seed(0)
        model = build_image_classifier(kind, data.image_shape, data.classes)
        train(
            model,
            task,
            TrainConfig(
                steps=STEPS,
                batch_size=64,
                lr=1e-3,
                warmup_steps=min(30, STEPS // 3),
                eval_batches=0,
                progress=False,
            ),
            tempfile.mkdtemp(prefix=f"attnlab-{kind}-"),
        )
        accuracy[kind].append(task.test_accuracy(model)[0])
    print(
        f"{n_train[-1]:5d} training images: ViT {accuracy['vit'][-1]:.3f}, "
        f"CNN {accuracy['cnn'][-1]:.3f}"
    )
if not QUICK:  # seeded: the smallest share separates them (the CNN's built-in locality)
    assert accuracy["cnn"][0] > accuracy["vit"][0]

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for kind, label in (("vit", "ViT"), ("cnn", "CNN")):
    ax.semilogx(n_train, accuracy[kind], "o-", label=label)
ax.set(xlabel="training images", ylabel="test accuracy", title=f"digits, {STEPS} steps each")
ax.legend()
plt.show()

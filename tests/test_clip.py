"""The CLIP-style dual encoder: its loss written out, its logits from its embeddings, the text
tower's causal EOS pooling, zero-shot accuracy far above chance after a seeded small run, the
exact chance of recall@k, and bad input."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from attnlab.config.clip import ClipConfig, TextTowerConfig
from attnlab.config.vision import ViTConfig
from attnlab.data.scenes import SceneConfig, build_vocab
from attnlab.errors import UserError
from attnlab.models.multimodal.clip import DualEncoder
from attnlab.models.multimodal.text_tower import TextTower
from attnlab.tasks.clip import (
    ClipTask,
    check_prompts,
    recall_chance,
    retrieval_recall,
    zero_shot_accuracy,
)
from attnlab.tasks.losses import contrastive_loss

V = len(build_vocab())


def tiny(text: str = "transformer", d: int = 16) -> DualEncoder:
    torch.manual_seed(0)
    blk = dict(d_model=d, n_layers=1, n_heads=2, ffn_hidden=2 * d)
    config = ClipConfig.preset(
        "tiny",
        vision=dict(blk, image_size=16, patch_size=4),
        text=dict(blk, arch=text, vocab_size=V),
        projection_dim=d,
    )
    return DualEncoder(config)


def texts(n: int = 4, length: int = 7) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, V, (n, length), generator=gen)
    ids[:, 0] = 2  # <start>
    for i in range(n):
        ids[i, 3 + i % 3] = 3  # <end>
        ids[i, 4 + i % 3 :] = 0  # padding after it
    return ids


def test_config_nests_a_vision_and_a_text_config_and_round_trips():
    c = ClipConfig.preset("tiny", text={"arch": "bow"}, vision={"n_layers": 3})
    assert isinstance(c.vision, ViTConfig) and isinstance(c.text, TextTowerConfig)
    assert c.text.arch == "bow" and c.vision.n_layers == 3
    assert c.text.d_model == ClipConfig.preset("tiny").text.d_model  # merged, not replaced
    assert c.vision.embed_norm and not c.vision.patch_bias and c.text.activation == "quick_gelu"
    assert ClipConfig.from_dict(c.to_dict()) == c


def test_contrastive_loss_equals_its_formula_written_out():
    gen = torch.Generator().manual_seed(0)
    s = torch.randn(5, 5, generator=gen) * 3
    b, m = s.shape[0], s.tolist()
    want = 0.0
    for i in range(b):
        row = m[i][i] - math.log(sum(math.exp(m[i][j]) for j in range(b)))
        col = m[i][i] - math.log(sum(math.exp(m[j][i]) for j in range(b)))
        want -= (row + col) / (2 * b)
    assert float(contrastive_loss(s)) == pytest.approx(want, abs=1e-5)
    with pytest.raises(ValueError, match="square"):
        contrastive_loss(torch.zeros(2, 3))


def test_logits_are_the_scaled_cosines_of_the_unnormalised_embeddings():
    model = tiny().eval()
    images, ids = torch.rand(3, 3, 16, 16), texts()
    with torch.no_grad():
        u, v = model.encode_image(images), model.encode_text(ids)
        logits = model(images, ids)
    assert u.shape == (3, 16) and v.shape == (4, 16)
    assert not torch.allclose(u.norm(dim=-1), torch.ones(3))  # unnormalised, as HF's features
    cos = torch.tensor([[float(a @ b / (a.norm() * b.norm())) for b in v] for a in u])
    torch.testing.assert_close(logits, math.exp(model.config.logit_scale_init) * cos)


def test_text_feature_is_read_at_end_of_text_and_sees_only_what_precedes_it():
    tower = TextTower(tiny().config.text).eval()
    ids = texts()
    with torch.no_grad():
        base = tower(ids)
        after = ids.clone()
        after[0, 5:] = 7  # tokens after <end> (position 3): the causal mask keeps them out
        before = ids.clone()
        before[0, 1] = 9 if ids[0, 1] != 9 else 10
        torch.testing.assert_close(tower(after), base)
        assert not torch.allclose(tower(before)[0], base[0])
        no_end = ids.masked_fill(ids == 3, 5)
    with pytest.raises(UserError, match="end-of-text"):
        tower(no_end)


def test_bag_of_words_tower_ignores_order_and_padding():
    tower = TextTower(tiny("bow").config.text).eval()
    ids = torch.tensor([[2, 10, 11, 12, 3, 0, 0]])
    shuffled = torch.tensor([[12, 3, 10, 2, 11]])
    with torch.no_grad():
        torch.testing.assert_close(tower(ids), tower(shuffled))


def test_bad_input_is_named():
    model = tiny()
    images = torch.rand(2, 3, 16, 16)
    with pytest.raises(UserError, match="token ids.*image batch"):
        model.encode_text(images)
    with pytest.raises(UserError, match="reads images"):
        model.encode_image(texts())
    with pytest.raises(UserError, match="exceed"):
        model.encode_text(torch.full((1, 99), 3))
    vocab = build_vocab()
    with pytest.raises(UserError, match="needs prompts"):
        check_prompts(vocab, [])
    with pytest.raises(UserError, match="'the left one' name no class"):
        check_prompts(vocab, ["a red circle", "the left one"])
    with pytest.raises(UserError, match="outside the model's vocabulary: crimson"):
        check_prompts(vocab, ["a crimson circle"])


def test_recall_chance_is_the_exact_rate_of_a_random_ranking():
    n, k, matches = 5, 2, 2
    hits = [any(p[j] < matches for j in range(k)) for p in itertools.permutations(range(n))]
    assert recall_chance([matches], n, k) == pytest.approx(sum(hits) / len(hits))
    assert recall_chance([1, 1], 10, 1) == pytest.approx(0.1)


def test_zero_shot_far_above_chance_after_a_seeded_small_run():
    """About 2 s: a bag-of-words dual encoder on 16-pixel scenes, 200 steps of 32 pairs."""
    task = ClipTask(
        scene=SceneConfig(image_size=16, min_objects=1, max_objects=2),
        n_train=400,
        n_val=60,
        n_unseen=20,
        eval_scenes=100,
        caption="listing",
    )
    model = tiny("bow", d=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    for step in range(200):
        b = task.get_batch("train", step, 32)
        loss = contrastive_loss(model(b["images"], b["tokens"]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    zs = zero_shot_accuracy(model, task.zero_shot_set("val"), task.prompts(), task.vocab)
    assert zs["chance"] == pytest.approx(1 / 18) and zs["n"] == 100
    assert zs["accuracy"] > 5 * zs["chance"]  # measured 0.50 (chance 0.056)
    r = retrieval_recall(model, task.sets("val"), task.vocab, ks=(1, 5))
    assert r["i2t@5"] > 2 * r["chance@5"] and r["t2i@5"] > 2 * r["chance@5"]

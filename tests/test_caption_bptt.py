"""Truncated backpropagation through time for the LSTM captioner: the same logits as the full
pass, but a word's loss no longer reaches the image once it lies past the first window."""

from __future__ import annotations

import pytest
import torch

from attnlab.config.multimodal import CaptionConfig
from attnlab.errors import UserError
from attnlab.models.multimodal.captioner import build_captioner
from attnlab.tasks.caption import CaptionTask, accuracy_by_position, truncated_logits


def lstm():
    torch.manual_seed(0)
    return build_captioner(CaptionConfig.preset("tiny", arch="lstm", vocab_size=30, image_size=16))


def test_truncation_keeps_the_logits_and_cuts_the_gradient_to_the_image():
    model = lstm()
    images, tokens = torch.rand(2, 3, 16, 16), torch.randint(4, 30, (2, 7))
    full = model(images, tokens)
    cut = truncated_logits(model, images, tokens, 3)
    torch.testing.assert_close(cut, full)
    w = model.init_h.weight  # the image feature's way into the LSTM
    late_full = torch.autograd.grad(full[:, 5].sum(), w)[0]
    late_cut = torch.autograd.grad(cut[:, 5].sum(), w, retain_graph=True)[0]
    early_cut = torch.autograd.grad(cut[:, 1].sum(), w)[0]
    assert late_full.abs().sum() > 0 and early_cut.abs().sum() > 0
    assert torch.all(late_cut == 0)  # word 6 lies in the second window: no path to h0


def test_truncation_is_refused_for_a_transformer_captioner():
    torch.manual_seed(0)
    config = CaptionConfig.preset("tiny", arch="transformer", vocab_size=30, image_size=16)
    with pytest.raises(UserError, match="LSTM captioner"):
        truncated_logits(build_captioner(config), torch.rand(1, 3, 16, 16), torch.ones(1, 3), 2)


def test_accuracy_by_position_counts_teacher_forced_hits():
    task = CaptionTask(n_train=10, n_val=8, n_unseen=2, bptt_window=2)
    model = build_captioner(CaptionConfig.preset("tiny", arch="lstm", vocab_size=len(task.vocab)))
    accs = accuracy_by_position(model, task, 8)
    assert accs and all(0.0 <= a <= 1.0 for a in accs)
    batch = task.get_batch("train", 0, 4)
    loss, _ = task.loss(model, batch, None)
    assert torch.isfinite(loss)

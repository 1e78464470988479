"""VQA models: fusion variants, the blind model ignores the image, padding does not leak,
cross-attention rows are distributions, and a short run beats the answer-frequency baseline."""

import pytest
import torch

from attnlab.data.scenes import VQATask, build_vocab
from attnlab.errors import UserError
from attnlab.models.vqa import LSTMVQA, TransformerVQA, VQAConfig, build_vqa

VOCAB = build_vocab()


def tiny(arch="lstm", fusion="concat", **kw):
    cfg = VQAConfig.preset(
        "tiny", arch=arch, fusion=fusion, vocab_size=len(VOCAB), n_answers=len(VOCAB.answers), **kw
    )
    return build_vqa(cfg).eval()


def questions(texts):
    ids = [VOCAB.encode(t)[0] for t in texts]
    q = torch.zeros(len(ids), max(map(len, ids)) + 3, dtype=torch.long)  # extra padding
    for i, s in enumerate(ids):
        q[i, : len(s)] = torch.tensor(s)
    return q, torch.tensor([len(s) for s in ids])


TEXTS = ["what colour is the circle ?", "is the red square left of the blue circle ?"]


@pytest.mark.parametrize(
    "arch,fusion",
    [("lstm", "concat"), ("lstm", "product"), ("lstm", "none"), ("transformer", "concat")],
)
def test_every_parameter_learns_and_logits_cover_the_answers(arch, fusion):
    m = tiny(arch, fusion).train()
    q, n = questions(TEXTS)
    out = m(torch.rand(2, 3, 32, 32), q, n)
    assert out.shape == (2, len(VOCAB.answers))
    out.logsumexp(-1).sum().backward()
    missing = [
        k
        for k, p in m.named_parameters()
        if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)
    ]
    assert not missing


def test_blind_model_ignores_the_image_and_others_do_not():
    q, n = questions(TEXTS)
    a, b = torch.zeros(2, 3, 32, 32), torch.rand(2, 3, 32, 32)
    blind = tiny(fusion="none")
    torch.testing.assert_close(blind(a, q, n), blind(b, q, n))
    assert not any("encoder" in k for k in blind.state_dict())
    for m in (tiny(fusion="concat"), tiny(fusion="product"), tiny("transformer")):
        assert not torch.allclose(m(a, q, n), m(b, q, n))


@pytest.mark.parametrize("arch", ["lstm", "transformer"])
def test_padding_does_not_change_the_answer(arch):
    m = tiny(arch)
    q, n = questions(TEXTS)
    x = torch.rand(2, 3, 32, 32)
    longer = torch.cat((q, torch.zeros(2, 4, dtype=torch.long)), dim=1)
    garbage = q.clone()
    for i, k in enumerate(n.tolist()):
        garbage[i, k:] = 7  # whatever sits after the true end is ignored
    torch.testing.assert_close(m(x, longer, n), m(x, q, n), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m(x, garbage, n), m(x, q, n), atol=1e-5, rtol=1e-5)
    one = m(x[:1], q[:1, : int(n[0])], n[:1])  # alone, unpadded
    torch.testing.assert_close(one, m(x, q, n)[:1], atol=1e-5, rtol=1e-5)


def test_transformer_cross_attention_rows_sum_to_one():
    m = tiny("transformer", n_layers=2)
    q, n = questions(TEXTS)
    m(torch.rand(2, 3, 32, 32), q, n, need_weights=True)
    assert len(m.cross_weights) == 2
    for w in m.cross_weights:
        assert w.shape[:3] == (2, m.config.n_heads, q.shape[1]) and w.min() >= 0
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))


def test_config_and_input_errors():
    with pytest.raises(ValueError, match="fusion"):
        VQAConfig(fusion="sum")
    with pytest.raises(ValueError, match="blind"):
        VQAConfig(arch="transformer", fusion="none")
    c = VQAConfig.preset("small", fusion="product")
    assert VQAConfig.from_dict(c.to_dict()) == c
    assert isinstance(build_vqa(c), LSTMVQA)
    assert isinstance(build_vqa(VQAConfig(arch="transformer")), TransformerVQA)
    m = tiny()
    q, n = questions(TEXTS)
    with pytest.raises(UserError, match="32, 32"):
        m(torch.rand(2, 3, 64, 64), q, n)
    with pytest.raises(UserError, match="longer than max_len"):
        m(torch.rand(2, 3, 32, 32), torch.ones(2, 40, dtype=torch.long), torch.tensor([40, 40]))


@pytest.mark.slow
def test_short_run_reads_the_image_beyond_what_the_question_gives_away(tmp_path):
    """300 steps through the shared trainer, the product model next to the blind one trained the
    same way. Beating the per-type answer frequencies is not enough (the blind model does too):
    the full model must beat the majority answer of each exact question — about the best any
    image-blind answerer can do — and the blind model, and lose accuracy when the images are
    shuffled among the questions."""
    from attnlab.runs import load
    from attnlab.train import TrainConfig, train

    task = VQATask(n_train=1500, n_val=150, n_unseen=50)
    cfg = TrainConfig(
        steps=300,
        batch_size=64,
        lr=5e-3,
        warmup_steps=20,
        weight_decay=0.0,
        eval_every=300,
        eval_batches=2,
        progress=False,
        device="cpu",
    )
    acc = {}
    for fusion in ("none", "product"):
        torch.manual_seed(0)
        train(tiny(fusion=fusion).train(), task, cfg, tmp_path / fusion)
        model, vocab = load(tmp_path / fusion)
        acc[fusion] = task.accuracy_by_type(model, per_type=100)["all"]
    assert vocab.answers == VOCAB.answers
    majority, per_type, per_question = (
        task.answer_frequency_baseline(by=by, per_type=100) for by in ("answer", "type", "question")
    )
    seen = (acc, majority, per_type, per_question)
    assert majority < per_type < per_question, seen
    assert per_type < acc["none"] < per_question + 0.05, seen  # the blind model learns the prior
    assert acc["product"] > max(per_question, acc["none"]) + 0.03, seen

    # the same questions with each image replaced by another question's image
    pairs = task.eval_pairs("val", 100)
    batch = task._batch(task.sets("val"), pairs)
    shuffled = torch.roll(torch.arange(len(pairs)), 1)
    with torch.no_grad():
        right = model(batch["images"], batch["questions"], batch["lengths"]).argmax(-1)
        wrong = model(batch["images"][shuffled], batch["questions"], batch["lengths"]).argmax(-1)
    hits = (right == batch["answers"]).float().mean()
    torch.testing.assert_close(float(hits), acc["product"])
    assert (wrong == batch["answers"]).float().mean() < hits - 0.04, seen

"""DeiT: the distillation token and head on the ViT, against Hugging Face
``DeiTForImageClassificationWithTeacher`` built with random weights; the distillation loss
against its formula written out; a teacher that does not fit is refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers  # test extra, pinned in pyproject

from attnlab.data.images import ImageSettings
from attnlab.errors import UserError
from attnlab.interop import from_hf, to_hf
from attnlab.interop.hf.deit import deit_from_hf_state_dict
from attnlab.models.vision import DeiT, DeiTConfig
from attnlab.tasks.distill import Teacher
from attnlab.tasks.losses import distillation_loss
from test_interop_hf import randomise


def build_hf_deit(num_labels: int = 5):
    cfg = transformers.DeiTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        num_labels=num_labels,
        attn_implementation="eager",
    )
    return randomise(transformers.DeiTForImageClassificationWithTeacher(cfg)).eval()


def test_deit_matches_hf_with_teacher_and_round_trips(tmp_path):
    hf = build_hf_deit()
    hf.save_pretrained(tmp_path / "hf")
    model = from_hf(tmp_path / "hf")
    assert isinstance(model, DeiT) and model.kind == "deit"
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        ref = hf(pixel_values=images)
        ours = model(images)
        z_cls, z_dist = model(images, both_heads=True)
    # the averaged logits and each head on its own
    assert (ours - ref.logits).abs().max().item() < 1e-4
    assert (z_cls - ref.cls_logits).abs().max().item() < 1e-4
    assert (z_dist - ref.distillation_logits).abs().max().item() < 1e-4
    # and back: transformers reads our export weight for weight
    out = to_hf(model, tmp_path / "exported")
    back = transformers.DeiTForImageClassificationWithTeacher.from_pretrained(out)
    assert set(back.state_dict()) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # the in-memory path gives the same model
    again = deit_from_hf_state_dict(hf.config.to_dict(), hf.state_dict())
    with torch.no_grad():
        assert torch.equal(again(images), ours)


def test_distillation_token_is_token_one_and_heads_average():
    torch.manual_seed(0)
    model = DeiT(DeiTConfig.preset("tiny")).eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        tokens = model.encode(x)  # (B, 2 + 16, C)
        z_cls, z_dist = model(x, both_heads=True)
        assert tokens.shape[1] == 2 + 16 and model.features(x).shape[1] == 16
        torch.testing.assert_close(z_cls, model.head(tokens[:, 0]))
        torch.testing.assert_close(z_dist, model.head_dist(tokens[:, 1]))
        torch.testing.assert_close(model(x), (z_cls + z_dist) / 2)
    with pytest.raises(UserError, match="pooling must be 'cls'"):
        DeiTConfig.preset("tiny", pooling="mean")


def test_distillation_loss_is_its_formula():
    g = torch.Generator().manual_seed(0)
    z_cls, z_dist, z_t = (torch.randn(6, 4, generator=g) for _ in range(3))
    y = torch.randint(0, 4, (6,), generator=g)
    ce = F.cross_entropy
    hard = distillation_loss(z_cls, z_dist, y, z_t, kind="hard", alpha=0.3)
    torch.testing.assert_close(hard, 0.7 * ce(z_cls, y) + 0.3 * ce(z_dist, z_t.argmax(-1)))
    tau = 2.0
    p_t = (z_t / tau).softmax(-1)
    kl = (p_t * (p_t.log() - (z_dist / tau).log_softmax(-1))).sum(-1).mean()
    soft = distillation_loss(z_cls, z_dist, y, z_t, kind="soft", alpha=0.5, temperature=tau)
    torch.testing.assert_close(soft, 0.5 * ce(z_cls, y) + 0.5 * tau**2 * kl)


def test_teacher_of_another_size_or_classes_is_refused():
    teacher = Teacher(torch.nn.Linear(1, 1), ImageSettings(list("abc"), (1, 8, 8), [0.5], [0.2]),
                      "runs/cnn")
    with pytest.raises(UserError, match=r"reads 8×8, 1-channel images.*16×16, 1-channel"):
        teacher.check_student((1, 16, 16), list("abc"))
    with pytest.raises(UserError, match="scores 3 classes, the student 4"):
        teacher.check_student((1, 8, 8), list("abcd"))
    with pytest.raises(UserError, match="same order"):
        teacher.check_student((1, 8, 8), list("cba"))
    teacher.check_student((1, 8, 8), list("abc"))

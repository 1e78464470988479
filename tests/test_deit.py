"""DeiT: the distillation token and head on the ViT, against Hugging Face
``DeiTForImageClassificationWithTeacher`` built with random weights; the distillation loss
against its formula written out; a teacher that does not fit is refused by name."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import transformers  # test extra, pinned in pyproject

import attnlab
from attnlab.cli import main
from attnlab.config.vision import ImageTaskConfig
from attnlab.data.images import ImageSettings
from attnlab.errors import UserError
from attnlab.interop import from_hf, to_hf
from attnlab.interop.hf.deit import deit_from_hf_state_dict
from attnlab.models.vision import DeiT, DeiTConfig
from attnlab.models.vision.factory import build_image_classifier
from attnlab.tasks.distill import Teacher
from attnlab.tasks.image import ImageClassificationTask, load_task_data
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
    teacher = Teacher(
        torch.nn.Linear(1, 1), ImageSettings(list("abc"), (1, 8, 8), [0.5], [0.2]), "runs/cnn"
    )
    with pytest.raises(UserError, match=r"reads 8×8, 1-channel images.*16×16, 1-channel"):
        teacher.check_student((1, 16, 16), list("abc"))
    with pytest.raises(UserError, match="scores 3 classes, the student 4"):
        teacher.check_student((1, 8, 8), list("abcd"))
    with pytest.raises(UserError, match="same order"):
        teacher.check_student((1, 8, 8), list("cba"))
    teacher.check_student((1, 8, 8), list("abc"))


FAST = ["--steps", "3", "--batch-size", "16", "--eval-every", "3", "--warmup", "1", "--no-progress"]


def test_task_loss_with_a_teacher_is_the_formula_on_the_teachers_normalisation():
    """The task hands the teacher the batch in its own normalisation and the student's two heads
    to distillation_loss with the config's kind, α and τ."""
    splits = load_task_data(ImageTaskConfig(data="digits"), 0)
    config = ImageTaskConfig(
        data="digits", distillation="soft", distill_alpha=0.3, distill_temperature=2.0
    )
    task = ImageClassificationTask(splits, seed=0, train_fraction=0.5, config=config)
    torch.manual_seed(0)
    cnn = build_image_classifier("cnn", splits.image_shape, splits.classes).eval()
    student = build_image_classifier("deit", splits.image_shape, splits.classes).eval()
    other = ImageSettings(task.classes, task.image_shape, [0.3], [0.4])  # another normalisation
    task.use_teacher(Teacher(cnn, other, "cnn"))
    images, labels = task.get_batch("train", 0, 8)
    with torch.no_grad():
        loss, metrics = task.loss(student, (images, labels), None)
        pixels = images * task.std[0] + task.mean[0]
        z_t = cnn((pixels - 0.3) / 0.4)
        z_cls, z_dist = student(images, both_heads=True)
    expected = distillation_loss(
        z_cls, z_dist, labels, z_t, kind="soft", alpha=0.3, temperature=2.0
    )
    torch.testing.assert_close(loss, expected)
    assert 0.0 <= metrics["teacher_agree"] <= 1.0


def test_train_deit_with_a_cnn_teacher_and_bad_teachers(tmp_path, capsys):
    cnn, deit = tmp_path / "cnn", tmp_path / "deit"
    assert main(["train", "image", "--model", "cnn", "--out", str(cnn), *FAST]) == 0
    argv = ["train", "image", "--model", "deit", "--teacher", str(cnn), "--out", str(deit)]
    assert main([*argv, "--distillation", "soft", *FAST]) == 0
    assert "soft distillation from" in capsys.readouterr().out
    saved = json.loads((deit / "config.json").read_text())
    assert saved["kind"] == "deit" and saved["task"]["teacher"] == str(cnn.resolve())
    records = [json.loads(x) for x in (deit / "metrics.jsonl").read_text().splitlines()]
    assert any("teacher_agree" in r for r in records)
    run = attnlab.load(deit)
    assert isinstance(run.model, DeiT)
    # a teacher for a student that is not a DeiT, and a teacher of another image size
    err = _err(
        capsys,
        [
            "train",
            "image",
            "--model",
            "vit",
            "--teacher",
            str(cnn),
            "--out",
            str(tmp_path / "v"),
            *FAST,
        ],
    )
    assert "--teacher applies to --model deit only" in err
    err = _err(
        capsys,
        [
            "train",
            "image",
            "--model",
            "deit",
            "--data",
            "shapes",
            "--image-size",
            "16",
            "--shapes-n",
            "60",
            "--teacher",
            str(cnn),
            "--out",
            str(tmp_path / "s"),
            *FAST,
        ],
    )
    assert "reads 8×8, 1-channel images" in err and "16×16, 3-channel" in err


def _err(capsys, argv) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err

"""Learning-rate schedules against their formulas, weight-decay groups, the cross-entropy with
label smoothing, and the shared CLI flags."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.layers.block import RMSNorm
from attnlab.train import (
    LRSchedule,
    TrainConfig,
    add_train_args,
    cross_entropy,
    make_optimizer,
    param_groups,
    train_config_from_args,
)

# ---------------------------------------------------------------------------------------------
# schedules


def test_cosine_schedule_follows_formula():
    lr, w, s, r = 2e-3, 10, 110, 0.1
    sched = LRSchedule(TrainConfig(steps=s, lr=lr, warmup_steps=w, min_lr_ratio=r))
    got = [sched(k) for k in range(s + 1)]
    for k in range(w):  # linear warm-up, reaching the peak on the last warm-up step
        assert got[k] == pytest.approx(lr * (k + 1) / w)
    assert got[w - 1] == pytest.approx(lr) and got[w] == pytest.approx(lr)
    for k in range(w, s + 1):
        p = (k - w) / (s - w)
        assert got[k] == pytest.approx(lr * r + 0.5 * (lr - lr * r) * (1 + math.cos(math.pi * p)))
    assert got[(w + s) // 2] == pytest.approx(lr * (1 + r) / 2)  # half-way: mid-point
    assert got[s] == pytest.approx(lr * r)  # end: floor
    assert all(a >= b for a, b in zip(got[w:], got[w + 1 :]))


def test_inverse_sqrt_schedule_peaks_at_warmup():
    lr, w = 1e-3, 16
    sched = LRSchedule(TrainConfig(steps=400, lr=lr, warmup_steps=w, schedule="inverse_sqrt"))
    got = [sched(k) for k in range(400)]
    # Vaswani et al.: d^-0.5 * min(s^-0.5, s * W^-1.5), rescaled so that the peak is lr
    vaswani = [min((k + 1) ** -0.5, (k + 1) * w**-1.5) for k in range(400)]
    for a, b in zip(got, vaswani):
        assert a == pytest.approx(lr * b / max(vaswani))
    assert max(range(400), key=got.__getitem__) == w - 1
    assert got[w - 1] == pytest.approx(lr)
    assert got[4 * w - 1] == pytest.approx(lr / 2)  # ∝ 1/√s after the peak


def test_constant_schedule_and_warmup_fraction():
    sched = LRSchedule(TrainConfig(steps=50, lr=1.0, warmup_frac=0.2, schedule="constant"))
    assert [sched(k) for k in range(12)] == pytest.approx(
        [(k + 1) / 10 for k in range(10)] + [1.0, 1.0]
    )
    assert sched(49) == 1.0
    no_warmup = LRSchedule(TrainConfig(steps=5, lr=0.5, warmup_steps=0, schedule="constant"))
    assert [no_warmup(k) for k in range(5)] == [0.5] * 5


def test_wsd_schedule_is_flat_then_a_straight_line_to_the_floor():
    """Warm-up, stable, decay: the numbers worked by hand for W = 10, S = 110, f = 0.25, r = 0.1
    (the cool-down starts at p = 0.75, step 85, and reaches the floor at step 110)."""
    lr, w, s, r, f = 2.0, 10, 110, 0.1, 0.25
    cfg = TrainConfig(steps=s, lr=lr, warmup_steps=w, min_lr_ratio=r, schedule="wsd",
                      cooldown_frac=f)  # fmt: skip
    sched = LRSchedule(cfg)
    assert [sched(k) for k in range(w)] == pytest.approx([lr * (k + 1) / w for k in range(w)])
    assert [sched(k) for k in (10, 50, 85)] == pytest.approx([2.0, 2.0, 2.0])  # stable
    # p = (k - 10) / 100; past 0.75: 0.2 + 1.8 · (1 - p) / 0.25
    assert sched(90) == pytest.approx(0.2 + 1.8 * 0.20 / 0.25)  # 1.64
    assert sched(97) == pytest.approx(0.2 + 1.8 * 0.13 / 0.25)  # 1.136
    assert sched(110) == pytest.approx(0.2)  # the floor
    decay = [sched(k) for k in range(85, 111)]
    steps_down = [a - b for a, b in zip(decay, decay[1:])]
    assert steps_down == pytest.approx([1.8 / 25] * 25)  # a straight line
    # warm-up free (the speedrun's), timed: the progress is the elapsed fraction
    timed = LRSchedule(TrainConfig(max_time=60.0, lr=1.0, min_lr_ratio=0.0, warmup_steps=0,
                                   schedule="wsd", cooldown_frac=0.4))  # fmt: skip
    assert timed(0, t=0.0) == 1.0 and timed(5, t=0.6) == pytest.approx(1.0)
    assert timed(6, t=0.8) == pytest.approx(0.5) and timed(7, t=1.0) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="cooldown_frac must be in"):
        TrainConfig(steps=10, schedule="wsd", cooldown_frac=0.0)


def test_timed_cosine_runs_on_elapsed_fraction():
    cfg = TrainConfig(max_time=60.0, lr=1.0, min_lr_ratio=0.0, warmup_steps=4)
    sched = LRSchedule(cfg)
    assert [sched(k, t=0.01 * k) for k in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    t_w = 0.2  # the warm-up ended when 20 % of the time was spent: decay over the other 80 %
    assert sched(4, t=t_w) == pytest.approx(1.0)
    assert sched(5, t=0.6) == pytest.approx(0.5)
    assert sched(6, t=1.0) == pytest.approx(0.0)
    restored = LRSchedule(cfg)
    restored.load_state_dict(sched.state_dict())
    assert restored(7, t=0.6) == pytest.approx(0.5)
    frac = LRSchedule(TrainConfig(max_time=60.0, lr=1.0, min_lr_ratio=0.0, warmup_frac=0.5))
    assert frac(0, t=0.25) == pytest.approx(0.5) and frac(9, t=0.75) == pytest.approx(0.5)


def test_config_validation_names_the_values():
    with pytest.raises(ValueError, match="steps or max_time"):
        TrainConfig()
    with pytest.raises(ValueError, match=r"batch_size \(10\).*grad_accum \(4\)"):
        TrainConfig(steps=1, batch_size=10, grad_accum=4)
    with pytest.raises(ValueError, match="'linear'"):
        TrainConfig(steps=1, schedule="linear")
    with pytest.raises(ValueError, match="inverse_sqrt.*warm-up"):
        TrainConfig(steps=1, schedule="inverse_sqrt", warmup_steps=0)
    cfg = TrainConfig(steps=3, betas=[0.9, 0.99])
    assert cfg.betas == (0.9, 0.99) and TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"unknown TrainConfig field\(s\) \['nope'\]"):
        TrainConfig.from_dict({"steps": 1, "nope": 2})


# ---------------------------------------------------------------------------------------------
# weight-decay groups


class RelPos(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(9, 2))  # relative-position bias table


class PatchEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, 8, 2, stride=2)  # a linear map despite the module's name


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 11, bias=False)  # tied to tok_emb, and registered first
        self.tok_emb = nn.Embedding(11, 8)
        self.head.weight = self.tok_emb.weight
        self.pos = nn.Parameter(torch.zeros(5, 8))  # a learned positional table
        self.pos_embed = nn.Parameter(torch.zeros(1, 5, 8))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 8))
        self.table = nn.Embedding(3, 8)  # an embedding whose name does not say so
        self.patch_embed = PatchEmbed()
        self.rel_pos = RelPos()
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.rms = RMSNorm(8)
        self.w_in = nn.Parameter(torch.zeros(2, 4, 8))  # stacked expert weights (MoE)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)


def test_weight_decay_groups_exclude_norms_biases_embeddings():
    model = Tiny()
    groups = param_groups(model, 0.1)
    decay, keep = groups
    assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0
    assert sorted(decay["names"]) == ["patch_embed.proj.weight", "proj.weight", "w_in"]
    assert sorted(keep["names"]) == sorted(
        [
            "head.weight",
            "pos",
            "pos_embed",
            "cls_token",
            "table.weight",
            "rel_pos.table",
            "patch_embed.proj.bias",
            "proj.bias",
            "norm.weight",
            "norm.bias",
            "rms.weight",
        ]
    )
    n_trainable = len({id(p) for p in model.parameters() if p.requires_grad})
    assert len(decay["params"]) + len(keep["params"]) == n_trainable

    class WithHook(Tiny):
        def no_weight_decay(self):
            return {"proj", "w_in"}  # a module name excludes all its parameters

    assert param_groups(WithHook(), 0.1)[0]["names"] == ["patch_embed.proj.weight"]


def test_adamw_decays_only_the_decay_group():
    """With zero gradients AdamW only applies decoupled decay: w <- w (1 - lr·wd)."""
    model = Tiny()
    cfg = TrainConfig(steps=1, lr=0.1, weight_decay=0.5)
    opt = make_optimizer(model, cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        decayed = ("proj.weight", "patch_embed.proj.weight", "w_in")
        factor = 1 - 0.1 * 0.5 if n in decayed else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor)


# ---------------------------------------------------------------------------------------------
# cross-entropy


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_cross_entropy_matches_torch_and_formula(eps):
    logits = torch.randn(3, 7, 13, requires_grad=True)
    targets = torch.randint(0, 13, (3, 7))
    targets[0, :4] = -100
    targets[2, 6] = -100
    got = cross_entropy(logits, targets, label_smoothing=eps)
    want = F.cross_entropy(logits.reshape(-1, 13), targets.reshape(-1), label_smoothing=eps)
    torch.testing.assert_close(got, want)
    # (1 - ε)·(-log p_y) + ε·mean_v(-log p_v), averaged over the non-ignored positions
    logp = logits.log_softmax(-1)[targets != -100]  # (N, V)
    y = targets[targets != -100]
    formula = ((1 - eps) * -logp.gather(1, y[:, None])[:, 0] - eps * logp.mean(-1)).mean()
    torch.testing.assert_close(got, formula)
    got.backward()
    assert torch.all(logits.grad[0, :4] == 0)  # ignored positions get no gradient


def test_cross_entropy_edge_cases():
    logits = torch.randn(2, 5, requires_grad=True)
    all_ignored = cross_entropy(logits, torch.full((2,), -100))
    assert all_ignored.item() == 0.0
    all_ignored.backward()
    assert torch.all(logits.grad == 0)
    bf16 = cross_entropy(logits.detach().bfloat16(), torch.tensor([1, 2]))
    assert bf16.dtype == torch.float32
    with pytest.raises(ValueError, match=r"targets of shape \(2,\)"):
        cross_entropy(logits, torch.tensor([1, 2, 3]))


# ---------------------------------------------------------------------------------------------
# CLI flags


def test_cli_flags_defaults_and_overrides():
    parser = add_train_args(
        argparse.ArgumentParser(), steps=50, lr=1e-3, warmup=5, out="runs/x", batch_size=8
    )
    args = parser.parse_args([])
    cfg = train_config_from_args(args)
    assert (args.out, args.resume, args.overwrite) == ("runs/x", False, False)
    assert (cfg.steps, cfg.lr, cfg.warmup_steps, cfg.batch_size) == (50, 1e-3, 5, 8)
    assert cfg.grad_clip == 1.0 and cfg.progress and not cfg.compile
    args = parser.parse_args(
        [
            "--max-time",
            "30",
            "--grad-clip",
            "0",
            "--no-progress",
            "--amp",
            "bf16",
            "--resume",
            "--label-smoothing",
            "0.1",
            "--grad-accum",
            "2",
            "--eval-every",
            "7",
            "--seed",
            "3",
            "--device",
            "cpu",
            "--compile",
            "--schedule",
            "inverse_sqrt",
        ]
    )
    cfg = train_config_from_args(args, eval_batches=4)
    assert cfg.max_time == 30 and cfg.timed and cfg.grad_clip is None and not cfg.progress
    assert (cfg.amp, cfg.label_smoothing, cfg.grad_accum, cfg.eval_every) == ("bf16", 0.1, 2, 7)
    assert (cfg.seed, cfg.device, cfg.compile, cfg.schedule) == (3, "cpu", True, "inverse_sqrt")
    assert cfg.eval_batches == 4 and args.resume
    with pytest.raises(ValueError, match="unknown default 'nope'"):
        add_train_args(argparse.ArgumentParser(), nope=1)
    required = add_train_args(argparse.ArgumentParser(), steps=5)
    with pytest.raises(SystemExit):
        required.parse_args([])  # --out has no default: required
    with pytest.raises(ValueError, match="grad_accum"):
        train_config_from_args(
            required.parse_args(["--out", "r", "--batch-size", "6", "--grad-accum", "4"])
        )

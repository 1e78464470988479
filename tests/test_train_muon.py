"""``TrainConfig.optimizer="muon"``: torch.optim.Muon on the hidden matrices, AdamW on the rest."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.config.base import ConfigError
from attnlab.models.lm import DecoderLM
from attnlab.train import TrainConfig, make_optimizer, train
from attnlab.train.muon import Muon, MuonAdamW
from attnlab.train.optim import LRSchedule
from test_train import ToyTask, base_cfg, make_model, train_losses


def _newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The quintic Newton–Schulz iteration written out (float64, no transposing trick)."""
    a, b, c = 3.4445, -4.775, 2.0315
    x = g.double() / g.double().norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


def test_muon_update_is_the_orthogonalised_momentum():
    """First step from W with gradient G: W - W' = lr·√max(1, m/n)·NS(G + μG); its singular
    values are all close to 1 (an orthogonalised update), unlike G's."""
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(8, 16))
    g = torch.randn(8, 16) * torch.logspace(0, 2, 16)  # singular values spread over 2 decades
    w.grad = g.clone()
    w0 = w.detach().clone()
    lr, mu = 0.1, 0.95
    torch.optim.Muon([w], lr=lr, momentum=mu, weight_decay=0.0, nesterov=True).step()
    update = (w0 - w.detach()) / lr  # rows 8 <= cols 16: no shape adjustment
    want = _newton_schulz(g + mu * g).float()
    torch.testing.assert_close(update, want, atol=3e-2, rtol=0)  # torch runs NS in bfloat16
    s = torch.linalg.svdvals(update)
    assert s.min() > 0.6 and s.max() < 1.25, s
    assert torch.linalg.svdvals(g).max() / torch.linalg.svdvals(g).min() > 10
    # and it points the way U Vᵀ of the gradient does
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    cos = (update * (u @ vh)).sum() / (update.norm() * (u @ vh).norm())
    assert cos > 0.95


@pytest.mark.parametrize("shape", [(8, 16), (24, 6)])
def test_attnlab_muon_is_torchs_update_with_newton_schulz_in_float32(shape):
    """attnlab's Muon (float32 Newton–Schulz on a CPU) against the float64 formula, tightly, and
    against torch.optim.Muon (bfloat16) within bfloat16's rounding; a tall matrix's step is
    scaled by √(rows/cols) in both; the states load into each other."""
    torch.manual_seed(1)
    g = torch.randn(*shape) * torch.logspace(0, 1, shape[1])
    lr, mu, decay = 0.1, 0.9, 0.01
    steps = {}
    for name, cls in (("attnlab", Muon), ("torch", torch.optim.Muon)):
        w = nn.Parameter(torch.ones(*shape))
        opt = cls([w], lr=lr, momentum=mu, weight_decay=decay, nesterov=True)
        for _ in range(2):  # the second step reads the momentum buffer
            w.grad = g.clone()
            opt.step()
        steps[name] = (w.detach().clone(), opt.state_dict())
    # by hand: B ← B + (1-μ)(G - B); the Nesterov update G + μ(B - G) (torch's lerp form)
    w = torch.ones(*shape, dtype=torch.float64)
    buf = torch.zeros_like(w)
    scale = max(1.0, shape[0] / shape[1]) ** 0.5
    for _ in range(2):
        buf = buf + (1 - mu) * (g.double() - buf)
        update = g.double() + mu * (buf - g.double())
        o = _newton_schulz(update.T).T if shape[0] > shape[1] else _newton_schulz(update)
        w = w * (1 - lr * decay) - lr * scale * o
    torch.testing.assert_close(steps["attnlab"][0], w.float(), atol=2e-5, rtol=0)
    torch.testing.assert_close(steps["torch"][0], w.float(), atol=3e-2, rtol=0)
    a, t = steps["attnlab"][1], steps["torch"][1]
    assert a["param_groups"] == t["param_groups"]
    torch.testing.assert_close(a["state"][0]["momentum_buffer"], t["state"][0]["momentum_buffer"])
    back = torch.optim.Muon([nn.Parameter(torch.ones(*shape))], lr=lr)
    back.load_state_dict(a)  # an attnlab checkpoint opens in torch's Muon, and the reverse
    Muon([nn.Parameter(torch.ones(*shape))], lr=lr).load_state_dict(t)


def test_make_optimizer_muon_is_attnlabs_float32_muon():
    opt = make_optimizer(_lm(True), TrainConfig(optimizer="muon", steps=1), torch.device("cpu"))
    assert type(opt.muon) is Muon


def _lm(tie: bool) -> DecoderLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=20, max_seq_len=8, d_model=16, n_heads=2, n_layers=2)
    cfg.tie_embeddings = tie
    return DecoderLM(cfg)


@pytest.mark.parametrize("tie", [True, False])
def test_split_puts_exactly_the_hidden_matrices_under_muon(tie):
    model = _lm(tie)
    opt = make_optimizer(model, TrainConfig(steps=1, optimizer="muon", weight_decay=0.1))
    assert isinstance(opt, MuonAdamW)
    name_of = {id(p): n for n, p in model.named_parameters()}
    hidden = {
        f"{n}.weight"
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and n.startswith("blocks.")
    }
    muon = {name_of[id(p)] for g in opt.muon.param_groups for p in g["params"]}
    adamw = {name_of[id(p)] for g in opt.adamw.param_groups for p in g["params"]}
    assert muon == hidden and len(hidden) == 2 * 4  # qkv/out, fc1/fc2 per block (names aside)
    assert muon.isdisjoint(adamw) and muon | adamw == set(name_of.values())
    assert ("lm_head.weight" in adamw) == (not tie) and "tok_emb.weight" in adamw
    decay = {
        name_of[id(p)] for g in opt.adamw.param_groups if g["weight_decay"] for p in g["params"]
    }
    assert decay == ({"lm_head.weight"} if not tie else set())


def test_schedule_scales_muon_lr_and_config_checks():
    cfg = TrainConfig(steps=10, optimizer="muon", lr=1e-3, muon_lr=0.02, warmup_steps=0)
    cfg.schedule = "constant"
    opt = make_optimizer(_lm(True), cfg)
    LRSchedule(cfg).apply(opt, 3)
    assert [g["lr"] for g in opt.muon.param_groups] == pytest.approx([0.02])
    assert {g["lr"] for g in opt.adamw.param_groups} == {1e-3}
    with pytest.raises(ConfigError, match="optimizer"):
        TrainConfig(steps=1, optimizer="sgd")
    with pytest.raises(ConfigError, match="fsdp"):
        TrainConfig(steps=1, optimizer="muon", strategy="fsdp")


def test_muon_run_stopped_and_resumed_equals_one_run(tmp_path):
    """Muon's momentum buffers and AdamW's moments go into state.pt: stop after 4 of 8 steps,
    resume, and the losses and weights equal an uninterrupted run's."""
    cfg = base_cfg(steps=8, eval_every=4, optimizer="muon", muon_lr=0.05)
    ref_model = make_model(dropout=0.2)
    ref = train(ref_model, ToyTask(), cfg, tmp_path / "ref")
    train(make_model(dropout=0.2), ToyTask(), cfg, tmp_path / "run", stop_after=4)
    model = make_model(dropout=0.2)
    res = train(model, ToyTask(), cfg, tmp_path / "run", resume=True)
    got, want = train_losses(res), train_losses(ref)
    assert len(got) == 8 and max(abs(a - b) for (_, a), (_, b) in zip(got, want)) <= 1e-6
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    saved = torch.load(tmp_path / "run" / "state.pt", weights_only=False)["optimizer"]
    assert set(saved) == {"muon", "adamw"} and saved["muon"]["state"]  # momentum buffers kept
    assert want[-1][1] < want[0][1]  # and it learns

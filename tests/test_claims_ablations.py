"""The lecture's ablations (issue 34), pinned at small size: seeded, one thread."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.config.lm import ModelConfig
from attnlab.errors import UserError
from attnlab.experiments.ablation_probes import (
    ConcatPositions,
    batch_dependence,
    block_grad_norms,
)
from attnlab.experiments.ablations import (
    AblationsConfig,
    concat_positions_lm,
    expert_load,
    lm_variant,
    prefix_loss,
    run_ablations,
    unmasked_lm,
)
from attnlab.interop.hf.lm import lm_config_to_hf


def test_prefix_loss_of_a_causal_model_is_its_loss_at_those_positions(one_thread):
    """A causal model's logit at position ℓ − 1 cannot depend on what follows, so reading only
    the prefix gives the same loss as the full row at those positions; a maskless one differs."""
    cfg = AblationsConfig(seq_len=16, d_model=16, n_heads=2)
    x = torch.randint(30, (4, 16), generator=torch.Generator().manual_seed(0))
    lengths = (4, 9, 15)
    for model, same in ((lm_variant(cfg, 30), True), (unmasked_lm(cfg, 30), False)):
        model.eval()
        with torch.no_grad():
            full = torch.log_softmax(model(x), -1)
        want = torch.stack([-full[torch.arange(4), n - 1, x[:, n]].mean() for n in lengths])
        got = prefix_loss(model, x, lengths)
        assert (abs(got - float(want.mean())) < 1e-5) == same


def test_expert_load_shares_sum_to_one_per_layer(one_thread):
    cfg = AblationsConfig(seq_len=16, d_model=16, n_heads=2)
    model = lm_variant(cfg, 30, ffn="moe", n_experts=4, top_k=2)
    load = expert_load(model, torch.randint(30, (3, 16)))
    assert len(load) == cfg.n_layers and all(len(s) == 4 for s in load)
    assert all(sum(s) == pytest.approx(1.0) for s in load)


@pytest.mark.slow
def test_without_the_causal_mask_teacher_forcing_collapses_and_generation_fails(
    tmp_path, one_thread
):
    """Seeded, 80 steps: the maskless model reads the next character, so its teacher-forced
    loss falls well below the causal model's (measured 2.29 vs 2.87) while its loss where
    generation reads it, the last position of a prefix, is far worse (3.73 vs 2.89)."""
    cfg = AblationsConfig(rows=("causal",), steps=80, d_model=32, seq_len=32, batch_size=16,
                          max_chars=100_000, progress=False)  # fmt: skip
    causal, nomask = run_ablations(cfg, tmp_path)["rows"]["causal"]
    assert nomask["val_loss"] < causal["val_loss"] - 0.3
    assert nomask["generation_loss"] > causal["generation_loss"] + 0.5
    assert abs(causal["generation_loss"] - causal["val_loss"]) < 0.2  # causal: no difference
    assert (tmp_path / "ablations.png").exists() and (tmp_path / "table.md").exists()


def _tiny(**kw) -> AblationsConfig:
    base = dict(seq_len=16, d_model=16, n_heads=2, batch_size=8, max_chars=50_000, progress=False)
    return AblationsConfig(**{**base, **kw})


def test_batchnorm_makes_a_windows_outputs_depend_on_its_batch_layernorm_does_not(
    tmp_path, one_thread
):
    """With the batch statistics of training, a BatchNorm LM's logits for one window change
    when the other windows, appended padding or later positions change (measured 0.03-0.40 at
    5 steps over seeds 0-2); LayerNorm's, and BatchNorm's with its running statistics, do not
    (at most 9e-8: float rounding)."""
    rows = run_ablations(_tiny(rows=("batchnorm",), steps=5), tmp_path)["rows"]["batchnorm"]
    ln, bn = rows
    for key in ("batch", "padding", "future"):
        assert ln["dependence"][key] < 1e-5 and ln["dependence_eval"][key] < 1e-5
        assert bn["dependence"][key] > 1e-2
        assert bn["dependence_eval"][key] < 1e-5
    assert all(math.isfinite(r["val_loss"]) for r in rows)
    assert "Δ other windows" in (tmp_path / "table.md").read_text()


def test_batch_dependence_restores_the_running_statistics(one_thread):
    model = lm_variant(_tiny(), 30, norm="batchnorm").eval()
    before = {k: v.clone() for k, v in model.named_buffers()}
    batch_dependence(model, torch.randint(30, (8, 16)))
    assert not model.training
    assert all(torch.equal(v, before[k]) for k, v in model.named_buffers())


def test_without_residuals_a_deep_stacks_first_layer_gets_almost_no_gradient(one_thread):
    """At initialisation, 16 pre-norm blocks of width 32: with the skip connections every block
    gets a gradient of about the same size (measured 0.33 first, 0.32 last); without them the
    first block's is under a hundredth of the residual model's (measured 2.6e-5)."""
    cfg = AblationsConfig(seq_len=32, d_model=32, n_heads=4)
    x = torch.randint(30, (16, 32), generator=torch.Generator().manual_seed(0))
    with_res = block_grad_norms(lm_variant(cfg, 30, n_layers=16), x)
    without = block_grad_norms(lm_variant(cfg, 30, n_layers=16, residual=False), x)
    assert max(with_res) / min(with_res) < 2
    assert without[0] < 0.01 * with_res[0]
    assert without[0] < 0.01 * without[-1]  # it vanishes towards the input


def test_concatenated_positions_fill_the_last_p_channels(one_thread):
    """[E[x]_{:C−P} ; p_t]: the token part is the embedding's first C − P columns, the position
    part the learned table's row t, the same for every window."""
    cfg = _tiny(pos_width=4)
    model = concat_positions_lm(cfg, 30)
    x = torch.randint(30, (3, 16))
    h = model.pos_emb.embed(model.tok_emb(x), torch.arange(16))
    assert h.shape == (3, 16, 16)
    assert torch.equal(h[..., :12], model.tok_emb(x)[..., :12])
    assert torch.equal(h[..., 12:], model.pos_emb.code.weight.expand(3, 16, 4))
    assert model(x).shape == (3, 16, 30)
    with pytest.raises(UserError, match="position width"):
        ConcatPositions(16, 16, 16)


def test_hf_export_refuses_a_block_without_residuals():
    with pytest.raises(UserError, match="residual=True, not residual=False"):
        lm_config_to_hf(ModelConfig.preset("tiny", residual=False), "gpt2")

"""attnlab.inspect: head scores on hand-built patterns, ablation against editing weights by hand,
direct logit attribution against the logits, caches that keep only what was asked, bad input."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from attnlab.config.lm import ModelConfig
from attnlab.config.translation import Seq2SeqConfig, TranslationTaskConfig
from attnlab.data.translation.pairs import make_dates
from attnlab.data.translation.vocab import TranslationVocabs, Vocab, normalizer_for
from attnlab.inspect import (
    ablate_experts,
    ablate_heads,
    ablate_neurons,
    alignment_agreement,
    diagnose,
    direct_logit_attribution,
    patch,
    patch_heads,
    patch_positions,
    pattern_scores,
    repeated_tokens,
    run_with_cache,
    run_with_hooks,
)
from attnlab.inspect.alignment import date_fields, token_fields
from attnlab.inspect.diagnostics import repeated_scores
from attnlab.inspect.probe import probe_for
from attnlab.models.lm import DecoderLM
from attnlab.models.seq2seq import Seq2SeqTransformer

T = 6


def _rows(weights: list[list[float]]) -> torch.Tensor:
    return torch.tensor(weights)[None, None]  # (1, 1, T, T)


def test_uniform_causal_pattern_scores():
    p = torch.tril(torch.ones(T, T))
    p = (p / p.sum(-1, keepdim=True))[None, None]
    s = pattern_scores(p, causal=True)
    assert s["uniformity"].item() == pytest.approx(1.0)
    expect_ent = sum(math.log(t + 1) for t in range(T)) / T  # row t: uniform over t + 1 keys
    assert s["entropy"].item() == pytest.approx(expect_ent, rel=1e-6)
    assert s["previous_token"].item() == pytest.approx(
        sum(1 / (t + 1) for t in range(1, T)) / (T - 1)
    )
    assert s["first_token"].item() == pytest.approx(s["previous_token"].item())
    assert s["diagonal"].item() == pytest.approx(sum(1 / (t + 1) for t in range(T)) / T)
    assert s["causal_leak"].item() == 0.0


def test_diagonal_previous_and_sink_patterns_score_one_on_their_own_score():
    eye = torch.eye(T)[None, None]
    prev = torch.zeros(T, T)
    prev[0, 0] = 1.0
    prev[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    sink = torch.zeros(T, T)
    sink[:, 0] = 1.0
    d, p, k = (pattern_scores(x, causal=True) for x in (eye, prev[None, None], sink[None, None]))
    assert d["diagonal"].item() == 1.0 and d["previous_token"].item() == 0.0
    assert d["entropy"].item() == 0.0 and d["uniformity"].item() == 0.0
    assert p["previous_token"].item() == 1.0 and p["diagonal"].item() == pytest.approx(1 / T)
    assert k["first_token"].item() == 1.0 and k["previous_token"].item() == pytest.approx(
        1 / (T - 1)
    )


def test_a_pattern_on_later_keys_is_a_causal_leak():
    p = torch.zeros(T, T)
    p[:, -1] = 1.0  # every query reads the last key
    s = pattern_scores(p[None, None], causal=True)
    assert s["causal_leak"].item() == 1.0


def test_padding_keys_do_not_count_as_keys():
    p = torch.zeros(1, 1, 2, 4)
    p[..., :2] = 0.5  # uniform over the two real keys
    mask = torch.tensor([[True, True, False, False]])
    assert pattern_scores(p, key_mask=mask)["uniformity"].item() == pytest.approx(1.0)
    assert pattern_scores(p)["uniformity"].item() == pytest.approx(0.5)


def test_duplicate_and_induction_scores_on_repeated_tokens():
    n = 4
    dup = torch.zeros(2 * n, 2 * n)
    ind = torch.zeros(2 * n, 2 * n)
    for t in range(2 * n):
        dup[t, t - n if t >= n else t] = 1.0
        ind[t, t - n + 1 if t >= n else t] = 1.0
    a, b = repeated_scores(dup[None, None], n), repeated_scores(ind[None, None], n)
    assert a["duplicate_token"].item() == 1.0 and a["induction"].item() == 0.0
    assert b["induction"].item() == 1.0 and b["duplicate_token"].item() == 0.0
    r = repeated_tokens(50, n, batch=3)
    assert r.shape == (3, 2 * n) and torch.equal(r[:, :n], r[:, n:])


def test_alignment_agreement_is_the_mass_on_aligned_tokens():
    p = torch.tensor([[[[0.7, 0.3], [0.2, 0.8], [0.5, 0.5]]]])  # (1, 1, T=3, S=2)
    align = torch.tensor([[[True, False], [False, True], [False, False]]])  # t=2 unaligned
    assert alignment_agreement(p, align).item() == pytest.approx((0.7 + 0.8) / 2)


def _lm(**kw):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=40, max_seq_len=32, **kw)
    return DecoderLM(cfg).eval(), torch.randint(0, 40, (2, 9))


def test_zero_ablating_neurons_is_zeroing_their_columns_of_w_out():
    model, x = _lm()
    fc2 = model.blocks[1].ffn.fc2
    with torch.no_grad():
        with ablate_neurons(model, {"blocks.1.mlp": [3, 10]}):
            ablated = model(x)
        saved = fc2.weight.clone()
        fc2.weight[:, [3, 10]] = 0
        by_hand = model(x)
        fc2.weight.copy_(saved)
    torch.testing.assert_close(ablated, by_hand, atol=1e-6, rtol=0)


def test_mean_ablating_a_head_is_its_mean_output_as_a_bias():
    model, x = _lm()
    ref = torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(4))
    attn = model.blocks[0].attn
    h, D = 2, attn.head_dim
    with torch.no_grad():
        _, cache = run_with_cache(model, ref, names="blocks.0.attn.hook_z")
        mean_z = cache["blocks.0.attn.hook_z"][:, :, h].mean(dim=(0, 1))  # (D,)
        with ablate_heads(model, {"blocks.0.attn": [h]}, mode="mean", reference=ref):
            ablated = model(x)
        w, b = attn.out_proj.weight, attn.out_proj.bias
        saved_w, saved_b = w.clone(), b.clone()
        b += w[:, h * D : (h + 1) * D] @ mean_z
        w[:, h * D : (h + 1) * D] = 0
        by_hand = model(x)
        w.copy_(saved_w)
        b.copy_(saved_b)
    torch.testing.assert_close(ablated, by_hand, atol=1e-5, rtol=0)


def test_zero_ablating_an_expert_is_zeroing_its_output_weights():
    model, x = _lm(ffn="moe", n_experts=4, top_k=2)
    moe = model.blocks[0].ffn
    with torch.no_grad():
        with ablate_experts(model, {"blocks.0.mlp": [1]}):
            ablated = model(x)
        saved = moe.w_out.clone()
        moe.w_out[1] = 0
        by_hand = model(x)
        moe.w_out.copy_(saved)
        with ablate_experts(model, {"blocks.0.ffn": [1]}, mode="mean", reference=x):
            mean = model(x)
    torch.testing.assert_close(ablated, by_hand, atol=1e-6, rtol=0)
    assert not torch.allclose(mean, ablated)
    assert "expert_forward" not in vars(moe)  # the layer is left as it was


def test_router_hooks_see_the_chosen_experts():
    model, x = _lm(ffn="moe", n_experts=4, top_k=2)
    _, cache = run_with_cache(model, x, names=lambda n: n.startswith("blocks.0.mlp.hook_"))
    logits = cache["blocks.0.mlp.hook_router_logits"]  # (B, T, E)
    chosen = cache["blocks.0.mlp.hook_expert_indices"]  # (B, T, K)
    assert logits.shape == (2, 9, 4) and chosen.shape == (2, 9, 2)
    assert torch.equal(chosen.sort(-1).values, logits.topk(2, -1).indices.sort(-1).values)
    torch.testing.assert_close(cache["blocks.0.mlp.hook_expert_weights"].sum(-1), torch.ones(2, 9))


@pytest.mark.parametrize("kw", [{}, {"norm": "rmsnorm", "position": "rope", "bias": False}])
def test_direct_logit_attribution_sums_to_the_logits(kw):
    model, x = _lm(**kw)
    with torch.no_grad():
        logits = model(x)
    targets = torch.randint(0, 40, x.shape)
    parts = direct_logit_attribution(model, x, targets)
    assert "blocks.1.attn.head3" in parts and "blocks.0.mlp" in parts
    total = sum(parts.values())
    torch.testing.assert_close(
        total, logits.gather(-1, targets[..., None])[..., 0], atol=1e-4, rtol=0
    )


def test_cache_keeps_only_the_chosen_names():
    model, x = _lm()
    _, cache = run_with_cache(model, x, names=["blocks.0.hook_resid_post", "hook_embed"])
    assert sorted(cache) == ["blocks.0.hook_resid_post", "hook_embed"]
    _, cache = run_with_cache(model, x, names=lambda n: n.endswith("hook_pattern"))
    assert sorted(cache) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]


def test_a_hook_that_edits_changes_the_output_and_is_removed_after():
    model, x = _lm()
    with torch.no_grad():
        ref = model(x)
        out = run_with_hooks(model, x, hooks=[("blocks.1.hook_resid_post", lambda a, n: a * 0)])
        assert torch.allclose(
            out, model.lm_head(model.norm_f(torch.zeros(1, 1, 64))).expand_as(out)
        )
        assert torch.equal(model(x), ref)


def test_patching_sweep_of_identical_inputs_is_the_clean_metric_everywhere():
    model, x = _lm()
    with torch.no_grad():
        clean = model(x)[:, -1, 3].sum()
    sweep = patch_positions(model, x, x, lambda o: o[:, -1, 3].sum())
    assert sweep.shape == (2, 9)
    torch.testing.assert_close(sweep, torch.full((2, 9), clean.item()), atol=1e-5, rtol=0)
    heads = patch_heads(model, x, x, lambda o: o[:, -1, 3].sum())
    assert heads.shape == (2, 4)


def test_patching_every_position_of_the_first_residual_restores_the_clean_output():
    model, clean = _lm()
    corrupted = clean.clone()
    corrupted[:, 3] = (corrupted[:, 3] + 1) % 40
    with torch.no_grad():
        ref = model(clean)
        assert torch.equal(patch(model, clean, corrupted, ["blocks.0.hook_resid_pre"]), ref)
        assert not torch.allclose(model(corrupted), ref)


def test_diagnose_an_lm_gives_every_score_per_head():
    model, x = _lm()

    def loss(out):
        return torch.nn.functional.cross_entropy(out[:, :-1].reshape(-1, 40), x[:, 1:].reshape(-1))

    heads = diagnose(model, x, repeated=repeated_tokens(40, 5), loss_fn=loss)
    assert len(heads) == 2 * 4
    h = heads[0]
    assert h.name == "blocks.0.attn.head0" and h.causal
    for field in ("entropy", "uniformity", "previous_token", "first_token", "diagonal"):
        assert getattr(h, field) is not None
    assert h.induction is not None and h.duplicate_token is not None and h.loss_delta is not None
    assert h.causal_leak == 0.0


# -- bad input


def test_an_unknown_hook_name_names_the_close_ones():
    model, x = _lm()
    with pytest.raises(
        ValueError,
        match=r"unknown hook name 'blocks\.0\.attn\.hook_patern'.*"
        r"did you mean 'blocks\.0\.attn\.hook_pattern'",
    ):
        run_with_cache(model, x, names="blocks.0.attn.hook_patern")
    with pytest.raises(ValueError, match="unknown hook name 'blocks.0.ln_1.hook_scale'"):
        run_with_hooks(model, x, hooks=[("blocks.0.ln_1.hook_scale", lambda a, n: None)])
    with pytest.raises(ValueError, match="selects no hook point"):
        run_with_cache(model, x, names=lambda n: n.startswith("decoder"))


def test_a_hook_returning_the_wrong_shape_is_a_clear_error():
    model, x = _lm()
    with pytest.raises(
        ValueError,
        match=r"hook on 'blocks.0.attn.hook_z' returned shape "
        r"\(2, 9, 4\); the activation has shape \(2, 9, 4, 16\)",
    ):
        run_with_hooks(model, x, hooks=[("blocks.0.attn.hook_z", lambda a, n: a.sum(-1))])
    with pytest.raises(ValueError, match="returned float"):
        run_with_hooks(model, x, hooks=[("hook_embed", lambda a, n: 1.0)])


def test_patching_inputs_of_different_lengths_is_a_clear_error():
    model, x = _lm()
    with pytest.raises(ValueError, match=r"same shape; input 0 is \(2, 9\) clean and \(2, 8\)"):
        patch_positions(model, x, x[:, :8], lambda o: o.sum())
    with pytest.raises(ValueError, match="same form; got 1 and 2 inputs"):
        patch(model, x, (x, x), ["hook_embed"])


def test_bad_ablation_requests_are_clear_errors():
    model, x = _lm()
    with pytest.raises(ValueError, match="unknown hook name 'blocks.5.attn.hook_z'"):
        with ablate_heads(model, {"blocks.5.attn": [0]}):
            pass
    with pytest.raises(ValueError, match="mean ablation needs reference inputs"):
        with ablate_heads(model, {"blocks.0.attn": [0]}, mode="mean"):
            pass
    with pytest.raises(ValueError, match="unknown ablation mode 'random'"):
        with ablate_heads(model, {"blocks.0.attn": [0]}, mode="random"):
            pass
    with pytest.raises(ValueError, match="no MoE layer at 'blocks.0.mlp'"):
        with ablate_experts(model, {"blocks.0.mlp": [0]}):
            pass


def test_date_fields_find_year_month_and_day_in_every_format():
    def fields(src, iso):
        s, _ = date_fields(src, iso)
        words = src.replace(",", " ").split()
        return token_fields(src, words, s)

    assert fields("the 3rd of march 2021", "2021-03-03") == [None, "day", None, "month", "year"]
    assert fields("03.03.21", "2021-03-03") == ["day"]  # one word: its first labelled char
    s, t = date_fields("03.04.21", "2021-04-03")
    assert "".join("dmy"[["day", "month", "year"].index(f)] if f else "." for f in s) == "dd.mm.yy"
    assert t == ["year"] * 4 + [None] + ["month"] * 2 + [None] + ["day"] * 2
    s, _ = date_fields("2021/04/03", "2021-04-03")
    assert s[:4] == ["year"] * 4 and s[5:7] == ["month"] * 2 and s[8:] == ["day"] * 2
    assert fields("tue apr 3 2021", "2021-04-03") == [None, "month", "day", "year"]


def test_translation_probe_on_dates_gives_the_alignment_and_diagnose_scores_it():
    task = TranslationTaskConfig(task="dates", src_level="char", tgt_level="char")
    pairs = make_dates(200, seed=0)
    src, tgt = (
        Vocab.build((s for s, _ in pairs), "char"),
        Vocab.build((t for _, t in pairs), "char"),
    )
    vocabs = TranslationVocabs(src, tgt, normalizer_for(task))
    torch.manual_seed(0)
    cfg = Seq2SeqConfig.preset("tiny", src_vocab_size=len(src), tgt_vocab_size=len(tgt))
    run = SimpleNamespace(
        model=Seq2SeqTransformer(cfg).eval(),
        tokenizer=vocabs,
        kind="transformer",
        task=task.to_dict(),
    )
    probe = probe_for(run, batch=3)
    a = probe.alignment
    B, S = probe.inputs[0].shape
    assert a.shape == (B, probe.inputs[2].shape[1], S)
    assert a[:, :4].any(-1).all()  # the year's four digits are aligned to something
    assert not a[:, 4].any()  # the hyphen to nothing
    heads = diagnose(run.model, probe.inputs, loss_fn=probe.loss_fn, alignment=a)
    cross = [h for h in heads if h.attention == "cross"]
    assert cross and all(0.0 <= h.alignment <= 1.0 for h in cross)
    assert all(h.alignment is None for h in heads if h.attention == "self")

"""The speedrun options of the decoder LM: ReLU², zero-initialised projections, soft cap, value
embeddings, U-Net skips across the stack and the token shift.

Each option changes what it names and nothing else (same seed, same other weights)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import ModelConfig
from attnlab.config.base import ConfigError
from attnlab.decoding import generate
from attnlab.errors import UserError
from attnlab.interop import to_hf
from attnlab.layers.block import MLP
from attnlab.models.lm import DecoderLM
from attnlab.train.muon import muon_split
from attnlab.train.optim import param_groups

_PROJ = ("out_proj.weight", "fc2.weight")


def _lm(**kw) -> DecoderLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=23, max_seq_len=8, d_model=16, n_heads=2, n_layers=2, **kw)
    return DecoderLM(cfg).eval()


def _idx() -> torch.Tensor:
    return torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(1))


def test_relu2_activation_is_relu_squared():
    torch.manual_seed(0)
    mlp = MLP(8, 32, activation="relu2")
    x = torch.randn(4, 8)
    want = mlp.fc2(F.relu(mlp.fc1(x)) ** 2)
    torch.testing.assert_close(mlp(x), want)
    model = _lm(activation="relu2")
    assert all(b.ffn.activation == "relu2" for b in model.blocks)


def test_zero_init_makes_every_block_the_identity_and_changes_nothing_else():
    plain, zero = _lm(), _lm(zero_init_proj=True)
    for (name, p), (_, q) in zip(plain.named_parameters(), zero.named_parameters()):
        if name.endswith(_PROJ):
            assert q.abs().max() == 0 and p.abs().max() > 0, name
        else:
            torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    x = torch.randn(2, 8, 16)
    for block in zero.blocks:  # each block returns the residual stream untouched
        torch.testing.assert_close(block(x, is_causal=True), x)
    # so the logits are those of the embeddings alone
    idx = _idx()
    h = zero.tok_emb(idx) + zero.pos_emb.embed(torch.zeros(2, 8, 16), torch.arange(8))
    torch.testing.assert_close(zero(idx), zero.lm_head(zero.norm_f(h)))


def test_softcap_is_c_tanh_of_the_plain_logits_also_in_the_loss():
    plain, capped = _lm(), _lm(logit_softcap=2.0)
    with torch.no_grad():  # large logits, so the cap matters
        for m in (plain, capped):
            m.lm_head.weight.mul_(8.0)
    idx = _idx()
    z, got = plain(idx), capped(idx)
    assert z.abs().max() > 2.0 and got.abs().max() < 2.0
    torch.testing.assert_close(got, 2.0 * torch.tanh(z / 2.0))
    loss = capped(idx, targets=idx)
    torch.testing.assert_close(loss, F.cross_entropy(got.reshape(-1, 23), idx.reshape(-1)))
    with pytest.raises(ConfigError, match="logit_softcap"):
        ModelConfig(logit_softcap=-1.0)


def test_relu2_exports_to_hf_gpt2_with_the_same_logits_and_softcap_is_refused(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = _lm(activation="relu2", bias=True)
    out = to_hf(model, tmp_path / "hf")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    idx = _idx()
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=idx).logits, model(idx), atol=1e-5, rtol=0)
    with pytest.raises(UserError, match="logit_softcap"):
        to_hf(_lm(logit_softcap=15.0), tmp_path / "capped")


# -- value embeddings and U-Net skips (the stack's wiring) -----------------------------------------


def _stack_lm(**kw) -> DecoderLM:
    torch.manual_seed(0)
    base = dict(vocab_size=23, max_seq_len=8, d_model=16, n_heads=4, n_kv_heads=2, n_layers=4)
    cfg = ModelConfig(**{**base, **kw})
    return DecoderLM(cfg).eval()


def _embed(model: DecoderLM, idx: torch.Tensor) -> torch.Tensor:
    return model.pos_emb.embed(model.tok_emb(idx) * model.config.embed_scale, torch.arange(8))


def test_stack_options_off_are_the_plain_stack_and_on_leave_every_other_weight_alone():
    plain, idx = _stack_lm(), _idx()
    assert plain.value_embed_weights is None and plain.skip_weights is None
    assert not any("value_embed" in k or "skip" in k for k in plain.state_dict())
    x = _embed(plain, idx)
    for block in plain.blocks:  # block after block, nothing added between them
        x = block(x, is_causal=True, pos_emb=plain.pos_emb)
    assert torch.equal(plain(idx), plain.lm_head(plain.norm_f(x)))  # bit for bit
    both = _stack_lm(value_embeds=1, unet_skips=True)
    shared = dict(plain.named_parameters())
    extra = {n for n, _ in both.named_parameters()} - set(shared)
    assert extra == {"value_embeds.0.weight", "value_embed_weights", "skip_weights"}
    for name, p in both.named_parameters():
        if name in shared:
            assert torch.equal(p, shared[name]), name


def test_value_embeds_add_lambda_times_the_tables_lookup_to_the_mirrored_layers_values():
    model, idx = _stack_lm(value_embeds=1), _idx()
    (table,) = model.value_embeds
    assert tuple(table.weight.shape) == (23, 2 * 4)  # V x (n_kv_heads * head_dim): GQA's width
    assert model.value_embed_layers == [0, 3]  # table 0 feeds layer 0 and its mirror L-1-0
    torch.testing.assert_close(model.value_embed_weights, torch.full((2,), 0.5))
    with torch.no_grad():
        model.value_embed_weights.copy_(torch.tensor([0.5, -2.0]))  # tell the two layers apart
    # reference: the same weights without value embeddings, the lookup added to the V part of
    # each fused qkv projection's output by a hook
    ref = _stack_lm()
    ref.load_state_dict(model.state_dict(), strict=False)
    e = table(idx)  # (B, T, 8)

    def add_to_values(lam):
        return lambda m, args, out: out + F.pad(lam * e, (out.shape[-1] - e.shape[-1], 0))

    for i, lam in zip([0, 3], [0.5, -2.0]):
        ref.blocks[i].attn.qkv.register_forward_hook(add_to_values(lam))
    torch.testing.assert_close(model(idx), ref(idx), rtol=0, atol=1e-6)
    assert not torch.allclose(model(idx), _stack_lm()(idx), atol=1e-4)  # it does change them
    assert _stack_lm(n_layers=3, value_embeds=2).value_embed_layers == [0, 1, 2]


def test_unet_skips_add_the_first_halfs_outputs_to_the_mirrored_inputs_with_weight_one():
    model, idx = _stack_lm(unet_skips=True), _idx()
    torch.testing.assert_close(model.skip_weights, torch.ones(2))  # L // 2 pairs
    with torch.no_grad():
        model.skip_weights.copy_(torch.tensor([0.3, -0.7]))
    b, kw = model.blocks, dict(is_causal=True, pos_emb=model.pos_emb)
    o0 = b[0](_embed(model, idx), **kw)
    o1 = b[1](o0, **kw)
    o2 = b[2](o1 + -0.7 * o1, **kw)  # block 2 = L-1-1 gets block 1's output
    o3 = b[3](o2 + 0.3 * o0, **kw)  # block 3 = L-1-0 gets block 0's output
    torch.testing.assert_close(model(idx), model.lm_head(model.norm_f(o3)), rtol=0, atol=1e-6)
    odd = _stack_lm(n_layers=3, unet_skips=True)  # the middle block gets no skip
    b = odd.blocks
    o0 = b[0](_embed(odd, idx), **kw)
    o2 = b[2](b[1](o0, **kw) + o0, **kw)
    torch.testing.assert_close(odd(idx), odd.lm_head(odd.norm_f(o2)), rtol=0, atol=1e-6)


def test_stack_options_get_gradients_decode_like_the_full_forward_and_go_to_adamw():
    model, idx = _stack_lm(value_embeds=2, unet_skips=True), _idx()
    model.train()
    model(idx, targets=idx).backward()
    extra = [model.value_embeds[0].weight, model.value_embeds[1].weight]
    for p in [*extra, model.value_embed_weights, model.skip_weights]:
        assert p.grad is not None and p.grad.abs().sum() > 0
    # a row of a table a token never looked up gets no gradient; looked-up rows do
    unused = sorted(set(range(23)) - set(idx.flatten().tolist()))
    assert model.value_embeds[0].weight.grad[unused].abs().max() == 0
    model.eval()
    state, steps = model.start_decoding(2), []
    for t in range(8):  # one token at a time through the KV caches
        logits, state = model.decode_step(idx[:, t : t + 1], state)
        steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), model(idx), rtol=0, atol=1e-5)
    muon, adamw = muon_split(param_groups(model, 1.0), 0.1)
    in_muon = {n for n in muon["names"]}
    undecayed = {n for g in adamw if g["weight_decay"] == 0 for n in g["names"]}
    new = {"value_embeds.0.weight", "value_embeds.1.weight", "value_embed_weights", "skip_weights"}
    assert new <= undecayed and not new & in_muon


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(n_layers=4, value_embeds=3), "value_embeds"),  # more than ceil(L / 2) tables
        (dict(n_layers=3, value_embeds=-1), "value_embeds"),
        (dict(n_layers=2, value_embeds=1.5), "value_embeds"),
        (dict(n_layers=1, unet_skips=True), "unet_skips"),
    ],
)
def test_stack_option_errors_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig(**kw)


@pytest.mark.parametrize(
    "kw", [dict(value_embeds=1), dict(unet_skips=True), dict(token_shift=True)]
)
def test_hf_export_refuses_the_stack_options_by_name(tmp_path, kw):
    with pytest.raises(UserError, match=next(iter(kw))):
        to_hf(_lm(**kw), tmp_path / "hf")


# -- the token shift ------------------------------------------------------------------------------


def _shifted(seed: int = 0, **kw) -> DecoderLM:
    """A token-shift LM whose μ is not zero (random per channel)."""
    model = _stack_lm(token_shift=True, **kw)
    with torch.no_grad():
        model.shift_mix.copy_(torch.randn(16, generator=torch.Generator().manual_seed(seed)))
    return model


def test_token_shift_adds_mu_times_the_previous_tokens_embedding_and_starts_as_the_plain_model():
    plain, idx = _stack_lm(), _idx()
    fresh = _stack_lm(token_shift=True)
    torch.testing.assert_close(fresh.shift_mix, torch.zeros(16))  # μ = 0: the plain model
    for name, p in plain.named_parameters():  # and every other weight as without it
        torch.testing.assert_close(dict(fresh.named_parameters())[name], p, rtol=0, atol=0)
    assert torch.equal(fresh(idx), plain(idx))
    model = _shifted()
    e = model.tok_emb(idx)  # (B, T, C)
    mu = model.shift_mix
    # by hand, position by position: e_0 alone, then e_t + μ ⊙ e_{t-1}
    x = torch.stack([e[:, 0], *(e[:, t] + mu * e[:, t - 1] for t in range(1, 8))], dim=1)
    x = model.pos_emb.embed(x * model.config.embed_scale, torch.arange(8))
    for block in model.blocks:
        x = block(x, is_causal=True, pos_emb=model.pos_emb)
    torch.testing.assert_close(model(idx), model.lm_head(model.norm_f(x)), rtol=0, atol=1e-6)
    # causal still: a token moves only its own logits and later ones, its successor's included
    other = idx.clone()
    other[:, 4] = (other[:, 4] + 1) % 23
    diff = (model(other) - model(idx)).abs().amax(dim=(0, 2))  # (T,)
    assert diff[:4].max() == 0 and diff[4:].min() > 0


@pytest.mark.parametrize("static", [False, True])
@torch.no_grad()
def test_token_shift_decodes_padded_cropped_and_sliding_like_the_full_forward(static):
    model, idx = _shifted(), _idx()
    caches = model.make_caches(2, 8, static=static)
    assert len(caches) == len(model.blocks) + 1  # one per block, then the embeddings
    state, steps = model.start_decoding(2, 8, static=static), []
    logits, state = model.decode_step(idx[:, :3], state)  # a prompt, then one at a time
    steps.append(logits)
    for t in range(3, 8):
        logits, state = model.decode_step(idx[:, t : t + 1], state)
        steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), model(idx)[:, 2:], rtol=0, atol=1e-5)
    # rolled back (speculative decoding's crop) and fed again: as a fresh run of the same tokens
    for cache in state.caches:
        cache.crop(5)
    if static:
        state.mask[:, 5:] = False
    else:
        state.mask = state.mask[:, :5]
    nxt = torch.tensor([[4, 7], [1, 2]])
    got, _ = model.decode_step(nxt, state)
    want = model(torch.cat([idx[:, :5], nxt], dim=1))[:, -1]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # a left-padded row: its first real token has no predecessor, as the row alone
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), idx[1:, :5]], dim=1)
    mask = torch.arange(8)[None] >= 3
    state = model.start_decoding(1, 8, static=static)
    row, _ = model.decode_step(padded, state, attention_mask=mask)
    torch.testing.assert_close(row, model(idx[1:, :5])[:, -1], rtol=0, atol=1e-5)
    # past the context (8) the window slides: the cached run equals recomputing every window
    out = generate(model, idx[:1, :4], 12, temperature=0)
    assert torch.equal(out, generate(model, idx[:1, :4], 12, temperature=0, use_cache=False))


def test_token_shift_trains_its_mu_with_adamw_and_beams_reorder_its_cache():
    model, idx = _shifted(), _idx()
    model.train()
    model(idx, targets=idx).backward()
    assert model.shift_mix.grad is not None and model.shift_mix.grad.abs().sum() > 0
    muon, adamw = muon_split(param_groups(model, 1.0), 0.1)
    undecayed = {n for g in adamw if g["weight_decay"] == 0 for n in g["names"]}
    assert "shift_mix" in undecayed and "shift_mix" not in muon["names"]
    model.eval()
    with torch.no_grad():  # beam search's reorder takes every cache, the token shift's too
        state = model.start_decoding(2, 8)
        model.decode_step(idx[:, :4], state)
        rows = torch.tensor([1, 0, 1])
        state = state.reorder(rows)
        nxt = torch.tensor([[3], [5], [9]])
        got, _ = model.decode_step(nxt, state)
        want = model(torch.cat([idx[rows, :4], nxt], dim=1))[:, -1]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

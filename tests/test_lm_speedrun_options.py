"""The speedrun block options of the decoder LM: ReLU², zero-initialised projections, soft cap.

Each option changes what it names and nothing else (same seed, same other weights)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import ModelConfig
from attnlab.config.base import ConfigError
from attnlab.errors import UserError
from attnlab.interop import to_hf
from attnlab.layers.ffn import MLP
from attnlab.models.lm import DecoderLM

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

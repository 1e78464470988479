"""The encoder-only model (``EncoderMLM``) and the tokenizers' special tokens.

What is proved: attention is bidirectional and never looks at padding (weights from
``need_weights`` equal the softmax recomputed from each layer's own projections, with zeros on
padded keys); real tokens' outputs do not depend on what the padding holds; token types matter;
every preset runs forward and backward with a gradient for every parameter; the specials get the
ids after the plain vocabulary and survive a save/load, while plain tokenizers stay as they were.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from tokenizers import Tokenizer

from attnlab.config import EncoderConfig
from attnlab.data.tokenizers import (
    SPECIAL_TOKENS,
    CharTokenizer,
    TokenizerWithSpecials,
    load_tokenizer,
    train_tokenizer,
)
from attnlab.models.encoder import EncoderMLM
from attnlab.models.registry import build_model


def tiny(**overrides) -> EncoderMLM:
    return EncoderMLM(
        EncoderConfig.preset("tiny", vocab_size=50, max_seq_len=16, **overrides)
    ).eval()


def padded_batch():
    ids = torch.randint(0, 50, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 7:] = False
    mask[2, 3:] = False
    return ids, mask


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_need_weights_equal_the_softmax_recomputed_bidirectional_and_padding_masked(norm_position):
    model = tiny(norm_position=norm_position, n_layers=3)
    ids, mask = padded_batch()
    inputs = []  # each block's input, read with hooks (the model keeps no state)
    hooks = [b.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in model.blocks]
    with torch.no_grad():
        logits, weights = model(ids, attention_mask=mask, need_weights=True)
        plain = model(ids, attention_mask=mask)
    for h in hooks:
        h.remove()
    torch.testing.assert_close(logits, plain)  # weights on: the same logits
    assert len(weights) == 3
    H, D = model.config.n_heads, model.config.head_dim
    for block, x, w in zip(model.blocks, inputs, weights):
        h = block.norm1(x) if norm_position == "pre" else x
        q, k, _ = block.attn.qkv(h).split(H * D, dim=-1)
        q = q.view(3, 10, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(3, 10, H, D).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(D)  # (B, H, T, T)
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        torch.testing.assert_close(w, scores.softmax(-1), atol=1e-6, rtol=1e-5)
        assert (w[1, :, :, 7:] == 0).all() and (w[2, :, :, 3:] == 0).all()
        later = torch.ones(10, 10, dtype=torch.bool).triu(1)
        assert (w[0][:, later] > 0).all()  # every query sees later keys: no causal mask


def test_real_tokens_do_not_depend_on_padding_and_see_both_sides():
    model = tiny()
    ids, mask = padded_batch()
    other = ids.clone()
    other[2, 3:] = torch.randint(0, 50, (7,))  # change only the padding of row 2
    with torch.no_grad():
        a = model(ids, mask)
        b = model(other, mask)
        alone = model(ids[2:, :3])  # row 2's real tokens without any padding
        torch.testing.assert_close(a[2, :3], b[2, :3])
        torch.testing.assert_close(a[2:, :3], alone, atol=1e-5, rtol=1e-5)
        later = ids.clone()
        later[0, 9] = (later[0, 9] + 1) % 50  # the last token changes the first one's output
        assert not torch.allclose(model(later)[0, 0], model(ids)[0, 0])


def test_token_types_and_bad_inputs():
    model = tiny()
    ids = torch.randint(0, 50, (2, 8))
    with torch.no_grad():
        zeros = model(ids)
        torch.testing.assert_close(model(ids, token_type_ids=torch.zeros_like(ids)), zeros)
        assert not torch.allclose(model(ids, token_type_ids=torch.ones_like(ids)), zeros)
    with pytest.raises(ValueError, match="token_type_ids must lie in"):
        model(ids, token_type_ids=torch.full_like(ids, 2))
    with pytest.raises(ValueError, match="exceed the encoder's context max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask must be"):
        model(ids, attention_mask=torch.ones(2, 7))


def test_the_mlm_decoder_is_tied_and_the_kind_is_registered():
    model = build_model("encoder_mlm", EncoderConfig.preset("tiny").to_dict())
    assert model.head.decoder.weight is model.tok_emb.weight
    untied = tiny(tie_embeddings=False)
    assert untied.head.decoder.weight is not untied.tok_emb.weight
    assert isinstance(model.norm_f, torch.nn.Identity) and not isinstance(
        tiny(norm_position="pre").norm_f, torch.nn.Identity
    )


_SMALL = [p for p in EncoderConfig.presets() if not p.startswith("bert-")]
_BERT = [p for p in EncoderConfig.presets() if p.startswith("bert-")]


def _sweep(name: str, **overrides) -> None:
    cfg = EncoderConfig.preset(name, **overrides)
    model = EncoderMLM(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    logits = model(ids, mask, torch.randint(0, cfg.type_vocab_size, (2, 12)))
    assert logits.shape == (2, 12, cfg.vocab_size) and torch.isfinite(logits).all()
    logits[mask].logsumexp(-1).mean().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


@pytest.mark.parametrize("name", _SMALL)
def test_every_small_preset_runs_forward_and_backward(name):
    _sweep(name)


@pytest.mark.parametrize("name", _BERT)
def test_every_bert_sized_preset_runs_forward_and_backward_at_one_layer(name):
    """At the preset's width, vocabulary and positions, one layer (the count of all of them is
    checked below without allocating anything)."""
    _sweep(name, n_layers=1)


#: the BERT papers' published sizes (Devlin et al. 2019; Turc et al. 2019), in millions
_PUBLISHED = {"bert-mini": 11.3, "bert-small": 29.1, "bert-base": 110, "bert-large": 340}


@pytest.mark.parametrize("name", _BERT)
def test_every_bert_sized_preset_has_the_size_of_huggingface_bert(name):
    """Parameters counted on the ``meta`` device (nothing allocated): exactly those of
    transformers' BertForMaskedLM of the same sizes, and the published size within 2 %."""
    import transformers  # heavy optional reference (the test extra): this test only

    cfg = EncoderConfig.preset(name)
    hf_cfg = transformers.BertConfig(
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.ffn_hidden,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_seq_len,
        type_vocab_size=cfg.type_vocab_size,
    )
    with torch.device("meta"):
        hf = transformers.BertForMaskedLM(hf_cfg)
        ours = EncoderMLM(cfg)
    n_hf = sum(p.numel() for p in hf.parameters())  # parameters() yields a tied one once
    assert ours.num_parameters() == n_hf
    assert n_hf / 1e6 == pytest.approx(_PUBLISHED[name], rel=0.02)
    if name == "bert-base":
        assert transformers.BertConfig().to_dict() == hf_cfg.to_dict()  # BERT-base defaults


# ---- tokenizers ---------------------------------------------------------------------------------


def test_char_specials_come_after_the_characters_and_round_trip(tmp_path):
    plain = CharTokenizer.train("hello world")
    tok = train_tokenizer("char", "hello world", specials=True)
    assert isinstance(tok, TokenizerWithSpecials) and tok.vocab_size == plain.vocab_size + 4
    assert [tok.special_ids[s] for s in SPECIAL_TOKENS] == list(range(8, 12))
    assert tok.encode("hello") == plain.encode("hello")  # plain text: the same ids
    ids = tok.encode("he[MASK]lo [SEP]")
    assert ids == [*plain.encode("he"), tok.mask_id, *plain.encode("lo "), tok.sep_id]
    assert tok.decode(ids) == "he[MASK]lo [SEP]"
    tok.save(tmp_path)
    back = load_tokenizer(tmp_path)
    assert isinstance(back, TokenizerWithSpecials) and back.to_json() == tok.to_json()
    assert json.loads((tmp_path / "tokenizer.json").read_text())["specials"] == list(SPECIAL_TOKENS)
    plain.save(tmp_path)  # a plain tokenizer's file is as before: no specials key
    assert "specials" not in json.loads((tmp_path / "tokenizer.json").read_text())
    assert isinstance(load_tokenizer(tmp_path), CharTokenizer)


def test_bpe_specials_are_added_tokens_a_huggingface_tokenizer_reads(tmp_path):
    text = "def function(x):\n    return x + 1\n" * 50
    plain = train_tokenizer("bpe", text, 300)
    tok = TokenizerWithSpecials(plain)
    assert tok.encode("return x") == plain.encode("return x")
    ids = tok.encode("def [MASK](x)")
    assert tok.mask_id in ids and tok.decode(ids) == "def [MASK](x)"
    tok.save(tmp_path)
    back = load_tokenizer(tmp_path)
    assert isinstance(back, TokenizerWithSpecials)
    assert back.vocab_size == tok.vocab_size and back.base.to_json() == plain.to_json()
    hf = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert hf.encode("def [MASK](x)").ids == ids  # the same ids in Hugging Face tokenizers

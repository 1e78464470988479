"""Hugging Face BERT <-> attnlab's encoder, against live ``transformers`` models.

Each reference is built offline from a tiny config with every parameter re-randomised (HF's init
zeroes biases and sets LayerNorms to 1, which would hide a mapping bug), saved with
``save_pretrained`` (which leaves the tied decoder out) and loaded with ``from_hf``. Logits and
features must agree within 1e-4 on a padded batch with token types, compared on real tokens; a
folder written by ``to_hf`` must load in ``BertForMaskedLM.from_pretrained`` to the same logits.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import attnlab
from attnlab.cli import main
from attnlab.config import EncoderConfig
from attnlab.errors import UserError
from attnlab.interop import from_hf, to_hf
from attnlab.interop.hf.bert import bert_keymap, bert_to_hf
from attnlab.interop.keymap import Concat, KeyMap, Rule
from attnlab.models.encoder import EncoderMLM
from test_interop_hf import randomise as randomise_hf

V, T = 97, 12
ATOL = 1e-4


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random: N(0, 0.05), LayerNorm weights 1 + 0.1·N(0, 1)."""
    return randomise_hf(model, seed, norms=("LayerNorm",))


def build_hf(cls=transformers.BertForMaskedLM, **overrides) -> torch.nn.Module:
    kw = dict(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        type_vocab_size=3,
    )
    cfg = transformers.BertConfig(**{**kw, **overrides}, attn_implementation="eager")
    return randomise(cls(cfg)).eval()


def batch(seed: int = 1):
    """Token ids, a right-padded attention mask (rows of 12, 8 and 5 real tokens), token types."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (3, T), generator=gen)
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    types = torch.randint(0, 3, (3, T), generator=gen)
    return ids, mask, types


def close_on_real_tokens(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    diff = float((a - b)[mask.bool()].abs().max())
    assert diff < ATOL, diff
    return diff


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_bert_for_masked_lm_logits_equal_on_a_padded_batch_with_token_types(tmp_path, act):
    hf = build_hf(hidden_act=act)
    hf.save_pretrained(tmp_path)
    model = from_hf(tmp_path)
    assert model.kind == "encoder_mlm" and model.config.norm_eps == 1e-12
    assert model.config.activation == ("gelu" if act == "gelu" else "gelu_tanh")
    assert model.head.decoder.weight is model.tok_emb.weight  # tied, as in BERT
    ids, mask, types = batch()
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        got = model(ids, mask.bool(), types)
    close_on_real_tokens(want, got, mask)


def test_default_token_types_are_zeros(tmp_path):
    hf = build_hf()
    hf.save_pretrained(tmp_path)
    model = from_hf(tmp_path)
    ids, mask, _ = batch(2)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        got = model(ids, attention_mask=mask)
    close_on_real_tokens(want, got, mask)


def test_bert_model_features_equal_last_hidden_state(tmp_path):
    hf = build_hf(transformers.BertModel)
    hf.save_pretrained(tmp_path)  # with its pooler, which attnlab skips
    model = from_hf(tmp_path)
    ids, mask, types = batch(3)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        got = model.encode(ids, mask, types)
    close_on_real_tokens(want, got, mask)


def test_to_hf_round_trip_loads_in_transformers_with_the_same_logits(tmp_path):
    hf = build_hf()
    hf.save_pretrained(tmp_path / "src")
    model = from_hf(tmp_path / "src")
    to_hf(model, tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["BertForMaskedLM"] and cfg["layer_norm_eps"] == 1e-12
    back = transformers.BertForMaskedLM.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    ).eval()
    assert back.cls.predictions.decoder.weight is back.bert.embeddings.word_embeddings.weight
    ref = hf.state_dict()
    for name, t in back.state_dict().items():
        torch.testing.assert_close(t, ref[name], rtol=0, atol=0, msg=name)
    ids, mask, types = batch(4)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        got = back(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    close_on_real_tokens(want, got, mask)


def test_an_attnlab_encoder_exports_and_reads_back_exactly(tmp_path):
    torch.manual_seed(0)
    model = randomise(EncoderMLM(EncoderConfig.preset("tiny", vocab_size=V, max_seq_len=32)))
    model.eval()
    to_hf(model, tmp_path)
    hf = transformers.BertForMaskedLM.from_pretrained(tmp_path, attn_implementation="eager")
    feats = transformers.BertModel.from_pretrained(tmp_path, attn_implementation="eager")
    ids, mask, _ = batch(5)
    types = torch.randint(0, 2, ids.shape)
    with torch.no_grad():
        close_on_real_tokens(
            hf.eval()(input_ids=ids, attention_mask=mask, token_type_ids=types).logits,
            model(ids, mask, types),
            mask,
        )
        close_on_real_tokens(
            feats.eval()(
                input_ids=ids, attention_mask=mask, token_type_ids=types
            ).last_hidden_state,
            model.encode(ids, mask, types),
            mask,
        )
    again = from_hf(tmp_path)
    for name, t in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], t, rtol=0, atol=0, msg=name)


def test_old_names_buffers_pooler_and_next_sentence_head_are_read(tmp_path):
    """A checkpoint as the original BERT release had it: LayerNorm.gamma/beta, the tied decoder
    stored, position_ids saved, a pooler and the next-sentence head (BertForPreTraining)."""
    hf = build_hf()
    hf.save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    old = {
        n.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): t
        for n, t in sd.items()
    }
    old["cls.predictions.decoder.weight"] = sd["bert.embeddings.word_embeddings.weight"].clone()
    old["bert.embeddings.position_ids"] = torch.arange(32)[None]
    old["bert.pooler.dense.weight"] = torch.zeros(32, 32)
    old["bert.pooler.dense.bias"] = torch.zeros(32)
    old["cls.seq_relationship.weight"] = torch.zeros(2, 32)
    old["cls.seq_relationship.bias"] = torch.zeros(2)
    save_file(old, tmp_path / "model.safetensors")
    model = from_hf(tmp_path)
    ids, mask, types = batch(6)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        close_on_real_tokens(want, model(ids, mask, types), mask)


def test_a_misshapen_tensor_is_named_with_both_shapes(tmp_path):
    build_hf().save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    sd["cls.predictions.bias"] = torch.zeros(V + 1)
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(
        UserError,
        match=r"cls\.predictions\.bias has shape \[98\] in the file but the config implies \[97\]",
    ):
        from_hf(tmp_path)


def test_a_missing_tensor_and_an_unknown_head_are_refused(tmp_path):
    build_hf().save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    del sd["bert.encoder.layer.1.attention.self.key.bias"]
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(
        UserError,
        match=r"missing tensors \(1\): bert\.encoder\.layer\.1\.attention\.self\.key\.bias",
    ):
        from_hf(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["BertForSequenceClassification"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        UserError, match="unsupported BERT architecture BertForSequenceClassification"
    ):
        from_hf(tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(norm_position="pre"), "norm_position='post'"),
        (dict(position="rope"), "position='learned'"),
        (dict(n_kv_heads=2), "n_kv_heads = n_heads"),
    ],
)
def test_an_encoder_bert_cannot_express_is_refused_by_name(tmp_path, change, message):
    model = EncoderMLM(EncoderConfig.preset("tiny", **change))
    with pytest.raises(UserError, match=message):
        to_hf(model, tmp_path)


# ---- the key map itself -------------------------------------------------------------------------


def test_the_key_map_is_its_own_inverse_for_both_architectures():
    model = EncoderMLM(EncoderConfig.preset("tiny"))
    sd = model.state_dict()
    keymap = bert_keymap(model.config)
    back = keymap.to_ours(keymap.to_theirs(sd))
    assert set(back) == set(sd)
    for name, t in sd.items():
        assert torch.equal(back[name], t), name
    cfg, features = bert_to_hf(model, "BertModel")
    assert cfg["architectures"] == ["BertModel"]
    assert not any(n.startswith(("cls.", "bert.")) for n in features)
    assert set(bert_keymap(model.config, "BertModel").to_ours(features)) == {
        n for n in sd if not n.startswith("head.")
    }


def test_a_key_map_refuses_tensors_no_rule_claims_and_incomplete_rules():
    keymap = KeyMap([Rule("qkv.{i}", ("q.{i}", "k.{i}", "v.{i}"), Concat(dim=0))])
    q, k, v = torch.zeros(2, 3), torch.ones(2, 3), torch.full((2, 3), 2.0)
    ours = keymap.to_ours({"q.0": q, "k.0": k, "v.0": v})
    assert torch.equal(ours["qkv.0"], torch.cat([q, k, v]))
    theirs = keymap.to_theirs(ours)
    assert all(torch.equal(theirs[n], t) for n, t in {"q.0": q, "k.0": k, "v.0": v}.items())
    with pytest.raises(UserError, match=r"missing tensors: v\.0"):
        keymap.to_ours({"q.0": q, "k.0": k})
    with pytest.raises(UserError, match=r"no rule maps them: w\.0"):
        keymap.to_ours({"q.0": q, "k.0": k, "v.0": v, "w.0": v})
    with pytest.raises(ValueError, match="same placeholders"):
        KeyMap([Rule("a.{i}", "b.{j}")])


# ---- attnlab convert ----------------------------------------------------------------------------


def test_convert_a_bert_folder_to_a_run_and_an_mlm_run_back(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    hf = build_hf()
    hf.save_pretrained(tmp_path / "hf")
    run = tmp_path / "run"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(run)]) == 0
    model, _ = attnlab.load(run)
    ids, mask, types = batch(7)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        close_on_real_tokens(want, model(ids, mask, types), mask)
    mlm = tmp_path / "mlm"
    args = ["--set", "d_model=32", "--seq-len", "16", "--max-chars", "20000", "--steps", "1"]
    assert main(["train", "mlm", *args, "--no-progress", "--out", str(mlm)]) == 0
    capsys.readouterr()
    assert main(["convert", "--to-hf", str(mlm), "--out", str(tmp_path / "back")]) == 0
    assert "with its character tokenizer" in capsys.readouterr().out
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")  # (issue 26)
    assert auto.mask_token == "[MASK]" and auto.mask_token_id == attnlab.load(mlm)[1].mask_id
    back = transformers.BertForMaskedLM.from_pretrained(tmp_path / "back").eval()
    mine, _ = attnlab.load(mlm)
    ids = torch.randint(0, mine.config.vocab_size, (2, 16))
    with torch.no_grad():
        close_on_real_tokens(back(input_ids=ids).logits, mine(ids), torch.ones(2, 16))

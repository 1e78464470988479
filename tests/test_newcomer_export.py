"""Issue 26, item 1: ``convert --to-hf`` exports every LM run's tokenizer (the character one as a
``tokenizers`` WordLevel JSON), ``AutoTokenizer`` opens it, and the round trip back through
``convert --from-hf`` gives a run that ``generate`` and ``eval`` accept with the same results.

On the bundled first-release runs (a char-level GPT-2 and a byte-level BPE Llama): nothing is
trained here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from attnlab.cli import main
from attnlab.data.tokenizers import (
    SPECIAL_TOKENS,
    CharTokenizer,
    TokenizerWithSpecials,
    as_hf_tokenizer,
    load_tokenizer,
    tokenizer_from_json,
)
from attnlab.interop.hf.checkpoint import tokenizer_config, tokenizer_json

RUNS = Path(__file__).parent / "fixtures" / "release_0_1" / "runs"
TEXT = "The return value of f(x) is 'é'?\n  def g():"


def _out(capsys, argv: list[str]) -> str:
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.mark.parametrize("name", ["lm_gpt2", "lm_llama"])  # char tokenizer, byte-level BPE
def test_the_round_trip_through_a_hugging_face_folder(name, tmp_path, capsys, monkeypatch):
    from transformers import AutoTokenizer  # heavy optional reference (the test extra)

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    run, hf, back = tmp_path / "run", tmp_path / "hf", tmp_path / "back"
    shutil.copytree(RUNS / name, run)
    said = _out(capsys, ["convert", "--to-hf", str(run), "--out", str(hf)])
    assert "with its" in said and "tokenizer" in said
    assert (hf / "tokenizer.json").exists() and (hf / "tokenizer_config.json").exists()

    ours = load_tokenizer(run)
    auto = AutoTokenizer.from_pretrained(hf)
    text = (
        TEXT if not isinstance(ours, CharTokenizer) else "".join(c for c in TEXT if c in ours.stoi)
    )
    ids = ours.encode(text)
    assert auto(text, add_special_tokens=False)["input_ids"] == ids
    assert auto.decode(ids) == ours.decode(ids) == text

    greedy = ["--prompt", "The ", "-n", "12", "--temperature", "0"]
    expected = _out(capsys, ["generate", str(run), *greedy])
    assert _out(capsys, ["generate", "--from-hf", str(hf), *greedy]) == expected
    _out(capsys, ["convert", "--from-hf", str(hf), "--out", str(back)])
    assert type(load_tokenizer(back)) is type(ours)
    assert _out(capsys, ["generate", str(back), *greedy]) == expected
    scores = [  # (the checkpoint named at the end differs: the export keeps no step)
        _out(capsys, ["eval", str(d), "--max-batches", "1"]).split(":", 1)[1].split(";")[0]
        for d in (run, back)
    ]
    assert scores[0] == scores[1] and "val loss" in scores[0]  # the task came along


def test_a_character_tokenizer_with_specials_opens_in_auto_tokenizer(tmp_path):
    from transformers import AutoTokenizer  # heavy optional reference (the test extra)

    tok = TokenizerWithSpecials(CharTokenizer.train("the cat sat\n on a mat"))
    text = tokenizer_json(tok)
    (tmp_path / "tokenizer.json").write_text(text)

    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(text)))
    auto = AutoTokenizer.from_pretrained(tmp_path)
    masked = "the [MASK]at sat\n"
    assert auto(masked, add_special_tokens=False)["input_ids"] == tok.encode(masked)
    assert auto.mask_token == "[MASK]" and auto.mask_token_id == tok.mask_id
    again = tokenizer_from_json(text)  # read back as attnlab's character tokenizer
    assert isinstance(again, TokenizerWithSpecials) and again.base.chars == tok.base.chars
    assert (
        again.special_ids
        == tok.special_ids
        == {t: tok.base.vocab_size + i for i, t in enumerate(SPECIAL_TOKENS)}
    )


def test_other_tokenizers_json_stay_what_they_are():
    """A WordLevel tokenizer over words (not the character form) is not read as characters."""
    hf = Tokenizer(models.WordLevel({"the": 0, "cat": 1, "[UNK]": 2}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = tokenizer_from_json(hf.to_str())
    assert not isinstance(tok, CharTokenizer) and tok.encode("the cat") == [0, 1]
    char = CharTokenizer.train("ab c")
    assert tokenizer_from_json(as_hf_tokenizer(char).to_str()).chars == char.chars

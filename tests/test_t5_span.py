"""T5's span corruption: the segmentation, the corrupted pairs (checked by rebuilding the window
from them), the task's batches, the sentinels in the tokenizer, and ``attnlab train t5-span`` /
``fill-spans`` / ``eval`` end to end (bad input included)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.config.t5 import SpanTaskConfig
from attnlab.data.tokenizers import (
    ByteBPETokenizer,
    CharTokenizer,
    TokenizerWithSpecials,
    t5_specials,
    tokenizer_from_json,
)
from attnlab.errors import UserError
from attnlab.explore import ExploreInput, Explorer
from attnlab.runs import load
from attnlab.tasks.t5_span import SpanCorruptionTask, corrupt_spans, random_segmentation

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))


def test_segmentations_are_non_empty_and_uniform_over_the_cuts():
    rng = np.random.default_rng(0)
    # 5 items in 2 segments: the cut falls after item 1, 2, 3 or 4, each with probability 1/4
    firsts = Counter(int(random_segmentation(5, 2, rng)[0]) for _ in range(4000))
    assert set(firsts) == {1, 2, 3, 4}
    assert all(abs(n / 4000 - 0.25) < 0.03 for n in firsts.values())
    for _ in range(50):
        parts = random_segmentation(20, 6, rng)
        assert len(parts) == 6 and parts.min() >= 1 and parts.sum() == 20


def test_input_and_target_rebuild_the_window_and_hide_the_stated_amount():
    rng = np.random.default_rng(1)
    sentinels, eos = [100 + i for i in range(8)], 99
    for _ in range(30):
        window = rng.integers(0, 50, size=40)
        src, tgt = corrupt_spans(
            window, rng, n_noise=6, n_spans=2, sentinel_ids=sentinels, eos_id=eos
        )
        assert src[-1] == tgt[-1] == eos
        assert len(src) == 40 - 6 + 2 + 1 and len(tgt) == 6 + 2 + 1
        assert [t for t in tgt if t >= 100] == [t for t in src if t >= 100] == [100, 101]
        # put each span back where its sentinel stands
        spans, current = {}, None
        for t in tgt[:-1]:
            if t in sentinels:
                current = t
                spans[t] = []
            else:
                spans[current].append(t)
        assert all(spans.values())  # no empty span
        rebuilt = [x for t in src[:-1] for x in (spans[t] if t in sentinels else [t])]
        assert rebuilt == window.tolist()
        # spans are separated by kept tokens: two sentinels are never neighbours in the input
        assert all(not (a >= 100 and b >= 100) for a, b in zip(src, src[1:]))


def test_task_batches_are_seq2seq_batches_deterministic_and_split_over_ranks(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    cfg = SpanTaskConfig(data=str(corpus), seq_len=30, seed=4, n_sentinels=4)
    task = SpanCorruptionTask.build(cfg)
    tok = task.tokenizer
    assert tok.specials == t5_specials(4) and tok.vocab_size == tok.base.vocab_size + 6
    b = task.get_batch("train", 7, 6)
    assert b.src.shape == (6, task.max_src_len) and b.tgt_out.shape == (6, task.max_tgt_len)
    assert (b.tgt_in[:, 0] == tok.special_ids["<pad>"]).all()
    assert torch.equal(b.tgt_in[:, 1:], b.tgt_out[:, :-1]) and b.src_mask.all()
    again = task.get_batch("train", 7, 6)
    assert torch.equal(again.src, b.src) and torch.equal(again.tgt_out, b.tgt_out)
    assert not torch.equal(task.get_batch("train", 8, 6).src, b.src)
    halves = [task.get_batch("train", 7, 6, rank=r, world=2) for r in (0, 1)]
    assert torch.equal(torch.cat([h.src for h in halves]), b.src)
    # the text the input shows, sentinels read back as themselves
    text = tok.decode(b.src[0].tolist())
    assert "<extra_id_0>" in text and text.endswith("</s>")
    assert tok.encode(text) == b.src[0].tolist()


@pytest.mark.parametrize("base", ["char", "bpe"])
def test_sentinels_survive_the_tokenizer_file(base):
    plain = CharTokenizer.train(TEXT) if base == "char" else ByteBPETokenizer.train(TEXT, 300)
    tok = TokenizerWithSpecials(plain, t5_specials(12))
    back = tokenizer_from_json(tok.to_json())
    assert isinstance(back, TokenizerWithSpecials) and back.specials == tok.specials
    ids = back.encode("the <extra_id_11> fox<extra_id_1>")  # <extra_id_11> is one token
    assert ids.count(back.special_ids["<extra_id_11>"]) == 1
    assert ids.count(back.special_ids["<extra_id_1>"]) == 1
    assert back.decode(ids) == "the <extra_id_11> fox<extra_id_1>"


def test_bad_span_settings_name_the_value():
    with pytest.raises(UserError, match="noise_density must be in"):
        SpanTaskConfig(noise_density=0.0)
    with pytest.raises(UserError, match="mean_span_length must be at least 1"):
        SpanTaskConfig(mean_span_length=0.5)
    with pytest.raises(UserError, match="n_sentinels .2. is below the 10 spans"):
        SpanTaskConfig(seq_len=200, n_sentinels=2)


def _records(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_t5_span_fill_spans_eval_and_config_reproduces(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    a, b = tmp_path / "a", tmp_path / "b"
    args = ["--data", str(corpus), "--preset", "tiny", "--seq-len", "24", "--steps", "4"]
    args += ["--batch-size", "4", "--eval-every", "2", "--eval-batches", "1", "--no-progress"]
    assert main(["train", "t5-span", *args, "--out", str(a)]) == 0
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["kind"] == "t5_span" and cfg["task"]["type"] == "t5-span"
    m = cfg["model"]
    assert m["vocab_size"] == m["src_vocab_size"] == cfg["task"]["vocab_size"] + 2 + 32
    run = load(a)
    assert run.model.src_emb is run.model.tgt_emb  # one vocabulary, one embedding
    capsys.readouterr()
    assert main(["fill-spans", str(a), "the quick <extra_id_0> fox", "--beam", "2"]) == 0
    assert capsys.readouterr().out.strip() != ""
    # the explorer shows the span run with the translation views
    payload = Explorer(a).explain(ExploreInput(text="the quick <extra_id_0> fox"))
    assert [v["id"] for v in payload["views"]] == ["cross", "encoder", "decoder"]
    cross = payload["views"][0]
    assert "<extra_id_0>" in cross["keys"]
    assert cross["keys"][-1] == "</s>" and cross["score_label"] == "q·k"
    assert main(["eval", str(a)]) == 0
    assert "target-token accuracy" in capsys.readouterr().out
    assert (
        main(
            [
                "train",
                "t5-span",
                "--config",
                str(a / "config.json"),
                "--out",
                str(b),
                "--no-progress",
            ]
        )
        == 0
    )
    assert [r.get("loss") for r in _records(a)] == [r.get("loss") for r in _records(b)]
    capsys.readouterr()
    assert main(["fill-spans", str(a), "no gaps here"]) != 0
    assert "the text has no sentinel" in capsys.readouterr().err

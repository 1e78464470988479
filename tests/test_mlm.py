"""Masked-LM training (``attnlab.tasks.mlm``) and its commands (``train mlm``, ``fill-mask``).

What is proved: BERT's corruption statistics (15 % of the normal tokens chosen, 80/10/10
[MASK]/random/kept, specials never chosen or drawn); the loss is the cross-entropy at the chosen
positions only (computed by hand); batches depend only on (seed, split, step) and split over
ranks; training again from a run's config.json gives identical losses and weights; a trained run
puts the true character among its top 5 on held-out text far more often than chance; each bad
input is one 'attnlab: error:' line and exit status 2.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import attnlab
from attnlab.cli import main
from attnlab.config import EncoderConfig, MLMTaskConfig
from attnlab.experiments.bidirectional import (
    BidirectionalConfig,
    inside_word_positions,
    run_bidirectional,
)
from attnlab.models.encoder import EncoderMLM
from attnlab.tasks.lm import LMTask
from attnlab.tasks.mlm import IGNORE, MLMTask, fill_mask, mask_tokens


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))


def test_masking_statistics_over_many_sequences():
    n_normal, cls_id, sep_id, pad_id, mask_id = 100, 100, 101, 102, 103
    rng = np.random.default_rng(0)
    B, T = 4000, 64
    ids = rng.integers(0, n_normal, size=(B, T))
    ids[:, 0], ids[:, -1] = cls_id, sep_id
    lengths = rng.integers(10, T - 1, size=B)
    for b, n in enumerate(lengths):  # right padding of random length after [SEP]
        ids[b, n] = sep_id
        ids[b, n + 1 :] = pad_id
    normal = ids < n_normal
    inputs, targets = mask_tokens(ids, np.random.default_rng(1), n_normal=n_normal, mask_id=mask_id)
    chosen = targets != IGNORE
    # specials never chosen, never changed; targets are the original tokens
    assert not chosen[~normal].any() and (inputs[~normal] == ids[~normal]).all()
    assert (targets[chosen] == ids[chosen]).all()
    # 15 % of each row's normal tokens (rounded), hence 15 % overall
    per_row = chosen.sum(1)
    assert (per_row == np.maximum(np.rint(0.15 * normal.sum(1)), 1)).all()
    assert abs(chosen.sum() / normal.sum() - 0.15) < 0.005
    n = chosen.sum()
    masked = (inputs == mask_id) & chosen
    kept = (inputs == ids) & chosen
    random = chosen & ~masked & ~kept
    assert (inputs[~chosen] == ids[~chosen]).all()
    assert abs(masked.sum() / n - 0.8) < 0.01
    # a random draw equals the original token with probability 1/100: counted as kept
    assert abs(random.sum() / n - 0.1 * 0.99) < 0.01
    assert abs(kept.sum() / n - (0.1 + 0.1 * 0.01)) < 0.01
    assert (inputs[random] < n_normal).all()  # random tokens are never specials
    # deterministic in the generator
    again = mask_tokens(ids, np.random.default_rng(1), n_normal=n_normal, mask_id=mask_id)
    assert (again[0] == inputs).all() and (again[1] == targets).all()


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield MLMTask.build(MLMTaskConfig(data="pydoc", max_chars=30000, seq_len=24, seed=5))


def test_examples_are_cls_text_sep_and_the_loss_is_on_chosen_positions_only(task):
    tok = task.tokenizer
    inputs, targets = task.get_batch("train", 3, 8)
    assert inputs.shape == targets.shape == (8, 24)
    assert (inputs[:, 0] == tok.cls_id).all() and (inputs[:, -1] == tok.sep_id).all()
    assert (targets[:, [0, -1]] == IGNORE).all()
    assert ((targets != IGNORE).sum(1) == round(0.15 * 22)).all()
    model = EncoderMLM(EncoderConfig.preset("tiny", vocab_size=tok.vocab_size, max_seq_len=24))
    loss, metrics = task.loss(model, (inputs, targets))
    logits = model(inputs)  # (B, T, V)
    chosen = targets != IGNORE
    by_hand = F.cross_entropy(logits[chosen], targets[chosen])  # mean over the chosen only
    torch.testing.assert_close(loss, by_hand)
    acc = (logits[chosen].argmax(-1) == targets[chosen]).float().mean()
    assert metrics["acc"] == pytest.approx(float(acc))
    loss.backward()  # nothing flows from the unchosen positions' logits
    logits = model(inputs).detach().requires_grad_()
    F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE
    ).backward()
    assert (logits.grad[~chosen] == 0).all() and (logits.grad[chosen] != 0).any(-1).all()


def test_batches_depend_only_on_seed_split_and_step_and_split_over_ranks(task):
    a, b = task.get_batch("train", 7, 8), task.get_batch("train", 7, 8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(task.get_batch("train", 8, 8)[0], a[0])
    assert not torch.equal(task.get_batch("val", 7, 8)[0], a[0])
    shares = [task.get_batch("train", 7, 8, rank=r, world=2) for r in range(2)]
    assert torch.equal(torch.cat([s[0] for s in shares]), a[0])
    assert torch.equal(torch.cat([s[1] for s in shares]), a[1])
    first = list(task.eval_batches(4, 2))
    again = list(task.eval_batches(4, None))
    assert len(first) == 2 and len(again) > 2
    for x, y in zip(first, again):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])


def test_the_corpus_ids_are_the_language_models(task):
    """The plain tokenizer is the LM's: the corpus's ids (and their cache) are shared."""
    lm = LMTask.build(attnlab.config.LMTaskConfig(data="pydoc", max_chars=30000, seq_len=22))
    assert lm.tokenizer.to_json() == task.tokenizer.base.to_json()
    assert np.array_equal(np.asarray(lm.splits["train"]), np.asarray(task.splits["train"]))


# ---- the command line ---------------------------------------------------------------------------

TINY = ["--set", "d_model=32", "--set", "n_layers=1", "--seq-len", "24", "--batch-size", "8"]
TINY += ["--max-chars", "30000", "--no-progress"]


def _records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--tokenizer", "bpe", "--preset", "tiny-rope"]])
def test_training_again_from_a_runs_config_json_gives_identical_losses(tmp_path, extra):
    first, again = tmp_path / "first", tmp_path / "again"
    args = [*TINY, *extra, "--steps", "3", "--log-every", "1", "--eval-every", "2"]
    args += ["--eval-batches", "2", "--seed", "3", "--set", "task.mask_prob=0.2"]
    assert main(["train", "mlm", *args, "--out", str(first)]) == 0
    assert main(["train", "mlm", "--config", str(first / "config.json"), "--out", str(again)]) == 0
    losses = [
        [(r["step"], r.get("loss"), r.get("val_loss")) for r in _records(d)] for d in (first, again)
    ]
    assert losses[0] == losses[1] and len(losses[0]) == 5  # 3 steps + 2 validations
    a, b = (json.loads((d / "config.json").read_text()) for d in (first, again))
    assert a == b and a["kind"] == "encoder_mlm" and a["task"]["mask_prob"] == 0.2
    assert a["model"]["vocab_size"] == a["task"]["vocab_size"] + 4  # the specials
    for k, w in load_file(first / "model.safetensors").items():
        torch.testing.assert_close(load_file(again / "model.safetensors")[k], w, rtol=0, atol=0)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny character encoder trained for 250 steps on pydoc (about 15 s of one CPU core)."""
    run = tmp_path_factory.mktemp("mlm") / "run"
    args = ["--preset", "tiny-rope", "--seq-len", "32", "--batch-size", "32", "--lr", "3e-3"]
    args += ["--steps", "250", "--warmup", "25", "--eval-every", "250", "--max-chars", "60000"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNLAB_CACHE", str(run.parent / "cache"))
        assert main(["train", "mlm", *args, "--no-progress", "--out", str(run)]) == 0
        yield run


@pytest.mark.slow
def test_fill_mask_puts_the_true_character_in_its_top_5_far_more_often_than_chance(trained_run):
    model, tok = attnlab.load(trained_run)
    task = MLMTask.from_config(attnlab.runs.read_config(trained_run)["task"], tok)
    val = np.asarray(task.splits["val"])  # held-out text: never trained on
    rng = np.random.default_rng(0)
    n, hits = 300, 0
    for _ in range(n):
        start = int(rng.integers(0, len(val) - 30))
        text = tok.base.decode(val[start : start + 30])
        i = int(rng.integers(0, 30))
        masked = text[:i] + "[MASK]" + text[i + 1 :]
        (pred,) = fill_mask(model, tok, masked, top_k=5)
        assert pred.position == i and len(pred.candidates) == 5
        hits += text[i] in [c for c, _ in pred.candidates]
    chance = 5 / tok.base.vocab_size
    # measured: 0.627 after these 250 steps (chance 0.052; the 5 most frequent characters 0.37)
    assert hits / n > 8 * chance, (hits / n, chance)


@pytest.mark.slow
def test_fill_mask_prints_one_line_per_mask_and_eval_reports_accuracy(trained_run, capsys):
    assert main(["fill-mask", str(trained_run), "the [MASK]unction and its ar[MASK]uments"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("[MASK] 1 (token 4): ")
    assert lines[1].startswith("[MASK] 2 (token 23): ") and lines[1].count(" 0.") == 5
    probs = [float(x) for x in re.findall(r" ([01]\.\d{3})(?=  |$)", lines[0])]
    assert len(probs) == 5
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1
    assert main(["fill-mask", str(trained_run), "x[MASK]", "--top-k", "2"]) == 0
    assert capsys.readouterr().out.count(" 0.") == 2
    assert main(["eval", str(trained_run), "--max-batches", "2"]) == 0
    assert "masked-token accuracy" in capsys.readouterr().out


@pytest.mark.slow
def test_bad_fill_mask_inputs_are_one_clear_line(trained_run, tmp_path, capsys):
    lm = tmp_path / "lm"
    lm_args = ["--seq-len", "16", "--set", "d_model=32", "--max-chars", "20000", "--steps", "1"]
    assert main(["train", "lm", *lm_args, "--no-progress", "--out", str(lm)]) == 0
    capsys.readouterr()
    cases = [
        ([str(trained_run), "no mask here"], "the text has no [MASK]"),
        ([str(trained_run), "a [MASK] \u2603"], "not in this model's character vocabulary"),
        ([str(trained_run), "a" * 31 + "[MASK]"], "more than the model's context of 32 tokens"),
        ([str(lm), "a [MASK]"], "holds a 'decoder_lm' model; this needs one of ['encoder_mlm']"),
        ([str(trained_run), "a [MASK]", "--top-k", "0"], "--top-k must be at least 1"),
    ]
    for argv, message in cases:
        assert main(["fill-mask", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("attnlab: error: ") and message in err, err
        assert err.count("\n") == 1


def test_train_mlm_refusals(tmp_path, capsys):
    cases = [
        (["--set", "vocab_size=99"], "the vocabulary size comes from the tokenizer"),
        (["--set", "task.mask_prob=1.5"], "mask_prob must be in (0, 1]"),
        (["--seq-len", "2"], "seq_len must be at least 3"),
        (["--preset", "nope"], "unknown EncoderConfig preset 'nope'"),
    ]
    for extra, message in cases:
        assert (
            main(["train", "mlm", *TINY, *extra, "--steps", "1", "--out", str(tmp_path / "r")]) == 2
        )
        assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_inside_word_positions_have_letters_on_both_sides():
    chars = sorted(set("ab cd.\n"))
    text = "ab cd. abcd ab\ncd abc"
    ids = np.array([chars.index(c) for c in text])
    pos = inside_word_positions(ids, chars, margin=1, n=100, seed=0)
    assert pos.tolist() == [8, 9, 19] and [text[p - 1 : p + 2] for p in pos] == [
        "abc",
        "bcd",
        "abc",
    ]
    assert inside_word_positions(ids, chars, margin=2, n=100, seed=0).tolist() == [8, 9]
    assert len(inside_word_positions(ids, chars, margin=1, n=2, seed=0)) == 2


@pytest.mark.slow
def test_bidirectional_experiment_writes_a_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "bi"
    args = ["--steps", "4", "--d-model", "32", "--n-layers", "1", "--max-chars", "40000"]
    args += ["--n-eval", "100", "--device", "cpu", "--no-progress", "--out", str(out)]
    assert main(["experiment", "bidirectional", *args]) == 0
    printed = capsys.readouterr().out
    assert "| encoder (MLM, both sides) |" in printed
    assert "Undertrained" in printed and "--steps" in printed  # 4 steps learn nothing
    for name in ("table.md", "results.json", "bidirectional.png", "encoder", "decoder"):
        assert (out / name).exists(), name
    res = json.loads((out / "results.json").read_text())
    enc, dec = res["models"]["encoder"], res["models"]["decoder"]
    assert enc["steps"] == dec["steps"] == 4 and res["n_eval"] == 100
    assert 0 <= enc["top1"] <= enc["top5"] <= 1 and 0 <= dec["top1"] <= dec["top5"] <= 1
    assert main(["experiment", "bidirectional", *args]) == 2  # never clobbers results
    assert "pass --overwrite" in capsys.readouterr().err


@pytest.mark.slow
def test_bidirectional_encoder_reads_the_right_side_that_the_causal_lm_cannot(tmp_path):
    """Words "xyxy" of random letters: the second letter is given only by the fourth (right
    side), the third by the first (left side). A causal LM can get at most the third letters
    right (about half of the inside-word characters); an encoder that reads both sides can get
    both. Measured (1 layer × 32, mask 0.4): 300 steps, seeds 0 / 1: encoder 64 % / 86 %,
    decoder 46 % / 47 %, paired z 8.8 / 20.5; 500 steps, seed 0: encoder 100 %, decoder 52 %.
    The test (400 steps) asks for 10 points at z > 3."""
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    pairs = rng.choice(letters, size=(8000, 2))
    (tmp_path / "xyxy.txt").write_text(" ".join(x + y + x + y for x, y in pairs) + "\n")
    cfg = BidirectionalConfig(
        steps=400,
        data=str(tmp_path / "xyxy.txt"),
        seq_len=16,
        d_model=32,
        n_layers=1,
        n_heads=2,
        lr=3e-3,
        mask_prob=0.4,  # BERT's 0.15 leaves this encoder at the letter frequencies for 500 steps
        n_eval=1000,
        device="cpu",
        threads=1,
        progress=False,
    )
    res = run_bidirectional(cfg, tmp_path / "out")
    enc, dec = res["models"]["encoder"], res["models"]["decoder"]
    lead = res["encoder_minus_decoder"]["top1"]
    assert dec["top1"] < 0.6, dec  # the left side cannot give the second letter
    assert dec["top1"] > 0.3, dec  # ... but it does give the third: the decoder learnt
    assert enc["top1"] > dec["top1"] + 0.10, (enc, dec)
    assert lead["diff"] == pytest.approx(enc["top1"] - dec["top1"])
    assert lead["z"] > 3, lead
    lo, hi = enc["top1_ci95"]
    assert lo < enc["top1"] < hi
    assert "paired z" in (tmp_path / "out" / "table.md").read_text()


@pytest.mark.slow
def test_resume_continues_exactly_as_an_uninterrupted_run(tmp_path):
    common = [*TINY, "--log-every", "1", "--eval-every", "2", "--eval-batches", "1"]
    common += ["--schedule", "constant", "--warmup", "0"]  # lr independent of the total
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["train", "mlm", *common, "--steps", "4", "--out", str(whole)]) == 0
    assert main(["train", "mlm", *common, "--steps", "2", "--out", str(parts)]) == 0
    assert (
        main(["train", "mlm", "--resume", "--steps", "4", "--no-progress", "--out", str(parts)])
        == 0
    )
    losses = [
        [(r["step"], r.get("loss"), r.get("val_loss")) for r in _records(d)] for d in (whole, parts)
    ]
    assert losses[0] == losses[1]
    assert main(["train", "mlm", "--resume", "--config", "x.toml", "--out", str(parts)]) == 2

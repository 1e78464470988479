"""Translation data, vocabularies, the Task, the CLI (good and bad input) and learning numbers."""

import datetime as dt
import json
import re
import tempfile

import pytest
import torch
from num2words import num2words

from attnlab.attention import collect_aux_losses
from attnlab.cli import main
from attnlab.config.translation import TranslationTaskConfig as DataConfig
from attnlab.data.translation import (
    END_ID,
    PAD_ID,
    SPECIALS,
    START_ID,
    Vocab,
    build_data,
    load_vocabs,
    make_dates,
    make_numbers,
    read_tsv,
)
from attnlab.errors import UserError
from attnlab.metrics.translation import evaluate_pairs
from attnlab.models.translation import build_translation_model as build_model
from attnlab.tasks.losses import cross_entropy
from attnlab.tasks.translation import TranslationTask
from attnlab.train import TrainConfig, train
from attnlab.viz import attention as viz

# ---------------------------------------------------------------------------------------------
# data


@pytest.mark.parametrize("lang", ["it", "fr", "de"])
def test_numbers_are_num2words_and_reproducible(lang):
    pairs = make_numbers(lang, 50, low=0, high=10**6, seed=3)
    assert pairs == make_numbers(lang, 50, low=0, high=10**6, seed=3)
    assert pairs != make_numbers(lang, 50, low=0, high=10**6, seed=4)
    for src, tgt in pairs:
        n = (
            next(x for x in range(0, 10**6 + 1) if num2words(x, lang="en") == src)
            if len(src.split()) == 1
            else None
        )
        if n is not None:
            assert tgt == num2words(n, lang=lang)
    assert len({s for s, _ in pairs}) == 50


def test_number_range_controls_source_length():
    short = make_numbers("it", 100, low=1, high=99)
    long = make_numbers("it", 100, low=10**8, high=10**9 - 1)
    assert max(len(s.replace("-", " ").split()) for s, _ in short) <= 2
    assert min(len(s.replace("-", " ").split()) for s, _ in long) >= 5
    assert len(make_numbers("it", 500, low=0, high=9)) == 10  # the whole range, no repeats


def test_german_puts_units_before_tens():
    data = build_data(DataConfig(task="numbers", lang="de", low=21, high=99, n_examples=200))
    pairs = dict(p for split in data.splits.values() for p in split)
    assert pairs["twenty one"] == "einundzwanzig"


def test_unknown_language_is_a_user_error():
    with pytest.raises(UserError, match="unknown language 'xx'.*it, fr, de"):
        make_numbers("xx", 5)
    with pytest.raises(UserError, match="unknown language"):
        DataConfig(task="numbers", lang="klingon")


def test_dates_map_to_the_iso_date():
    months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    pairs = make_dates(300, seed=1)
    assert len({s for s, _ in pairs}) > 250
    formats = set()
    for src, iso in pairs:
        d = dt.date.fromisoformat(iso)
        s = src.lower()
        # an independent reading of the source: the year, month and day all appear in it
        assert str(d.year) in s or f"{d.year % 100:02d}" in s
        assert months[d.month - 1] in s or re.search(rf"\b0?{d.month}\b", s)
        assert re.search(rf"\b0?{d.day}(st|nd|rd|th)?\b", s)
        formats.add(re.sub(r"\d", "9", re.sub(r"[a-z]+", "w", s)))
    assert len(formats) >= 8  # varied human formats


def test_tsv_reading_normalisation_and_filtering(tmp_path):
    p = tmp_path / "pairs.tsv"
    p.write_text(
        "Hello!\tCiao!\tCC-BY 2.0 (France) Attribution: tatoeba.org\n\n"
        "Good   morning.\tBuongiorno.\n"
        + "a b c d e f g\tx\n"
        + "".join(f"Word {i}\tParola {i}\n" for i in range(20)),
        encoding="utf-8",
    )
    assert read_tsv(p)[0] == ("Hello!", "Ciao!")  # extra columns ignored
    bom = tmp_path / "bom.tsv"
    bom.write_bytes("\ufeffHi\tCiao\r\nBye\tAddio\r\n".encode())  # Windows editors' UTF-8
    assert read_tsv(bom) == [("Hi", "Ciao"), ("Bye", "Addio")]
    data = build_data(DataConfig(task="tsv", path=str(p), max_len=5))
    everything = [pair for split in data.splits.values() for pair in split]
    assert ("good morning.", "buongiorno.") in [
        (
            data.src_vocab.join(data.src_vocab.tokenize(s)),
            data.tgt_vocab.join(data.tgt_vocab.tokenize(t)),
        )
        for s, t in everything
    ]
    assert data.n_filtered == 1 and all("a b c" not in s for s, _ in everything)


def test_tsv_errors_name_file_and_line(tmp_path):
    missing = tmp_path / "nope.tsv"
    with pytest.raises(UserError, match="nope.tsv: no such file"):
        read_tsv(missing)
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\tuno\ntwo\tdue\nthree tre\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.tsv:3: expected at least 2 tab-separated columns"):
        read_tsv(bad)
    empty_field = tmp_path / "empty.tsv"
    empty_field.write_text("one\tuno\n\t\tdue\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"empty\.tsv:2: empty source field"):
        read_tsv(empty_field)
    binary = tmp_path / "latin1.tsv"
    binary.write_bytes("one\tuno\ncaf\xe9\tcaff\xe8\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1\.tsv:2: not valid UTF-8"):
        read_tsv(binary)


# ---------------------------------------------------------------------------------------------
# vocabularies


@pytest.mark.parametrize("level", ["word", "char", "bpe"])
def test_vocab_round_trip_and_specials(level):
    texts = ["novecentonovantanove", "ventuno", "cento ventuno", "mille e uno"] * 5
    vocab = Vocab.build(texts, level, bpe_vocab_size=40)
    assert tuple(vocab.itos[:4]) == SPECIALS
    assert Vocab.from_dict(json.loads(json.dumps(vocab.to_dict()))).itos == vocab.itos
    for t in texts[:4]:
        ids = vocab.encode(t, strict=True)
        assert min(ids) >= 4
        assert vocab.decode([START_ID, *ids, END_ID, PAD_ID, 7]) == t  # stops at <end>
    with pytest.raises(UserError, match="unknown .*'x'"):
        vocab.encode("xylofono" if level != "word" else "x", strict=True)
    assert 3 in vocab.encode("xylofono x")  # <unk> when not strict


def test_task_batches_are_deterministic_teacher_forced_and_padded():
    data = build_data(DataConfig(task="numbers", lang="it", high=999, n_examples=300))
    task = TranslationTask(data, eval_examples=0)
    b1, b2 = task.get_batch("train", 5, 8), task.get_batch("train", 5, 8)
    assert torch.equal(b1.src, b2.src) and torch.equal(b1.tgt_out, b2.tgt_out)
    assert not torch.equal(task.get_batch("train", 6, 8).src, b1.src)
    assert (b1.tgt_in[:, 0] == START_ID).all()
    assert torch.equal(
        b1.tgt_in[:, 1:], b1.tgt_out[:, :-1].masked_fill(b1.tgt_out[:, :-1] == END_ID, PAD_ID)
    )  # y shifted right by one
    assert ((b1.tgt_out == END_ID).sum(1) == 1).all()
    assert torch.equal(b1.src_mask, b1.src != PAD_ID)
    half = task.get_batch("train", 5, 8, rank=1, world=2)
    assert half.src.shape[0] == 4
    train_src = {s for s, _ in data.splits["train"]}
    assert not train_src & {s for s, _ in data.splits["test"]}  # held-out is unseen


def test_padding_is_ignored_in_the_loss():
    """Extra padded target positions (any logits there) leave the loss unchanged."""
    data = build_data(DataConfig(task="numbers", lang="it", high=999, n_examples=300))
    task = TranslationTask(data, eval_examples=0)
    model = build_model("rnn-attn", len(data.src_vocab), len(data.tgt_vocab), preset="tiny")
    b = task.get_batch("train", 0, 6)

    class Cfg:
        label_smoothing = 0.1

    loss = task.loss(model, b, Cfg)[0]
    pad = torch.zeros(6, 3, dtype=torch.long)
    b.tgt_in, b.tgt_out = torch.cat([b.tgt_in, pad], 1), torch.cat([b.tgt_out, pad], 1)
    torch.testing.assert_close(task.loss(model, b, Cfg)[0], loss)


# ---------------------------------------------------------------------------------------------
# CLI


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "it"
    rc = main(
        [
            "train",
            "translate",
            "--task",
            "numbers",
            "--lang",
            "it",
            "--high",
            "999",
            "--n-examples",
            "600",
            "--model",
            "transformer",
            "--preset",
            "tiny",
            "--steps",
            "30",
            "--eval-every",
            "30",
            "--warmup",  # a short warm-up, so that 30 steps already produce words
            "10",
            "--lr",
            "3e-3",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    return out


def test_train_writes_a_run_with_vocab_and_heldout(run_dir):
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["kind"] == "transformer"
    assert cfg["train"]["label_smoothing"] == 0.1 and cfg["train"]["schedule"] == "inverse_sqrt"
    assert (run_dir / "vocab.json").exists() and (run_dir / "heldout.tsv").exists()


def test_translate_cli(run_dir, tmp_path, capsys):
    assert (
        main(["translate", str(run_dir), "twenty-one", "Three hundred", "--beam", "3", "--scores"])
        == 0
    )
    assert capsys.readouterr().out.count("\t") == 2  # one "translation<TAB>score" per input
    sentences = ["one", "seven hundred and twelve", "forty-four"]
    alone = []
    for s in sentences:
        assert main(["translate", str(run_dir), s]) == 0
        alone.append(capsys.readouterr().out.strip())
    f = tmp_path / "in.txt"
    f.write_text("\n".join([sentences[0], "", *sentences[1:]]) + "\n", encoding="utf-8")
    assert main(["translate", str(run_dir), "--file", str(f)]) == 0
    # blank lines skipped; one padded batch gives each sentence's own translation, in order
    assert capsys.readouterr().out.splitlines() == alone


def test_alignment_heatmap_rows_are_outputs_and_columns_are_source_tokens(
    run_dir, tmp_path, capsys, monkeypatch
):
    seen = {}
    real_plot, real_grid = viz.plot_attention, viz.plot_attention_grid

    def spy(kind, real):
        def plot(weights, path, **kw):
            seen[kind] = (weights, kw)
            return real(weights, path, **kw)

        return plot

    monkeypatch.setattr(viz, "plot_attention", spy("mean", real_plot))
    monkeypatch.setattr(viz, "plot_attention_grid", spy("grid", real_grid))
    png = tmp_path / "align.png"
    assert (
        main(["translate", str(run_dir), "Twenty-one", "--beam", "2", "--attention", str(png)]) == 0
    )
    assert png.stat().st_size > 0 and (tmp_path / "align.layer0.png").stat().st_size > 0
    text = capsys.readouterr().out.splitlines()[0]
    w, kw = seen["mean"]
    assert kw["cols"] == ["twenty", "one"]  # the normalised source, padding excluded
    # the output pieces of the printed translation, then <end>
    assert kw["rows"][-1] == "<end>" and "".join(kw["rows"][:-1]).replace("▁", " ").strip() == text
    assert w.shape == (len(kw["rows"]), 2)
    torch.testing.assert_close(w.sum(-1), torch.ones(len(kw["rows"])))  # a distribution per row
    H = json.loads((run_dir / "config.json").read_text())["model"]["n_heads"]
    assert seen["grid"][0].shape == (H, len(kw["rows"]), 2)
    torch.testing.assert_close(seen["grid"][0].mean(0), w)  # the last layer's head average


def test_eval_scores_the_heldout_split(run_dir, tmp_path, capsys):
    """attnlab eval's exact match = the share of held-out lines whose translation (by the
    translate command, same batches) equals the target."""
    lines = (run_dir / "heldout.tsv").read_text(encoding="utf-8").splitlines()
    pairs = [line.split("\t") for line in lines]
    f = tmp_path / "src.txt"
    f.write_text("\n".join(s for s, _ in pairs) + "\n", encoding="utf-8")
    assert main(["translate", str(run_dir), "--file", str(f), "--batch-size", "32"]) == 0
    outs = capsys.readouterr().out.splitlines()
    expected = sum(o == t for o, (_, t) in zip(outs, pairs)) / len(pairs)
    assert main(["eval", str(run_dir)]) == 0
    out = capsys.readouterr().out
    m = re.search(r"held-out \((\d+) sentences, greedy\): exact match ([0-9.]+)", out)
    assert m, out
    assert int(m.group(1)) == len(pairs) and float(m.group(2)) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    "argv_tail,message",
    [
        (["twenty bananas"], "unknown word token(s) in 'twenty bananas': 'bananas'"),
        (["   "], "empty input sentence"),
        ([], "nothing to translate"),
        (["--file", "/nonexistent/in.txt"], "no such file"),
        (["one", "--beam", "0"], "--beam must be at least 1"),
        (["one " * 200], "the input has 200 source tokens; this model takes at most"),
    ],
)
def test_translate_bad_input(run_dir, capsys, argv_tail, message):
    assert main(["translate", str(run_dir), *argv_tail]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error:") and message in err
    assert capsys.readouterr().out == ""  # nothing half-printed before the error


def test_translate_refusals_come_before_any_output(run_dir, tmp_path, capsys):
    """Errors found after loading the run still print no translation; --allow-unk translates."""
    cases = [
        (["one", "--attention", str(tmp_path / "a.png"), "--layer", "9"], "--layer 9 out of"),
        (["one", "--batch-size", "0"], "--batch-size must be at least 1"),
        (["--file", str(tmp_path)], "not a file"),
    ]
    for tail, message in cases:
        assert main(["translate", str(run_dir), *tail]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("attnlab: error:") and message in err, err
    assert main(["translate", str(run_dir), "twenty bananas", "--allow-unk"]) == 0
    assert capsys.readouterr().out.count("\n") == 1  # one translation line
    lm = tmp_path / "lm"
    lm.mkdir()
    (lm / "config.json").write_text(json.dumps({"kind": "decoder_lm", "model": {}}))
    assert main(["translate", str(lm), "one"]) == 2
    err = capsys.readouterr().err
    assert "holds a 'decoder_lm' model" in err and "'rnn', 'rnn-attn', 'transformer'" in err
    assert main(["eval", str(run_dir), "--batch-size", "0"]) == 2
    assert "--batch-size must be at least 1" in capsys.readouterr().err


def test_train_bad_input(tmp_path, capsys):
    def train(out: str, *options: str) -> int:
        common = ["--steps", "1", "--no-progress", "--preset", "tiny"]
        return main(["train", "translate", *options, "--out", str(tmp_path / out), *common])

    assert train("a", "--lang", "xx") == 2
    assert "unknown language 'xx'" in capsys.readouterr().err
    assert train("b", "--task", "tsv", "--data", str(tmp_path / "missing.tsv")) == 2
    assert "missing.tsv: no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nno tab here\n", encoding="utf-8")
    assert train("c", "--task", "tsv", "--data", str(bad)) == 2
    assert "bad.tsv:2:" in capsys.readouterr().err
    assert train("d", "--set", "task.lang=xx") == 2  # --set is checked the same way
    assert "unknown language 'xx'" in capsys.readouterr().err


def test_rnn_runs_have_alignments_only_with_attention(tmp_path, capsys):
    for kind in ("rnn", "rnn-attn"):
        out = tmp_path / kind
        assert (
            main(
                [
                    "train",
                    "translate",
                    "--high",
                    "99",
                    "--n-examples",
                    "100",
                    "--model",
                    kind,
                    "--preset",
                    "tiny",
                    "--steps",
                    "5",
                    "--out",
                    str(out),
                    "--no-progress",
                ]
            )
            == 0
        )
        png = tmp_path / f"{kind}.png"
        rc = main(["translate", str(out), "twenty one", "--attention", str(png)])
        assert (rc == 0) == (kind == "rnn-attn") and png.exists() == (kind == "rnn-attn")
    assert "no attention to draw" in capsys.readouterr().err
    # a resume continues with the run's own data and model (here rnn, numbers 0-99 -> it) ...
    out = tmp_path / "rnn"
    assert main(["train", "translate", "--out", str(out), "--steps", "7", "--resume"]) == 0
    assert "trained rnn" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["task"]["high"] == 99
    # ... and refuses options that would change the vocabulary or the model
    argv = ["train", "translate", "--out", str(out), "--steps", "9", "--resume"]
    assert main([*argv, "--lang", "de", "--cell", "lstm"]) == 2
    err = capsys.readouterr().err
    assert "--lang 'de' (the run has lang='it')" in err and "cell='lstm'" in err


def _losses(run) -> list[dict]:
    """The training and validation records of metrics.jsonl without timings."""
    keep = ("step", "loss", "grad_norm", "acc", "lr", "val_loss", "val_acc", "val_exact")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: r[k] for k in keep if k in r} for r in map(json.loads, lines)]


@pytest.mark.parametrize("kind", ["rnn", "rnn-attn", "transformer"])
def test_training_again_from_a_saved_config_json_gives_identical_losses(kind, tmp_path, capsys):
    """`--config RUN/config.json` (new --out) rebuilds the same data, model and training
    settings: every logged loss is identical, and so is the new run's config.json."""
    first, again = tmp_path / "first", tmp_path / "again"
    argv = [
        "train", "translate", "--high", "99", "--n-examples", "120", "--model", kind,
        "--preset", "tiny", "--steps", "6", "--log-every", "1", "--eval-every", "3",
        "--eval-batches", "1", "--batch-size", "8", "--lr", "3e-3", "--warmup", "2",
        "--set", "task.eval_examples=4", "--no-progress", "--out", str(first),
    ]  # fmt: skip
    assert main(argv) == 0
    assert (
        main(["train", "translate", "--config", str(first / "config.json"), "--out", str(again)])
        == 0
    )
    capsys.readouterr()
    losses = _losses(first)
    assert len([r for r in losses if "loss" in r]) == 6 and any("val_loss" in r for r in losses)
    assert _losses(again) == losses
    cfg = json.loads((again / "config.json").read_text())
    assert cfg == json.loads((first / "config.json").read_text())
    assert cfg["kind"] == kind and cfg["task"]["eval_examples"] == 4


def test_config_file_flags_and_set_merge_in_order(tmp_path, capsys):
    """defaults < --config file (with model.preset) < typed flags < --set; an undotted --set key
    is a model field; --seed seeds the data too."""
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        'kind = "transformer"\n'
        '[model]\npreset = "tiny"\nd_model = 32\nn_heads = 4\n'
        "[train]\nlr = 0.01\nsteps = 2\nbatch_size = 8\n"
        "[task]\nhigh = 50\nn_examples = 60\neval_examples = 0\n"
    )
    out = tmp_path / "run"
    argv = [
        "train", "translate", "--config", str(cfg), "--lr", "0.002", "--set", "train.warmup_steps=1",
        "--set", "n_heads=2", "--set", "task.high=40", "--seed", "3", "--no-progress", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    saved = json.loads((out / "config.json").read_text())
    m, t, tr = saved["model"], saved["task"], saved["train"]
    assert (m["d_model"], m["n_heads"], m["n_enc_layers"], m["ffn_hidden"]) == (32, 2, 2, 128)
    assert (t["high"], t["n_examples"], t["seed"]) == (40, 60, 3)
    assert (tr["lr"], tr["steps"], tr["warmup_steps"], tr["seed"]) == (0.002, 2, 1, 3)
    assert tr["schedule"] == "inverse_sqrt" and tr["betas"] == [0.9, 0.98]  # family defaults
    bad = ["train", "translate", "--config", str(cfg), "--out", str(tmp_path / "bad")]
    assert main([*bad, "--set", "task.bogus=1"]) == 2
    assert "unknown TranslationTaskConfig field(s) ['bogus']" in capsys.readouterr().err
    assert main([*bad, "--model", "rnn"]) == 2  # the file's transformer fields do not fit
    assert "do not apply to model 'rnn'" in capsys.readouterr().err


def test_moe_transformer_adds_its_load_balancing_loss():
    """ffn=moe: the task's loss is the token cross-entropy plus moe_aux_coef × the experts'
    load-balancing losses reported during that forward (nothing stored on the model)."""
    data = build_data(DataConfig(task="numbers", lang="it", high=99, n_examples=100))
    task = TranslationTask(data, eval_examples=0)
    model = build_model(
        "transformer", len(data.src_vocab), len(data.tgt_vocab), preset="tiny",
        ffn="moe", n_experts=4, top_k=2, moe_aux_coef=0.5,
    )  # fmt: skip
    b = task.get_batch("train", 0, 6)

    class Cfg:
        label_smoothing = 0.0

    loss = task.loss(model, b, Cfg)[0]
    with collect_aux_losses() as aux:
        logits = model(b.src, b.src_mask, b.tgt_in)
    ce = cross_entropy(logits, b.tgt_out.masked_fill(b.tgt_out == PAD_ID, -100))
    assert len(aux.losses) == model.config.n_enc_layers + model.config.n_dec_layers  # one per FFN
    torch.testing.assert_close(loss, ce + 0.5 * aux.total())
    assert float(aux.total().detach()) > 0


# ---------------------------------------------------------------------------------------------
# learning


@pytest.mark.slow
def test_small_transformer_learns_italian_numbers():
    """English -> Italian numbers 0-999: a tiny Transformer reaches high exact match on numbers
    it never saw in training within a short CPU run."""
    data = build_data(DataConfig(task="numbers", lang="it", high=999, n_examples=1000))
    task = TranslationTask(data, eval_examples=0)
    model = build_model("transformer", len(data.src_vocab), len(data.tgt_vocab), preset="tiny")
    cfg = TrainConfig(
        steps=400,
        batch_size=64,
        lr=1e-3,
        warmup_steps=50,
        schedule="inverse_sqrt",
        label_smoothing=0.1,
        betas=(0.9, 0.98),
        eval_every=400,
        eval_batches=1,
        progress=False,
        device="cpu",
    )
    with tempfile.TemporaryDirectory() as d:
        train(model, task, cfg, d)

        vocabs = load_vocabs(d)
    res = evaluate_pairs(model, vocabs, data.splits["test"])
    assert res["n"] == 50
    assert res["exact_match"] >= 0.85, res["exact_match"]
    assert res["chrf"] >= 90


def test_bottleneck_experiment_writes_table_plot_and_results(tmp_path, capsys):
    """A seconds-long run of the experiment: every model scored in every length bucket."""
    out = tmp_path / "bn"
    rc = main(
        [
            "experiment",
            "bottleneck",
            "--out",
            str(out),
            "--steps",
            "3",
            "--high",
            "99999",
            "--n-examples",
            "300",
            "--batch-size",
            "16",
            "--no-progress",
        ]
    )
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["models"]) == {"rnn", "rnn-attn", "transformer"}
    for r in res["models"].values():
        assert set(r["buckets"]) == set(res["buckets"]) and r["steps"] == 3
        assert sum(b["n"] for b in r["buckets"].values()) == r["overall"]["n"]
    assert (out / "bottleneck.png").stat().st_size > 0
    text = capsys.readouterr().out
    assert "| source words |" in text and "Exact match from" in text
    assert main(["experiment", "bottleneck", "--out", str(out), "--steps", "1"]) == 2
    assert "--overwrite" in capsys.readouterr().err

"""The LM command line end to end (train, generate, eval, resume, demo) and its bad-input paths:
each bad input is one 'attnlab: error:' line and exit status 2."""

import json
import math
import shutil
from pydoc_data.topics import topics

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import attnlab
from attnlab.cli import main
from attnlab.config import LMTaskConfig, ModelConfig
from attnlab.data.tokenizers import ByteBPETokenizer
from attnlab.decoding import beam_generate, generate
from attnlab.demo import TRANSFORMER_OPTIMIZER
from attnlab.interop import to_hf
from attnlab.models.lm import DecoderLM
from attnlab.tasks.lm import LMTask

pytestmark = pytest.mark.slow

TINY = "--preset tiny --set d_model=32 --set n_layers=1 --seq-len 32 --batch-size 8".split()
TINY += ["--no-progress", "--max-chars", "40000"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))


def _records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_generate_eval_resume(tmp_path, capsys):
    run = tmp_path / "run"
    common = [*TINY, "--schedule", "constant", "--warmup", "0", "--eval-every", "3"]
    common += ["--log-every", "1"]
    assert main(["train", "lm", *common, "--steps", "3", "--out", str(run)]) == 0
    assert "val loss" in capsys.readouterr().out
    for name in (
        "config.json",
        "model.safetensors",
        "best.safetensors",
        "state.pt",
        "tokenizer.json",
        "metrics.jsonl",
        "loss.png",
    ):
        assert (run / name).exists(), name
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["kind"] == "decoder_lm" and cfg["model"]["d_model"] == 32
    assert cfg["model"]["max_seq_len"] == 32 and cfg["task"]["data"] == "pydoc"

    assert main(["generate", str(run), "--prompt", "The ", "-n", "20", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The ") and len(out) == len("The ") + 20 + 1
    assert (
        main(
            [
                "generate",
                str(run),
                "--prompt",
                "The ",
                "-n",
                "20",
                "--seed",
                "1",
                "--no-stream",
                "--no-cache",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == out  # same sample with and without the cache

    assert main(["eval", str(run), "--max-batches", "2", "--weights", "last"]) == 0
    words = capsys.readouterr().out.replace(",", "").split()
    loss, ppl = float(words[words.index("loss") + 1]), float(words[words.index("perplexity") + 1])
    assert loss == pytest.approx(_val_loss_by_hand(run, n_windows=2 * 32), abs=1e-4)
    assert ppl == pytest.approx(math.exp(loss), rel=1e-3)

    # 3 steps + resume to 6 steps == 6 steps in one go (constant schedule, same batches)
    assert main(["train", "lm", *common, "--steps", "6", "--resume", "--out", str(run)]) == 0
    straight = tmp_path / "straight"
    assert main(["train", "lm", *common, "--steps", "6", "--out", str(straight)]) == 0
    for key in ("loss", "val_loss"):
        a = [(r["step"], r[key]) for r in _records(run) if key in r]
        b = [(r["step"], r[key]) for r in _records(straight) if key in r]
        assert len(a) == len(b) == {"loss": 6, "val_loss": 2}[key]
        assert [s for s, _ in a] == [s for s, _ in b]
        assert max(abs(x - y) for (_, x), (_, y) in zip(a, b)) <= 1e-6, (key, a, b)
    w_run, w_straight = (load_file(d / "model.safetensors") for d in (run, straight))
    for k in w_straight:
        torch.testing.assert_close(w_run[k], w_straight[k], rtol=0, atol=1e-6)


def _val_loss_by_hand(run, n_windows):
    """Mean next-token cross-entropy of the run's model on the first ``n_windows`` held-out
    windows, rebuilt from the raw corpus text and the saved tokenizer (last 10 % of the ids)."""
    model, tok = attnlab.load(run)
    T = model.config.max_seq_len
    text = "\n\n".join(topics[k].strip("\n") for k in sorted(topics)) + "\n"
    ids = tok.encode(text[:40000])
    assert tok.decode(ids) == text[:40000]
    val = torch.tensor(ids[len(ids) - max(len(ids) // 10, T + 1) :])
    windows = torch.stack([val[i : i + T + 1] for i in range(0, n_windows * T, T)])  # (N, T+1)
    with torch.no_grad():
        logits = model.eval()(windows[:, :-1])  # (N, T, V)
    return float(F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()))


@pytest.mark.parametrize("arch", ["lstm", "bigram", "conv"])
def test_baselines_train_and_generate(tmp_path, capsys, arch):
    run = tmp_path / arch
    args = ["--preset", "tiny", "--seq-len", "32", "--batch-size", "8", "--no-progress"]
    assert main(["train", "lm", "--arch", arch, *args, "--steps", "2", "--out", str(run)]) == 0
    assert main(["generate", str(run), "-n", "10", "--prompt", "a"]) == 0
    assert json.loads((run / "config.json").read_text())["kind"] == f"{arch}_lm"
    capsys.readouterr()


def _error(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert err[-1].startswith("attnlab: error: "), err
    return err[-1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
    run = tmp_path_factory.mktemp("runs") / "tiny"
    assert main(["train", "lm", *TINY, "--steps", "1", "--out", str(run)]) == 0
    mp.undo()
    return run


def test_bad_input_gives_one_clear_error(tmp_path, capsys, trained):
    out = ["--out", str(tmp_path / "x"), "--steps", "1"]
    assert "unknown ModelConfig preset 'gpt5'" in _error(
        capsys, ["train", "lm", "--preset", "gpt5", *out]
    )
    assert "unknown corpus 'wiki'" in _error(capsys, ["train", "lm", "--data", "wiki", *out])
    assert "no such file" in _error(
        capsys, ["train", "lm", "--data", str(tmp_path / "nope.txt"), *out]
    )
    (tmp_path / "empty.txt").write_text("")
    assert "empty" in _error(capsys, ["train", "lm", "--data", str(tmp_path / "empty.txt"), *out])
    assert "divisible" in _error(capsys, ["train", "lm", "--set", "d_model=65", *out])
    assert "d_modle" in _error(capsys, ["train", "lm", "--set", "d_modle=64", *out])
    assert "must be a number, got 'abc'" in _error(
        capsys, ["train", "lm", "--set", "dropout=abc", *out]
    )
    assert "hidden must be an integer" in _error(
        capsys, ["train", "lm", "--arch", "lstm", "--set", "hidden=big", *out]
    )
    assert "256" in _error(
        capsys, ["train", "lm", "--tokenizer", "bpe", "--vocab-size", "10", *out]
    )
    assert "unknown LSTMConfig preset 'gpt2'" in _error(
        capsys, ["train", "lm", "--arch", "lstm", "--preset", "gpt2", *out]
    )
    assert "--vocab-size" in _error(capsys, ["train", "lm", "--set", "vocab_size=1000", *out])
    msg = _error(capsys, ["train", "lm", "--seq-len", "16", "--set", "max_seq_len=64", *out])
    assert "--seq-len 16 and --set max_seq_len=64 disagree" in msg
    assert "seq_len must be positive, got 0" in _error(
        capsys, ["train", "lm", "--seq-len", "0", *out]
    )
    # an existing run is not overwritten without --overwrite / --resume, and this is said before
    # the corpus is read (no model summary line first)
    before = {p.name: p.read_bytes() for p in trained.iterdir()}
    rc = main(["train", "lm", *TINY, "--steps", "1", "--out", str(trained)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "already exists" in err[0], err
    # --resume keeps the saved model and data: contradicting options are refused, naming them
    resume = ["train", "lm", "--resume", "--out", str(trained), "--steps", "2"]
    msg = _error(capsys, [*resume, "--data", "stdlib", "--set", "d_model=64", "--seq-len", "16"])
    assert "--data 'stdlib'" in msg and "d_model=64" in msg and "--seq-len 16" in msg
    assert "--arch 'lstm_lm'" in _error(capsys, [*resume, "--arch", "lstm"])
    assert "refusing to write the demo" in _error(capsys, ["demo", "--out", str(trained)])
    assert {p.name: p.read_bytes() for p in trained.iterdir()} == before

    assert "--max-batches must be >= 1" in _error(
        capsys, ["eval", str(trained), "--max-batches", "0"]
    )
    assert "--batch-size must be >= 1" in _error(
        capsys, ["eval", str(trained), "--batch-size", "0"]
    )
    assert "unknown device 'foo'" in _error(capsys, ["generate", str(trained), "--device", "foo"])

    msg = _error(capsys, ["generate", str(trained), "--prompt", "snowman ☃ and Ω"])
    assert "'☃'" in msg and "'Ω'" in msg
    assert "context" in _error(capsys, ["generate", str(trained), "--prompt", "x" * 40])
    assert "does not exist" in _error(capsys, ["generate", str(tmp_path / "missing")])
    assert "does not exist" in _error(capsys, ["eval", str(tmp_path / "missing")])


def test_corrupted_and_foreign_run_dirs(tmp_path, capsys, trained):
    bad = tmp_path / "bad"
    shutil.copytree(trained, bad)
    (bad / "config.json").write_text("{oops")
    assert "corrupted" in _error(capsys, ["generate", str(bad)])
    (bad / "config.json").write_text(json.dumps({"kind": "vit", "model": {}, "task": {}}))
    assert "holds a 'vit' model; this needs one of ['decoder_lm'" in _error(
        capsys, ["generate", str(bad)]
    )
    shutil.rmtree(bad)
    shutil.copytree(trained, bad)
    (bad / "best.safetensors").write_bytes(b"garbage")
    assert "weights" in _error(capsys, ["generate", str(bad)])
    (bad / "tokenizer.json").write_text("[]")
    assert "tokenizer" in _error(capsys, ["generate", str(bad), "--weights", "last"])
    assert "not an attnlab run directory" in _error(capsys, ["generate", str(tmp_path)])


def test_demo_runs_and_can_run_again(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--steps", "2", "--val-batches", "1", "--no-progress"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    for name in ("Transformer", "LSTM", "bigram", "Sample"):
        assert name in text
    for name in (
        "attention.png",
        "loss.png",
        "report.json",
        "transformer/loss.png",
        "lstm/model.safetensors",
        "bigram/model.safetensors",
    ):
        assert (out / name).exists(), name
    report = json.loads((out / "report.json").read_text())
    per_step = report["batch_size"] * report["seq_len"]
    assert report["tokens_per_step"] == per_step and report["budget"] is None
    assert [(m["steps"], m["tokens"]) for m in report["models"]] == [(2, 2 * per_step)] * 3
    assert report["budget_row"] == "xs"  # the rule at 2 steps
    # equal tokens: each model's validation curve (its metrics.jsonl) read at the fewest tokens
    assert report["equal_tokens"] == 2 * per_step
    for m, sub in zip(report["models"], ("transformer", "lstm", "bigram")):
        records = [json.loads(x) for x in (out / sub / "metrics.jsonl").read_text().splitlines()]
        last = [r for r in records if "val_loss" in r][-1]
        assert last["step"] == 2 and m["curve_at_equal"] == pytest.approx(last["val_loss"])
        # the same steps each: every model's equal-token loss is its final one, its own run
        assert m["at_equal"]["val_loss"] == m["val_loss"]
        assert m["at_equal"]["run"] == str(out / sub)
    assert f"trained for {2 * per_step:,} tokens, the fewest any model reached" in text
    optimizers = [
        json.loads((out / sub / "config.json").read_text())["train"]["optimizer"]
        for sub in ("transformer", "lstm", "bigram")
    ]
    assert optimizers == [report["optimizer"], "adamw", "adamw"]
    assert report["optimizer"] == TRANSFORMER_OPTIMIZER
    # re-running overwrites its own demo directory; with a budget, each model gets the same
    # wall-clock (its own run's max_time) and the table shows the tokens each one reached
    timed = ["demo", "--out", str(out), "--budget", "2", "--val-batches", "1", "--no-progress"]
    assert main(timed) == 0
    text = capsys.readouterr().out
    assert "2 s of training each" in text and "tokens" in text
    report = json.loads((out / "report.json").read_text())
    assert report["budget"] == 2
    for m, sub in zip(report["models"], ("transformer", "lstm", "bigram")):
        assert json.loads((out / sub / "config.json").read_text())["train"]["max_time"] == 2
        assert m["tokens"] == m["steps"] * report["tokens_per_step"] and m["steps"] >= 1
        assert f"{m['tokens']:,}" in text
    assert report["equal_tokens"] == min(m["tokens"] for m in report["models"])
    # at equal tokens: the model with the fewest as it ended; every other one trained again
    # from the seed for exactly that many steps, measured on the same batches (checked here by
    # loading its run and scoring it independently)
    equal_steps = report["equal_tokens"] // per_step
    task = LMTask.build(
        LMTaskConfig(data="pydoc", tokenizer="char", seq_len=report["seq_len"], seed=0)
    )
    retrained = []
    for m, sub in zip(report["models"], ("transformer", "lstm", "bigram")):
        at = m["at_equal"]
        assert f"{at['val_loss']:.4f}" in text
        if m["tokens"] == report["equal_tokens"]:
            assert at["val_loss"] == m["val_loss"] and at["run"] == str(out / sub)
            continue
        retrained.append(sub)
        assert at["run"] == str(out / f"{sub}_equal_tokens")
        cfg = json.loads((out / f"{sub}_equal_tokens" / "config.json").read_text())["train"]
        assert cfg["steps"] == equal_steps and cfg["max_time"] is None
        model = attnlab.load(at["run"], weights="last").model
        assert task.val_loss(model, batch_size=32, n_batches=1)["loss"] == pytest.approx(
            at["val_loss"], abs=1e-5
        )
    assert retrained  # the bigram, at least, reads far more than the others in 2 s
    # a later demo where none is retrained leaves no second runs of an earlier one behind
    assert main(["demo", "--out", str(out), "--steps", "1", "--val-batches", "1",
                 "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    assert not any((out / f"{sub}_equal_tokens").exists() for sub in retrained)


def test_generate_from_a_hugging_face_folder(tmp_path, capsys):
    tok = ByteBPETokenizer.train("def f(x):\n    return x\n" * 50, vocab_size=280)
    model = DecoderLM(ModelConfig.preset("tiny", vocab_size=tok.vocab_size)).eval()
    to_hf(model, tmp_path / "hf", tokenizer=tok)
    argv = ["generate", "--from-hf", str(tmp_path / "hf"), "--prompt", "def", "-n", "6"]
    assert main([*argv, "--temperature", "0", "--no-stream"]) == 0
    ids = generate(model, torch.tensor([tok.encode("def")]), 6, temperature=0)
    expected = tok.decode(ids[0].tolist())
    eos = json.loads((tmp_path / "hf" / "config.json").read_text()).get("eos_token_id")
    new = ids[0, len(tok.encode("def")) :].tolist()
    if eos is None or eos not in new:  # no end-of-text token in the greedy run
        assert capsys.readouterr().out == expected + "\n"
    assert "not both" in _error(capsys, [*argv, str(tmp_path)])


def test_backend_and_checkpointing_flags_reach_the_model_config(tmp_path, capsys):
    run = tmp_path / "run"
    args = [*TINY, "--steps", "2", "--backend", "tiled", "--checkpointing", "--out", str(run)]
    assert main(["train", "lm", *args, "--set", "bias=False", "--set", "n_kv_heads=None"]) == 0
    cfg = json.loads((run / "config.json").read_text())["model"]
    assert cfg["backend"] == "tiled" and cfg["activation_checkpointing"] is True
    assert cfg["bias"] is False and cfg["n_kv_heads"] == cfg["n_heads"]  # Python spellings
    assert main(["train", "lm", *TINY, "--backend", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "nope" in capsys.readouterr().err


def test_a_run_on_a_relative_corpus_path_evaluates_from_anywhere(tmp_path, capsys, monkeypatch):
    (tmp_path / "corpus.txt").write_text("the cat sat on the mat. " * 200)
    monkeypatch.chdir(tmp_path)
    args = ["--arch", "bigram", "--seq-len", "16", "--batch-size", "4", "--no-progress"]
    assert main(["train", "lm", "--data", "corpus.txt", *args, "--steps", "1", "--out", "r"]) == 0
    task = json.loads((tmp_path / "r" / "config.json").read_text())["task"]
    assert task["data"] == str(tmp_path / "corpus.txt")
    monkeypatch.chdir(tmp_path.parent)
    assert main(["eval", str(tmp_path / "r")]) == 0
    assert "perplexity" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--backend", "window"], "window"),  # window needs its size
        (["--backend", "tiled", "--set", "attn_dropout=0.1"], "dropout"),
        (["--backend", "tiled", "--set", 'backend_options={"blok_q": 8}'], "blok_q"),
    ],
)
def test_a_backend_that_cannot_run_fails_before_the_run_directory_is_written(
    tmp_path, capsys, extra, message
):
    run = tmp_path / "run"
    assert main(["train", "lm", *TINY, "--steps", "2", *extra, "--out", str(run)]) == 2
    assert message in capsys.readouterr().err
    assert not run.exists()


def _losses(run):
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in _records(run)]


@pytest.mark.parametrize(
    "arch_args",
    [["--preset", "llama-tiny", "--set", "d_model=32"], ["--arch", "lstm", "--tokenizer", "bpe"]],
    ids=["transformer", "lstm-bpe"],
)
def test_training_again_from_a_runs_config_json_gives_identical_losses(tmp_path, arch_args):
    first, again = tmp_path / "first", tmp_path / "again"
    args = [*arch_args, "--seq-len", "16", "--batch-size", "4", "--max-chars", "30000"]
    args += ["--steps", "3", "--log-every", "1", "--eval-every", "2", "--eval-batches", "2"]
    assert main(["train", "lm", *args, "--seed", "3", "--no-progress", "--out", str(first)]) == 0
    config = first / "config.json"
    assert main(["train", "lm", "--config", str(config), "--out", str(again)]) == 0
    assert _losses(again) == _losses(first) and len(_losses(first)) == 5  # 3 steps + 2 evals
    a, b = (json.loads((d / "config.json").read_text()) for d in (first, again))
    assert a == b
    for k, w in load_file(first / "model.safetensors").items():
        torch.testing.assert_close(load_file(again / "model.safetensors")[k], w, rtol=0, atol=0)


def test_set_reaches_every_section_and_overrides_the_config_file(tmp_path):
    base, run = tmp_path / "base", tmp_path / "run"
    assert main(["train", "lm", *TINY, "--steps", "1", "--out", str(base)]) == 0
    sets = ["d_model=64", "model.n_heads=8", "train.lr=3e-4", "task.seq_len=16"]
    argv = ["train", "lm", "--config", str(base / "config.json"), "--out", str(run)]
    assert main([*argv, *(x for s in sets for x in ("--set", s)), "--steps", "2"]) == 0
    cfg = json.loads((run / "config.json").read_text())
    m = cfg["model"]
    assert (m["d_model"], m["n_heads"], m["n_layers"]) == (64, 8, 1)  # n_layers: from the file
    assert m["head_dim"] == 8 and m["ffn_hidden"] == 256  # derived again from the new widths
    assert m["max_seq_len"] == cfg["task"]["seq_len"] == 16
    assert cfg["train"]["lr"] == 3e-4 and cfg["train"]["steps"] == 2  # typed flag > file


def test_a_toml_config_file_with_a_preset(tmp_path):
    (tmp_path / "run.toml").write_text(
        'kind = "decoder_lm"\n'
        '[model]\npreset = "llama-tiny"\nd_model = 32\n'
        "[train]\nsteps = 1\nbatch_size = 4\nlr = 3e-3\nprogress = false\n"
        "[task]\nseq_len = 16\nmax_chars = 30000\n"
    )
    run = tmp_path / "run"
    assert main(["train", "lm", "--config", str(tmp_path / "run.toml"), "--out", str(run)]) == 0
    cfg = json.loads((run / "config.json").read_text())
    m = cfg["model"]
    assert (m["position"], m["n_kv_heads"], m["d_model"], m["max_seq_len"]) == ("rope", 2, 32, 16)
    assert cfg["train"]["lr"] == 3e-3 and cfg["task"]["max_chars"] == 30000


def test_beam_search_from_the_command_line(trained, capsys):
    greedy = ["generate", str(trained), "--prompt", "The ", "-n", "12"]
    assert main([*greedy, "--temperature", "0"]) == 0
    sampled_greedy = capsys.readouterr().out
    assert main([*greedy, "--beam", "1"]) == 0  # width 1 is greedy decoding
    assert capsys.readouterr().out == sampled_greedy
    assert main([*greedy, "--beam", "4"]) == 0
    out = capsys.readouterr().out
    model, tok = attnlab.load(trained, weights="best")
    best = beam_generate(model, torch.tensor([tok.encode("The ")]), 12, beam=4)[0]
    assert out == "The " + tok.decode(best.ids) + "\n" and len(best.ids) == 12
    for option in (["--temperature", "0.5"], ["--top-k", "3"], ["--top-p", "0.9"]):
        msg = _error(capsys, [*greedy, "--beam", "4", *option])
        assert "--beam" in msg and option[0] in msg
    assert "context" in _error(capsys, [*greedy[:-1], "40", "--beam", "2"])


def test_resume_a_run_whose_config_predates_new_block_fields(tmp_path):
    """A run saved before drop_path/MoE fields existed (first release) still resumes: the saved
    model config is compared as rebuilt by its config class."""
    run = tmp_path / "old"
    common = ["--max-chars", "20000", "--seq-len", "32", "--batch-size", "4", "--no-progress"]
    assert (
        main(
            [
                "train",
                "lm",
                "--preset",
                "tiny",
                "--steps",
                "4",
                "--eval-every",
                "2",
                "--out",
                str(run),
                *common,
            ]
        )
        == 0
    )
    cfg = json.loads((run / "config.json").read_text())
    for key in ("drop_path", "n_experts", "top_k", "moe_aux_coef"):
        cfg["model"].pop(key)
    (run / "config.json").write_text(json.dumps(cfg))
    assert (
        main(["train", "lm", "--resume", "--steps", "6", "--out", str(run), "--no-progress"]) == 0
    )
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 6

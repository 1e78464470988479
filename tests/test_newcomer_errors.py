"""Issue 26, item 4: errors as the README promises them, one line with a "did you mean".

Each bad input below is refused with exit status 2, exactly one ``attnlab: error: ...`` line on
stderr (no usage block, no traceback), nothing on stdout (options are checked before any output:
``generate`` printed the prompt first), and the suggestion where one fits. Run through
``tests/cli_harness.py``: a command that got past its checks would stop at its first training
step instead of training.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_harness import check_refused, invoke

RUNS = Path(__file__).parent / "fixtures" / "release_0_1" / "runs"
LM, TR = str(RUNS / "lm_gpt2"), str(RUNS / "tr_transformer")
TRAIN = ["train", "lm", "--steps", "1", "--out", "r", "--no-progress"]

CASES = [
    # (argv, what the line must contain)
    (["train", "lm", "--stesp", "5"], "unknown flag --stesp (did you mean --steps?)"),
    (["train", "lm", "--max-tim", "5"], "did you mean --max-time?"),
    (["generate", LM, "--temprature", "0"], "did you mean --temperature?"),
    (["trian", "lm"], "unknown command 'trian' (did you mean train?)"),
    (["bench", "atention"], "did you mean attention?"),
    (["experiment", "botleneck"], "did you mean bottleneck?"),
    (["train", "image", "--model", "vitt"], "did you mean vit?"),
    (["train", "lm", "--tokenizer", "bpee"], "did you mean bpe?"),
    ([*TRAIN, "--preset", "tinyy"], "preset 'tinyy' (did you mean tiny?)"),
    ([*TRAIN, "--preset", "tiny", "--set", "model.n_head=8"], "(did you mean n_heads?)"),
    ([*TRAIN, "--preset", "tiny", "--set", "position=alibo"], "(did you mean alibi?)"),
    ([*TRAIN, "--set", "modle.n_heads=8"], "(did you mean model?)"),
    (["train", "translate", "--preset", "tinny", "--out", "r"], "(did you mean tiny?)"),
    (["translate", TR, "twenty thre"], "'thre' (did you mean three?)"),
    (["generate", LM, "--prompt", "The ", "--temperature", "-1"], "--temperature must be >= 0"),
    (["generate", LM, "--prompt", "The ", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["generate", LM, "--prompt", "The ", "--top-k", "0"], "--top-k must be at least 1"),
    (["generate", LM, "--beam", "two"], "invalid int value: 'two'"),
]


@pytest.mark.parametrize(
    "argv, expected", CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else None
)
def test_one_line_with_a_suggestion(argv, expected, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    outcome = invoke(argv, cwd)
    check_refused(outcome, writes=["r"])
    line = outcome.err.strip()
    assert len(line.splitlines()) == 1 and not line.startswith("usage"), outcome
    assert expected in line, outcome
    assert outcome.out == "", f"output before the error\n{outcome}"


def test_no_python_wording_in_cli_errors(tmp_path):
    cwd = tmp_path / "cwd"
    (cwd / "taken").mkdir(parents=True)
    (cwd / "taken" / "x.txt").write_text("x")
    outcome = invoke(["convert", "--to-hf", LM, "--out", "taken"], cwd)
    check_refused(outcome, writes=["taken"])
    assert "add --overwrite" in outcome.err and "pass overwrite=True" not in outcome.err


@pytest.mark.parametrize(
    "run, flag",
    [
        ("vqa_lstm", "attnlab train vqa --model transformer"),
        ("cap_lstm", "--model transformer"),
        ("lm_lstm", "attnlab train lm"),
        ("tr_rnn", "--model rnn-attn"),
        ("img_cnn", "--model vit"),
    ],
)
def test_the_explorer_names_the_command_that_trains_a_model_it_can_show(run, flag, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    outcome = invoke(["explore", str(RUNS / run), "--input", "x", "--out", "p.html"], cwd)
    check_refused(outcome)
    assert "no attention" in outcome.err and flag in outcome.err, outcome
    assert "vqa_transformer" not in outcome.err and "caption_transformer" not in outcome.err

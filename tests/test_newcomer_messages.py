"""Issue 18, messages: translate's unknown words, classify's image polarity, `attnlab samples`
(on the bundled first-release runs: nothing is trained here)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageOps

from attnlab.cli import main
from attnlab.data.images import ImageSettings, read_image

RUNS = Path(__file__).parent / "fixtures" / "release_0_1" / "runs"


def _error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error: ")  # one clear line
    return lines[0]


def test_an_unknown_word_mentions_allow_unk(capsys):
    assert main(["translate", str(RUNS / "tr_transformer"), "twenty x"]) == 2
    err = _error(capsys)
    assert "'x'" in err and "--allow-unk" in err and "number" not in err
    assert main(["translate", str(RUNS / "tr_transformer"), "twenty x", "--allow-unk"]) == 0


def test_digits_say_that_the_model_reads_number_words(capsys):
    assert main(["translate", str(RUNS / "tr_rnn_attn"), "one", "21"]) == 2
    err = _error(capsys)
    assert "input 2:" in err and "'21'" in err
    assert "numbers written as words" in err and "--allow-unk" in err


def _digits_settings() -> ImageSettings:
    return ImageSettings([str(i) for i in range(10)], (1, 8, 8), [0.31], [0.38], "digits")


def test_polarity_rule():
    s = _digits_settings()
    assert "8×8 grey" in s.describe() and "white strokes on a black background" in s.describe()
    assert s.polarity_notice(torch.full((1, 8, 8), 0.2)) is None  # dark, like the training data
    assert s.polarity_notice(torch.full((1, 8, 8), 0.6)) is None  # not clearly either
    notice = s.polarity_notice(torch.full((1, 8, 8), 0.8))
    assert "mostly light (mean brightness 0.80)" in notice and "mostly dark" in notice
    grey = ImageSettings(["a", "b"], (3, 8, 8), [0.5, 0.45, 0.55], [0.2] * 3, "folder")
    assert grey.polarity_notice(torch.ones(3, 8, 8)) is None  # training mean near 0.5: no rule


def test_samples_then_classify_and_the_inverted_drawing(tmp_path, capsys):
    run = str(RUNS / "img_vit")
    assert main(["samples", run, "--out", str(tmp_path / "s"), "--n", "12"]) == 0
    out = capsys.readouterr().out
    files = sorted((tmp_path / "s").glob("*.png"))
    assert len(files) == 12 and {f"{i}.png" for i in range(10)} <= {f.name for f in files}
    assert f"try: attnlab classify {run} " in out
    seven = tmp_path / "s" / "7.png"
    image = read_image(seven, image_size=8, channels=1)
    # the sample is the test image itself (upscaled 8x, read back at 8x8)
    assert image.mean() < 0.5
    assert main(["classify", run, str(seven), "--top-k", "1"]) == 0
    res = capsys.readouterr()
    assert res.out.split()[0] == "7" and "notice" not in res.err

    drawing = tmp_path / "black_on_white.png"
    ImageOps.invert(Image.open(seven).convert("L")).save(drawing)
    assert main(["classify", run, str(drawing), "--top-k", "1"]) == 0
    err = capsys.readouterr().err
    assert "notice: this image is mostly light" in err and "white strokes on a black" in err
    assert "add --invert" in err
    assert main(["classify", run, str(drawing), "--top-k", "1", "--invert"]) == 0
    res = capsys.readouterr()
    assert res.out.split()[0] == "7" and "notice" not in res.err


@pytest.mark.parametrize("argv", [["samples", "x", "--n", "0"], ["samples", "x", "--scale", "0"]])
def test_samples_bad_input(argv, capsys):
    assert main(argv) == 2
    assert "must be at least 1" in _error(capsys)


def test_sentences_may_follow_the_flags(capsys):
    run = str(RUNS / "tr_transformer")
    assert main(["translate", run, "twenty one", "--beam", "2"]) == 0
    first = capsys.readouterr().out
    assert main(["translate", run, "--beam", "2", "twenty one"]) == 0  # (argparse left it over)
    assert capsys.readouterr().out == first
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", run, "--beam", "2", "twenty one", "--bogus"])
    assert exit_info.value.code == 2
    assert "--bogus" in capsys.readouterr().err


def test_a_converted_run_without_tokenizer_json_says_what_is_missing(tmp_path, capsys):
    run = tmp_path / "converted"
    shutil.copytree(RUNS / "lm_gpt2", run)
    (run / "tokenizer.json").unlink()
    for argv in (["generate", str(run), "--prompt", "a", "-n", "2"], ["eval", str(run)]):
        assert main(argv) == 2
        err = _error(capsys)
        assert "has no tokenizer.json" in err and "copy the checkpoint's tokenizer.json" in err

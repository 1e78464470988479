"""Property-based tests of every ``attnlab`` command against hostile flags and input files.

For each command (enumerated from the parser, so a new command without a case here fails
``test_every_command_has_a_case``) hypothesis starts from a cheap, valid invocation and then
gives some of its flags random values of random types (negative, zero, huge, NaN, infinity,
empty, text where a number is expected, a number where a name is expected) and replaces its input
files by hostile ones: empty, binary, a 5 MB single line, latin-1 and UTF-16 text, a PNG / IDX /
CIFAR batch declaring an absurd size, run directories whose files are any of those.

The property (:mod:`cli_harness`): the invocation is either refused, with exit status 2, one
``attnlab: error:`` line (or argparse's usage and one error line), no traceback and no file
changed anywhere, or accepted, reaching the work (the first training step, the benchmark, the
server) or ending with status 0, having written files only under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from attnlab.cli import build_parser, main
from cli_harness import check_accepted, check_refused, invoke

FIXTURE_RUNS = Path(__file__).parent / "fixtures" / "release_0_1" / "runs"
FIXTURE_INPUTS = Path(__file__).parent / "fixtures" / "release_0_1" / "inputs"
OUT = "out/run"  # every invocation's --out (a file name for explore: out/page.html)

# ATTNLAB_CLI_EXAMPLES=200 searches longer (the default keeps the file near a minute)
SETTINGS = settings(
    max_examples=int(os.environ.get("ATTNLAB_CLI_EXAMPLES", "12")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# ---------------------------------------------------------------------------------------------
# hostile input files


def _png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` but holds one row of pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" + b"\x80" * min(width, 64))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _idx(dims: tuple[int, ...], payload: int = 16) -> bytes:
    """An MNIST IDX file (unsigned bytes) declaring ``dims`` but holding ``payload`` bytes."""
    return (
        struct.pack(">HBB", 0, 8, len(dims))
        + struct.pack(f">{len(dims)}I", *dims)
        + b"\0" * payload
    )


class _Absurd:
    """Pickles as a numpy array header declaring 10^9 x 3072 bytes over 12 bytes of data."""

    def __reduce__(self):
        return (np.ndarray, ((10**9, 3072), np.uint8, b"\0" * 12))


FILES: dict[str, bytes] = {
    "empty": b"",
    "binary": bytes(range(256)) * 64 + b"\0\xff\xfe" * 100,
    "huge_line": b"a" * 5_000_000,
    "latin1": ("caf\xe9 na\xefve \xff \xe0 la cr\xe8me\n" * 200).encode("latin-1"),
    "utf16": ("hello world, twenty one\n" * 200).encode("utf-16"),
    "json_utf16": json.dumps({"kind": "lm", "model": {}}).encode("utf-16"),
    "png_absurd": _png(100_000, 100_000),
    "png_wide": _png(2**31 - 1, 1),
    "png_truncated": _png(8, 8)[:40],
    "idx_absurd": _idx((10**9, 28, 28)),
    "idx_zero": _idx((0, 0, 0), payload=0),
}


def _write_inputs(root: Path) -> None:
    """Hostile files and folders under ``root`` (``inputs/<name>``, ``dirs/<name>/``)."""
    inputs = root / "inputs"
    inputs.mkdir()
    for name, data in FILES.items():
        (inputs / name).write_bytes(data)
    (inputs / "small.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    for png in FIXTURE_INPUTS.glob("*.png"):
        shutil.copy(png, inputs / png.name)
    dirs = root / "dirs"
    # a run directory / CIFAR folder / MNIST folder / image folder made of each hostile file
    for name, data in FILES.items():
        d = dirs / name
        d.mkdir(parents=True)
        for f in ("config.json", "model.safetensors", "tokenizer.json", "vocab.json"):
            (d / f).write_bytes(data)
        for f in ("data_batch_1", "test_batch", "batches.meta"):
            (d / f).write_bytes(data)
        for f in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
            (d / f).write_bytes(data)
        (d / "a").mkdir()
        (d / "a" / "x.png").write_bytes(data)
    (dirs / "empty_dir").mkdir()
    cifar = dirs / "cifar_absurd"
    cifar.mkdir()
    for f in ("data_batch_1", "data_batch_2", "test_batch"):
        batch = {"data": _Absurd(), "labels": [0] * 10}
        (cifar / f).write_bytes(pickle.dumps(batch, protocol=2))
    (cifar / "batches.meta").write_bytes(pickle.dumps({"label_names": ["a"] * 10}, protocol=2))
    mnist = dirs / "mnist_absurd"
    mnist.mkdir()
    for split in ("train", "t10k"):
        (mnist / f"{split}-images-idx3-ubyte").write_bytes(_idx((10**9, 28, 28)))
        (mnist / f"{split}-labels-idx1-ubyte").write_bytes(_idx((10**9,)))


FILE_PATHS = [f"inputs/{n}" for n in FILES] + [f"dirs/{n}" for n in FILES]
FILE_PATHS += ["dirs/empty_dir", "dirs/cifar_absurd", "dirs/mnist_absurd", "missing/file"]


# ---------------------------------------------------------------------------------------------
# the commands: a cheap valid invocation each, and which arguments name input files


def _leaf_commands(
    parser: argparse.ArgumentParser, prefix=()
) -> dict[tuple, argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {prefix: parser}
    leaves = {}
    for action in subs:
        for name, sub in action.choices.items():
            leaves.update(_leaf_commands(sub, (*prefix, name)))
    return leaves


PARSER = build_parser()
COMMANDS = _leaf_commands(PARSER)

CPU = ["--device", "cpu"]
TRAIN = ["--steps", "3", "--batch-size", "4", "--no-progress", *CPU, "--out", OUT]
EXPERIMENT = ["--steps", "2", "--batch-size", "4", "--no-progress", *CPU, "--out", OUT]

# command -> (valid argv after the command words, option names / positional indices naming files)
CASES: dict[tuple, tuple[list[str], list]] = {
    ("train", "lm"): (
        ["--data", "inputs/small.txt", "--preset", "tiny", "--seq-len", "16", *TRAIN],
        ["--data", "--config"],
    ),
    ("train", "translate"): (
        ["--task", "numbers", "--n-examples", "100", "--high", "99", "--preset", "tiny", *TRAIN],
        ["--data", "--config"],
    ),
    ("train", "image"): (
        ["--data", "digits", "--model", "cnn", *TRAIN],
        ["--data-path", "--config"],
    ),
    ("train", "caption"): (["--n-train", "16", "--n-val", "8", *TRAIN], ["--config"]),
    ("train", "vqa"): (["--n-train", "16", "--n-val", "8", *TRAIN], ["--config"]),
    ("train", "clip"): (["--n-train", "16", "--n-val", "8", *TRAIN], ["--config"]),
    ("train", "mlm"): (
        ["--data", "inputs/small.txt", "--preset", "tiny", "--seq-len", "16", *TRAIN],
        ["--data", "--config"],
    ),
    ("train", "t5-span"): (
        ["--data", "inputs/small.txt", "--preset", "tiny", "--seq-len", "16", *TRAIN],
        ["--data", "--config"],
    ),
    ("experiment", "bottleneck"): (["--n-examples", "100", "--high", "99", *EXPERIMENT], []),
    ("experiment", "inductive-bias"): (
        ["--steps", "2", "--batch-size", "4", "--seeds", "0", "--fractions", "0.5,0.75,1"]
        + [*CPU, "--out", OUT],
        ["--data-path"],
    ),
    ("experiment", "patch-size"): (
        ["--steps", "2", "--batch-size", "4", "--seeds", "0", "--patch-sizes", "4,8"]
        + [*CPU, "--out", OUT],
        ["--data-path"],
    ),
    ("experiment", "vit-data"): (
        ["--sizes", "24,48", "--finetune-sizes", "24", "--n-val", "8", "--n-test", "16"]
        + ["--image-size", "8", *EXPERIMENT],
        [],
    ),
    ("experiment", "swin-cost"): (
        ["--image-sizes", "32,64", "--repeats", "1", *CPU, "--out", OUT],
        [],
    ),
    ("experiment", "vqa-bias"): (["--n-train", "16", "--models", "blind", *EXPERIMENT], []),
    ("experiment", "caption-retrieval"): (["--n-train", "16", "--n-eval", "4", *EXPERIMENT], []),
    ("experiment", "caption-bptt"): (["--n-train", "16", "--n-eval", "4", *EXPERIMENT], []),
    ("experiment", "clip"): (["--n-train", "16", "--n-eval", "4", *EXPERIMENT], []),
    ("experiment", "caption-features"): (
        ["--n-train", "16", "--n-eval", "4", "--pretrain-steps", "1", *EXPERIMENT],
        [],
    ),
    ("experiment", "bidirectional"): (
        ["--data", "inputs/small.txt", "--steps", "2", "--batch-size", "4", "--n-eval", "8"]
        + ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", *CPU, "--out", OUT],
        ["--data"],
    ),
    ("experiment", "exposure-bias"): (
        ["--n-examples", "100", "--high", "99", "--max-test", "8", "--batch-size", "4"]
        + ["--steps", "2", "--no-progress", *CPU, "--out", OUT],
        [],
    ),
    ("experiment", "label-smoothing"): (
        ["--n-examples", "100", "--high", "99", "--max-test", "8", "--batch-size", "4"]
        + ["--steps", "2", "--no-progress", *CPU, "--out", OUT],
        [],
    ),
    **{
        ("experiment", name): (
            ["--data", "inputs/small.txt", "--batch-size", "4", "--steps", "2", "--no-progress"]
            + [*CPU, "--out", OUT],
            ["--data"],
        )
        for name in ("extrapolation", "norm-placement", "warmup")
    },
    ("experiment", "grokking"): (
        ["--p", "5", "--d-model", "8", "--ffn-hidden", "16", "--steps", "2", "--no-progress"]
        + [*CPU, "--out", OUT],
        [],
    ),
    ("experiment", "induction-heads"): (
        ["--seq-len", "8", "--d-model", "8", "--steps", "2", "--no-progress", *CPU, "--out", OUT],
        [],
    ),
    ("experiment", "long-context"): (
        ["--data", "inputs/small.txt", "--segment", "8", "--doc-len", "16", "--n-docs", "2"]
        + ["--batch-size", "2", "--d-model", "16", "--steps", "2", "--no-progress", *CPU]
        + ["--out", OUT],
        ["--data"],
    ),
    ("experiment", "adaptive-computation"): (
        ["--max-len", "3", "--d-model", "16", "--n-test", "4", "--steps", "2", "--no-progress"]
        + [*CPU, "--out", OUT],
        [],
    ),
    ("experiment", "sequence-primitives"): (
        ["--params", "2000", "--max-distance", "8", "--dilations", "1,2", "--lengths", "8,16"]
        + ["--n-test", "4", "--steps", "2", "--batch-size", "4", "--no-progress", *CPU]
        + ["--out", OUT],
        [],
    ),
    ("experiment", "ablations"): (
        ["--seq-len", "16", "--d-model", "8", "--max-chars", "5000", "--steps", "2"]
        + ["--no-progress", "--out", OUT],
        [],
    ),
    ("prepare",): (["--data", "inputs/small.txt", "--workers", "1", "--out", OUT], ["--data"]),
    ("generate",): (
        ["runs/lm_gpt2", "--prompt", "The ", "-n", "5", "--temperature", "0"],
        [0, ("--from-hf", 0)],
    ),
    ("demo",): (["--steps", "2", *CPU, "--out", OUT], []),
    ("translate",): (["runs/tr_rnn", "twenty one"], [0, ("--file", 1)]),
    ("classify",): (["runs/img_cnn", "inputs/digit_7.png"], [0, 1]),
    ("samples",): (["runs/img_cnn", "--n", "3", "--out", OUT], [0]),
    ("caption",): (["runs/cap_lstm", "inputs/scene_0.png"], [0, 1]),
    ("ask",): (["runs/vqa_lstm", "inputs/scene_0.png", "what colour is the circle?"], [0, 1]),
    ("zero-shot",): (["runs/clip", "inputs/scene_0.png", "--prompts", "a red circle"], [0, 1]),
    ("scene",): (["--out", OUT], []),
    ("bench", "attention"): (["--n", "32", "--backends", "math", "--out", OUT], []),
    ("bench", "long-context"): (["--seq-len", "32", "--preset", "tiny", "--no-measure"], []),
    ("convert",): (
        ["--to-hf", "runs/lm_gpt2", "--out", OUT],
        ["--to-hf", ("--from-hf", "--to-hf")],
    ),
    ("explore",): (
        ["runs/lm_gpt2", "--input", "The cat", "--out", "out/page.html"],
        [0, "--input"],
    ),
    ("fill-mask",): (["runs/mlm", "the [MASK] fox"], [0]),
    ("fill-spans",): (["runs/t5", "the <extra_id_0> fox", "--max-len", "4"], [0]),
    ("inspect",): (
        ["runs/lm_gpt2", "--batch", "2", "--length", "4", "--no-ablation", "--out", OUT],
        [0],
    ),
    ("eval",): (["runs/lm_gpt2", "--max-batches", "1", "--batch-size", "2"], [0]),
}


def test_every_command_has_a_case():
    assert sorted(COMMANDS) == sorted(CASES)


# ---------------------------------------------------------------------------------------------
# strategies


def _options(command: tuple) -> list[argparse.Action]:
    return [
        a
        for a in COMMANDS[command]._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]


NUMBERS = st.sampled_from(
    ["0", "-1", "-7", "1e400", "-1e400", "nan", "inf", "-inf", "99999999999999999999", "1e-320"]
)
WORDS = st.sampled_from(["", " ", "x", "cpu:99", "cuda", "none", "=", "a=b", "\x00", "é", "../x"])
SETTINGS_KV = st.builds(
    "{}={}".format,
    st.sampled_from(["d_model", "n_heads", "train.lr", "task.seq_len", "model.preset", "x", ""]),
    st.one_of(NUMBERS, WORDS, st.just("[1, 2]"), st.just("{}")),
)


# --out: a file, a path under a file, odd names; never outside out/ or onto the fixtures
# (out/file is a file made before each example: a train refuses it, explore overwrites it)
OUTS = st.sampled_from(["", "out/file", "inputs/empty/run", "out/a b", "out/\xe9", "out/-1"])


# any flag may get a number, a word, a random string or a hostile file's path
VALUES = st.one_of(
    NUMBERS,
    WORDS,
    st.integers(-1000, 1000).map(str),
    st.floats().map(str),
    st.text(max_size=8),
    st.sampled_from(FILE_PATHS),
)


INTS = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "2147483648", "99999999999999999999"]),
    st.integers(-1000, 1000).map(str),  # (a count of 10^6 is valid, and slow)
)
FLOATS = st.one_of(
    st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e400", "1e-320", "0.5", "1"]),
    st.floats().map(str),
)


# flags whose large values are valid and slow (generate -n 10^9 writes a billion tokens)
BOUNDED = {"--max-new-tokens"}


def _typed(action: argparse.Action) -> st.SearchStrategy[str]:
    """Mostly values argparse lets through (to reach the command's own checks), some not."""
    if action.option_strings[-1] in BOUNDED:
        return st.one_of(st.integers(-3, 20).map(str), st.sampled_from(["", "x", "1.5", "nan"]))
    if action.choices:
        return st.one_of(st.sampled_from([str(c) for c in action.choices]), VALUES)
    if action.type is int:
        return st.one_of(INTS, VALUES)
    if action.type is float:
        return st.one_of(FLOATS, VALUES)
    return VALUES


@st.composite
def invocations(draw, command: tuple) -> list[str]:
    """The valid invocation of ``command`` with some flags and input files made hostile."""
    base, file_slots = CASES[command]
    argv = list(base)
    # hostile input files in the slots that name files: a positional's index, a flag, or
    # (flag, what it replaces: a positional's index or a flag), e.g. convert --from-hf for --to-hf
    for slot in file_slots:
        if not draw(st.booleans()):
            continue
        path = draw(st.sampled_from(FILE_PATHS))
        if isinstance(slot, tuple):
            slot, replaced = slot
            if isinstance(replaced, int):
                argv[replaced] = None
            elif replaced in argv:
                i = argv.index(replaced)
                argv[i : i + 2] = [None, None]
        if isinstance(slot, int):
            argv[slot] = path  # the valid invocations give their positionals first
        elif slot in argv:
            argv[argv.index(slot) + 1] = path
        else:
            argv += [slot, path]
        if slot == "--data-path":  # a folder is read only with a --data that reads folders
            argv += ["--data", draw(st.sampled_from(["folder", "cifar10", "mnist"]))]
    argv = [a for a in argv if a is not None]
    # random values (and types) for some flags
    options = _options(command)
    for action in draw(st.lists(st.sampled_from(options), min_size=1, max_size=3, unique_by=id)):
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
            continue
        if flag == "--out":
            value = OUTS
        elif flag == "--set":
            value = SETTINGS_KV
        else:
            value = _typed(action)
        argv += [flag, draw(value)]
    return [*command, *argv]


# ---------------------------------------------------------------------------------------------
# the sandbox shared by all examples of one command


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    """``root/work`` (the working directory: inputs, dirs, runs), ``root/home``, ``root/cache``."""
    work = tmp_path_factory.mktemp("cli") / "work"
    work.mkdir()
    _write_inputs(work)
    runs = work / "runs"
    for name in ("lm_gpt2", "tr_rnn", "img_cnn", "cap_lstm", "vqa_lstm"):
        shutil.copytree(FIXTURE_RUNS / name, runs / name)
    tiny_mlm = [*CASES[("train", "mlm")][0], "--steps", "2", "--eval-every", "2"]
    tiny_mlm[tiny_mlm.index(OUT)] = str(runs / "mlm")
    cache = work.parent / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNLAB_CACHE", str(cache))
        mp.setenv("HOME", str(work.parent / "home"))
        mp.chdir(work)
        assert main(["train", "mlm", *tiny_mlm]) == 0
        tiny_t5 = [*CASES[("train", "t5-span")][0], "--steps", "2", "--eval-every", "2"]
        tiny_t5[tiny_t5.index(OUT)] = str(runs / "t5")
        assert main(["train", "t5-span", *tiny_t5]) == 0
        tiny_clip = [*CASES[("train", "clip")][0], "--image-size", "16", "--eval-every", "3"]
        tiny_clip += ["--set", "task.eval_scenes=4"]
        tiny_clip[tiny_clip.index(OUT)] = str(runs / "clip")
        assert main(["train", "clip", *tiny_clip]) == 0  # (for zero-shot)
    return work


def _property(sandbox: Path, argv: list[str]) -> None:
    out = sandbox / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    (out / "file").write_text("not a directory\n")
    before = set(sandbox.iterdir())
    try:
        outcome = invoke(argv, sandbox)
        if outcome.status in (0, "trained"):
            check_accepted(outcome, writes=["out"])
        else:
            check_refused(outcome, writes=["out"])
    finally:  # what a failing example wrote must not change the next one
        for path in set(sandbox.iterdir()) - before:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
        shutil.rmtree(out, ignore_errors=True)


# failing examples found by these tests, kept as explicit examples (the product was fixed)
EXAMPLES: dict[tuple, list[list[str]]] = {
    # an empty --out wrote into the working directory (fix: refused, cli._check_paths)
    # --image-size 100000 ended in a MemoryError traceback (fix: SceneConfig's upper bound)
    ("scene",): [["--out", ""], ["--out", OUT, "--image-size", "100000"]],
    ("experiment", "bottleneck"): [[*CASES[("experiment", "bottleneck")][0], "--out", ""]],
    # an empty --data read the working directory as the corpus (fix: refused, cli._check_paths)
    ("experiment", "bidirectional"): [
        [*CASES[("experiment", "bidirectional")][0], "--data", "", "--max-chars", "10"]
    ],
    # --threads 0 ended in torch's RuntimeError traceback (fix: run_demo checks its settings)
    ("demo",): [
        [*CASES[("demo",)][0], "--threads", "0"],
        [*CASES[("demo",)][0], "--budget", "nan"],
    ],
    # an empty corpus was refused but left its lock file in the cache (fix: prepare._locked)
    # (and --data "" trained on the working directory's files)
    ("train", "lm"): [
        ["--data", "inputs/empty", *CASES[("train", "lm")][0][2:]],
        ["--data", "", *CASES[("train", "lm")][0][2:]],
    ],
    # a bad --device was found only after the model summary line (fix: checked before the corpus)
    ("train", "mlm"): [[*CASES[("train", "mlm")][0], "--device", "0"]],
    ("prepare",): [["--data", "inputs/empty", "--out", OUT]],
}


def _make_test(command: tuple) -> Callable:
    @SETTINGS
    @given(argv=invocations(command))
    def test(sandbox, argv):
        _property(sandbox, argv)

    for argv in EXAMPLES.get(command, []):
        test = example(argv=[*command, *argv])(test)

    test.__name__ = "test_" + "_".join(command).replace("-", "_")
    return test


for _command in CASES:
    _test = _make_test(_command)
    globals()[_test.__name__] = _test


def test_the_valid_invocations_are_accepted(sandbox):
    """The starting points themselves reach the work (or end with 0) and write only --out."""
    for command, (base, _) in CASES.items():
        try:
            check_accepted(invoke([*command, *base], sandbox), writes=["out"])
        finally:
            shutil.rmtree(sandbox / "out", ignore_errors=True)

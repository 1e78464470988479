"""Checkpoints that lie: a config is checked against its weights' header before anything is built.

Hugging Face folders (GPT-2, Llama, BERT, ViT, made by transformers with random weights) and
attnlab run directories (every family, from ``tests/fixtures``) get configs edited to disagree
with their weights in width, depth, vocabulary and head count. Loading them runs in a
subprocess under a 4 GiB address-space limit (``RLIMIT_AS``): enough for torch, far below what
the lying configs ask for (the issue's case, 2,000,000 wide and 200 layers, is ~10^13
parameters), so an allocation before the check would fail there instead of giving the line.
All the cases run in one such process (one torch import): the Python API and the commands
(``attnlab.cli.main``); the issue's own case also as a separate ``attnlab`` process.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file
from torch import nn

from attnlab.checkpoint_check import (
    Header,
    build_on_meta,
    explain,
    implied_size,
    model_shapes,
    read_header,
    sharded_header,
)
from attnlab.cli import main
from attnlab.errors import RunDirError, UserError
from attnlab.interop import from_hf
from attnlab.models.registry import get_kind, known_kinds
from attnlab.runs import single_process_dcp

FIXTURES = Path(__file__).parent / "fixtures" / "release_0_1" / "runs"
LIMIT = 4 << 30  # bytes of address space for the child processes


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def run_limited(argv: list[str], **kw) -> subprocess.CompletedProcess:
    """``argv`` in a subprocess whose address space is limited to 4 GiB."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    return subprocess.run(
        argv, preexec_fn=_limit_memory, capture_output=True, text=True, env=env, timeout=300, **kw
    )


def attnlab_cli(*args: str) -> subprocess.CompletedProcess:
    return run_limited([sys.executable, "-m", "attnlab.cli", *args])


def assert_one_error_line(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit status 2, no traceback, and one ``attnlab: error:`` line holding ``fragments``."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("attnlab: error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr[-2000:]
    for f in fragments:
        assert f in errors[0], errors[0]
    return errors[0]


def edit_config(src: Path, dst: Path, section: str | None = None, **changes) -> Path:
    """A copy of the checkpoint ``src`` whose config.json (or its ``section``) has ``changes``."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (cfg[section] if section else cfg).update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


# ---- the folders -------------------------------------------------------------------------------


def _save(model: nn.Module, path: Path) -> Path:
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    tiny = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=32)
    gpt2 = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=61, n_positions=40)
    llama = transformers.LlamaConfig(
        vocab_size=61,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    bert = transformers.BertConfig(
        vocab_size=61,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=40,
    )
    vit = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        num_labels=3,
    )
    return {
        "tiny": _save(transformers.GPT2LMHeadModel(tiny), root / "tiny"),
        "gpt2": _save(transformers.GPT2LMHeadModel(gpt2), root / "gpt2"),
        "llama": _save(transformers.LlamaForCausalLM(llama), root / "llama"),
        "bert": _save(transformers.BertForMaskedLM(bert), root / "bert"),
        "vit": _save(transformers.ViTForImageClassification(vit), root / "vit"),
    }


@pytest.fixture(scope="module")
def issue_dir(hf_dirs, tmp_path_factory) -> Path:
    """The issue's folder: a 1-layer, 16-wide GPT-2 whose config.json says 2,000,000 x 200."""
    dst = tmp_path_factory.mktemp("issue") / "gpt2"
    return edit_config(hf_dirs["tiny"], dst, n_embd=2_000_000, n_layer=200)


# (folder, edit, what the line must say)
HF_CASES = {
    "gpt2-width": ("gpt2", {"n_embd": 64}, "config says n_embd=64; the weights have 32"),
    "gpt2-depth": ("gpt2", {"n_layer": 3}, "config says n_layer=3; the weights have 2"),
    "gpt2-shallow": ("gpt2", {"n_layer": 1}, "config says n_layer=1; the weights have 2"),
    "gpt2-vocab": ("gpt2", {"vocab_size": 99}, "config says vocab_size=99; the weights have 61"),
    "gpt2-width-vocab": (
        "gpt2",
        {"n_embd": 64, "vocab_size": 99},
        "config says n_embd=64; the weights have 32 | config says vocab_size=99; the weights "
        "have 61",
    ),
    "gpt2-huge": (
        "tiny",
        {"n_embd": 4_000_000},
        "config says n_embd=4000000; the weights have 16",
    ),
    "llama-width": (
        "llama",
        {"hidden_size": 128},
        "config says hidden_size=128; the weights have 64",
    ),
    "llama-depth": (
        "llama",
        {"num_hidden_layers": 3},
        "config says num_hidden_layers=3; the weights have 2",
    ),
    "llama-vocab": ("llama", {"vocab_size": 99}, "config says vocab_size=99; the weights have 61"),
    "llama-kv-heads": (
        "llama",
        {"num_key_value_heads": 4},
        "config says num_key_value_heads=4; the weights have 2",
    ),
    "llama-heads": (
        "llama",
        {"num_attention_heads": 4},
        "config says num_attention_heads=4; the weights have 8",
    ),
    "bert-width": ("bert", {"hidden_size": 64}, "config says hidden_size=64; the weights have 32"),
    "bert-depth": (
        "bert",
        {"num_hidden_layers": 5},
        "config says num_hidden_layers=5; the weights have 2",
    ),
    "bert-vocab": ("bert", {"vocab_size": 99}, "config says vocab_size=99; the weights have 61"),
    "vit-width": ("vit", {"hidden_size": 64}, "config says hidden_size=64; the weights have 32"),
    "vit-depth": (
        "vit",
        {"num_hidden_layers": 3},
        "config says num_hidden_layers=3; the weights have 2",
    ),
    "vit-patch": ("vit", {"patch_size": 8}, "config says patch_size=8; the weights have 4"),
}

# (fixture run, edit of config.json's model, what the message must say)
RUN_CASES = {
    "lm-width": (
        "lm_gpt2",
        {"d_model": 4_000_000},
        "config says d_model=4000000; the weights have 32",
    ),
    "lm-depth": ("lm_gpt2", {"n_layers": 3}, "config says n_layers=3; the weights have 2"),
    "lm-vocab": ("lm_gpt2", {"vocab_size": 99}, "config says vocab_size=99; the weights have 100"),
    "lm-heads": ("lm_gpt2", {"n_heads": 8}, "config says n_heads=8; the weights have 4"),
    "lm-kv-heads": ("lm_llama", {"n_kv_heads": 4}, "config says n_kv_heads=4; the weights have 2"),
    "lm-context": (
        "lm_gpt2",
        {"max_seq_len": 10**9},
        "config says max_seq_len=1000000000; the weights have 64",
    ),
    "lm-million-layers": (
        "lm_llama",
        {"n_layers": 10**6},
        "config says n_layers=1000000; the weights have 2 layers",
    ),
    "moe-experts": (
        "lm_moe_alibi",
        {"n_experts": 8},
        "config says n_experts=8; the weights have 4",
    ),
    "lstm-width": ("lm_lstm", {"hidden": 128}, "config says hidden=128; the weights have 64"),
    "lstm-vocab": (
        "lm_lstm",
        {"vocab_size": 10**8},
        "config says vocab_size=100000000; the weights have 100",
    ),
    "seq2seq-width": (
        "tr_transformer",
        {"d_model": 128},
        "config says d_model=128; the weights have 64",
    ),
    "seq2seq-depth": (
        "tr_transformer",
        {"n_enc_layers": 3},
        "config says n_enc_layers=3; the weights have 2",
    ),
    "seq2seq-vocab": (
        "tr_transformer",
        {"tgt_vocab_size": 99},
        "config says tgt_vocab_size=99; the weights have 181",
    ),
    "lstm-depth": ("lm_lstm", {"n_layers": 2}, "config says n_layers=2; the weights have 1"),
    "rnn-depth": ("tr_rnn_attn", {"n_layers": 2}, "config says n_layers=2; the weights have 1"),
    "seq2seq-sinusoid-buffer": (
        "tr_transformer",
        {"max_seq_len": 10**9},
        "config says max_seq_len=1000000000; the weights have no dimension above 192",
    ),
    "rnn-width": ("tr_rnn_attn", {"hidden": 32}, "config says hidden=32; the weights have 64"),
    "vit-width": ("img_vit", {"d_model": 32}, "config says d_model=32; the weights have 64"),
    "vit-depth": ("img_vit", {"n_layers": 3}, "config says n_layers=3; the weights have 2"),
    "swin-depth": ("img_swin", {"depths": [2, 4]}, "config says depths[1]=4; the weights have 2"),
    "swin-heads": ("img_swin", {"n_heads": [2, 8]}, "config says n_heads[1]=8; the weights have 4"),
    "cnn-width": ("img_cnn", {"channels": [32, 128]}, "config says channels[1]=128; the weights"),
    "caption-width": ("cap_transformer", {"d_model": 96}, "config says d_model=96; the weights"),
    "caption-vocab": ("cap_transformer", {"vocab_size": 99}, "config says vocab_size=99; the"),
    "vqa-answers": ("vqa_transformer", {"n_answers": 30}, "config says n_answers=30; the weights"),
    "vqa-depth": (
        "vqa_transformer",
        {"encoder_depth": 4},
        "config says encoder_depth=4; the weights have 3",
    ),
}

# loads every case in one process under the limit; prints {case: message or "LOADED"}
_CHILD = """
import contextlib, io, json, sys
import attnlab
from attnlab.errors import UserError
from attnlab.interop import from_hf
from attnlab.cli import main
out = {}
for name, (how, arg) in json.load(open(sys.argv[1])).items():
    if how == "cli":  # the command line in this process: its status and stderr
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                status = main(arg)
            except SystemExit as exit:  # a usage error
                status = exit.code
        out[name] = [status, err.getvalue()]
        continue
    try:
        (from_hf if how == "hf" else attnlab.load)(arg)
        out[name] = "LOADED"
    except UserError as err:
        out[name] = type(err).__name__ + ": " + str(err)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def refusals(hf_dirs, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("lying")
    cases = {}
    for name, (src, edit, _) in HF_CASES.items():
        cases[name] = ("hf", str(edit_config(hf_dirs[src], root / name, **edit)))
    for name, (src, edit, _) in RUN_CASES.items():
        cases[f"run-{name}"] = (
            "run",
            str(edit_config(FIXTURES / src, root / f"run-{name}", "model", **edit)),
        )
    # a config with no weights beside it: nothing to check it against, nothing is built
    no_weights = edit_config(hf_dirs["tiny"], root / "hf-no-weights", n_embd=2_000_000)
    (no_weights / "model.safetensors").unlink()
    cases["hf-no-weights"] = ("hf", str(no_weights))
    run_no_weights = edit_config(FIXTURES / "lm_gpt2", root / "run-no-weights", "model")
    (run_no_weights / "model.safetensors").unlink()
    (run_no_weights / "best.safetensors").unlink(missing_ok=True)
    cases["run-no-weights"] = ("run", str(run_no_weights))
    # commands that load a run or a folder (in the child: under the limit, one torch import)
    lying = edit_config(
        FIXTURES / "lm_gpt2", root / "cli-lm", "model", d_model=2_000_000, n_layers=200
    )
    cases["cli-generate"] = ("cli", ["generate", str(lying), "--prompt", "a", "-n", "2"])
    resumed = edit_config(lying, root / "cli-resume")
    (resumed / "state.pt").write_bytes(b"")  # (refused before the state is read)
    cases["cli-resume"] = ("cli", ["train", "lm", "--resume", "--out", str(resumed)])
    vit = edit_config(FIXTURES / "img_vit", root / "cli-vit", "model", d_model=10**6)
    cases["cli-classify"] = (
        "cli",
        ["classify", str(vit), str(FIXTURES.parent / "inputs" / "digit_7.png")],
    )
    cases["cli-to-hf"] = ("cli", ["convert", "--to-hf", str(vit), "--out", str(root / "vit-hf")])
    cases["cli-no-weights"] = (
        "cli",
        ["convert", "--from-hf", str(no_weights), "--out", str(root / "no-weights-run")],
    )
    (root / "cases.json").write_text(json.dumps(cases))
    proc = run_limited([sys.executable, "-c", _CHILD, str(root / "cases.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_memory_limit_binds():
    """The limit is real: 8 GiB cannot be had under it (so the refusals below allocate less)."""
    proc = run_limited([sys.executable, "-c", "bytearray(8 << 30)"])
    assert proc.returncode != 0 and "MemoryError" in proc.stderr


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_a_hugging_face_folder_that_lies_is_refused_by_field(refusals, case):
    message = refusals[case]
    assert message.startswith("UserError: cannot load ") and "\n" not in message, message
    assert HF_CASES[case][2] in message


@pytest.mark.parametrize("case", sorted(RUN_CASES))
def test_a_run_directory_that_lies_is_refused_by_field(refusals, case):
    message = refusals[f"run-{case}"]
    assert message.startswith("RunDirError: cannot load ") and "\n" not in message, message
    assert RUN_CASES[case][2] in message
    assert "nothing was built" in message


def test_a_config_without_weights_is_refused_without_building(refusals):
    assert "has no model.safetensors" in refusals["hf-no-weights"]
    assert "has no weights file model.safetensors" in refusals["run-no-weights"]


def test_the_issue_case_through_the_cli_is_one_line(issue_dir, tmp_path):
    """``attnlab convert --from-hf`` of the issue's folder: exit 2, one line, no run written."""
    out = tmp_path / "run"
    proc = attnlab_cli("convert", "--from-hf", str(issue_dir), "--out", str(out))
    assert_one_error_line(
        proc,
        "config says n_layer=200; the weights have 1 layer",
        "config says n_embd=2000000; the weights have 16",
    )
    assert not out.exists()


def refused_in_one_line(outcome: list, *fragments: str) -> str:
    """A command run in the child: status 2 and one ``attnlab: error:`` line holding
    ``fragments`` on its stderr (a traceback would have ended the child instead)."""
    status, err = outcome
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("attnlab: error:"), err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_generate_and_resume_of_a_run_that_lies_are_one_line(refusals):
    claims = (
        "config says n_layers=200; the weights have 2 layers",
        "config says d_model=2000000; the weights have 32",
    )
    refused_in_one_line(refusals["cli-generate"], "cannot load", *claims)
    refused_in_one_line(refusals["cli-resume"], "cannot resume", *claims)


def test_classify_and_convert_of_a_vit_run_that_lies_are_one_line(refusals):
    claim = "config says d_model=1000000; the weights have 64"
    refused_in_one_line(refusals["cli-classify"], claim)
    refused_in_one_line(refusals["cli-to-hf"], claim)


def test_a_caption_resume_checks_the_config_before_building(tmp_path, capsys):
    run = edit_config(FIXTURES / "cap_transformer", tmp_path / "run", "model", d_model=96)
    (run / "state.pt").write_bytes(b"")
    assert main(["train", "caption", "--resume", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "cannot resume" in err and "config says d_model=96; the weights have 48" in err


def test_convert_of_a_folder_without_weights_is_one_line(refusals):
    refused_in_one_line(refusals["cli-no-weights"], "has no model.safetensors")


def test_a_folder_that_tells_the_truth_still_loads(hf_dirs):
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dirs["gpt2"]).eval()
    ours = from_hf(hf_dirs["gpt2"])
    idx = torch.randint(0, 61, (1, 7))
    torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-4, atol=1e-5)


# ---- the pieces ---------------------------------------------------------------------------------


def test_read_header_gives_shapes_and_bytes_without_data(tmp_path):
    tensors = {"a": torch.zeros(3, 5), "b": torch.zeros(7, dtype=torch.bfloat16)}
    save_file(tensors, str(tmp_path / "w.safetensors"))
    header = read_header([tmp_path / "w.safetensors"])
    assert header.shapes == {"a": (3, 5), "b": (7,)}
    assert header.nbytes == sum(t.numel() * t.element_size() for t in tensors.values())
    assert header.numel == 22 and header.count == 2
    with pytest.raises(RunDirError, match="does not exist"):
        read_header([tmp_path / "none.safetensors"], error=RunDirError)
    (tmp_path / "bad.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{not json")
    with pytest.raises(
        UserError, match=r"cannot read weights .*bad.safetensors \(not safetensors\)"
    ):
        read_header([tmp_path / "bad.safetensors"])


def test_sharded_header_reads_a_distributed_checkpoint_without_data(tmp_path):
    import torch.distributed.checkpoint as dcp  # heavy (~1.5 s): this test only

    tensors = {"a.weight": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16)}
    with single_process_dcp():
        dcp.save({"model": tensors, "step": 3}, checkpoint_id=str(tmp_path), no_dist=True)
    header = sharded_header(tmp_path)
    assert header.shapes == {"a.weight": (3, 4), "b": (5,)}
    assert header.nbytes == sum(t.numel() * t.element_size() for t in tensors.values())


def test_a_build_too_deep_for_its_weights_is_stopped_early():
    """A config asking for 10^6 blocks (by a field not named like a layer count) stops after
    the budget of 4 K + 64 tensors: the constructor's loop never gets far."""
    header = Header({"0.weight": (4, 4), "0.bias": (4,)}, 80, "w.safetensors")
    made = []

    def shapes_of(cfg):
        def block():
            made.append(1)
            return nn.Linear(4, 4)

        model = nn.Sequential(*(block() for _ in range(cfg["blocks"])))
        return model, model_shapes(model)[0], dict(header.shapes)

    with pytest.raises(UserError, match=r"more than 72 tensors, but w.safetensors holds 2"):
        build_on_meta(shapes_of, {"blocks": 10**6}, header, what="x")
    assert len(made) <= 4 * header.count + 64
    built = build_on_meta(shapes_of, {"blocks": 1}, header, what="x")  # the truth builds
    assert all(p.is_meta for p in built.model.parameters())


def test_implied_size_counts_tied_tensors_once():
    model = get_kind("decoder_lm").build(get_kind("decoder_lm").config_cls(tie_embeddings=True))
    unique = {id(t): t for t in (*model.parameters(), *model.buffers())}
    assert implied_size(model) == sum(t.numel() for t in unique.values())
    assert implied_size(model) < sum(t.numel() for t in model.state_dict().values())


@pytest.mark.parametrize("kind", known_kinds())
def test_every_kind_builds_on_meta_with_the_real_shapes(kind):
    """The check builds every family on the meta device: same names and shapes as a real
    build, no storage."""
    k = get_kind(kind)
    with torch.device("meta"):
        meta = k.build(k.config_cls())
    real = k.build(k.config_cls())
    assert model_shapes(meta)[0] == model_shapes(real)[0]
    assert all(t.is_meta for t in meta.state_dict().values())


def test_explain_names_the_field_whose_value_is_the_mismatched_dimension():
    expected = {"emb": (50, 64), "h.0.w": (64, 64), "h.1.w": (64, 64)}
    found = {"emb": (50, 16), "h.0.w": (16, 16)}
    config = {"d_model": 64, "n_layers": 2, "vocab_size": 50}
    why = explain(expected, found, config)
    assert "config says n_layers=2; the weights have 1" in why
    assert "config says d_model=64; the weights have 16" in why
    assert explain(expected, expected, config) is None

"""Run directories written by the first release (tests/fixtures/release_0_1) still load and give the
same outputs: the CLI prints what 0.1.0 printed, and the models compute the logits 0.1.0 computed on
the stored inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import attnlab
from attnlab.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "release_0_1"
EXPECTED = json.loads((FIXTURES / "expected_cli.json").read_text())
RUNS = sorted(p.name for p in (FIXTURES / "runs").iterdir())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A copy of the fixtures, so that nothing a command writes lands in the repository."""
    root = tmp_path_factory.mktemp("release_0_1")
    shutil.copytree(FIXTURES / "runs", root / "runs")
    shutil.copytree(FIXTURES / "inputs", root / "inputs")
    return root


def test_every_fixture_run_has_cli_expectations():
    assert sorted(EXPECTED) == RUNS


@pytest.mark.parametrize("name", RUNS)
def test_cli_output_unchanged(name, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    for case in EXPECTED[name]:
        args = [a.format(run=f"runs/{name}", inputs="inputs") for a in case["args"]]
        capsys.readouterr()
        assert main(args) == 0, args
        assert capsys.readouterr().out == case["stdout"], args


def _logits(model: torch.nn.Module, kind: str, t: dict[str, torch.Tensor]) -> torch.Tensor:
    if kind in ("decoder_lm", "lstm_lm", "bigram_lm"):
        return model(t["idx"])
    if kind in ("rnn", "rnn-attn", "transformer"):
        return model(t["src"], t["src_mask"], t["tgt_in"])
    if kind in ("vit", "swin", "cnn"):
        return model(t["images"])
    if kind.startswith("caption"):
        return model(t["images"], t["tokens"])
    if kind.startswith("vqa"):
        return model(t["images"], t["questions"], t["lengths"])
    raise AssertionError(f"no reference call for kind {kind!r}")


@pytest.mark.parametrize("name", RUNS)
def test_logits_unchanged(name):
    run = FIXTURES / "runs" / name
    kind = json.loads((run / "config.json").read_text())["kind"]
    model, _ = attnlab.load(run)
    ref = load_file(run / "reference_outputs.safetensors")
    with torch.no_grad():
        out = _logits(model, kind, ref)
    torch.testing.assert_close(out, ref["logits"], atol=1e-5, rtol=1e-5)

"""Files a user is handed and opens with attnlab run no code from them: a YAML config is read with
``yaml.safe_load`` (a tag that builds a Python object is one error line, nothing runs), and a
crafted ``state.pt`` whose pickle would run code when unpickled is refused by ``--resume`` and by
the progress check, with its payload shown to be live under a plain ``torch.load``."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
import yaml

from attnlab.cli import main
from attnlab.errors import RunDirError
from attnlab.train import train
from attnlab.train.stopping import saved_progress
from test_train import ToyTask, base_cfg, make_model


def test_a_yaml_config_file_end_to_end(tmp_path):
    (tmp_path / "run.yaml").write_text(
        "kind: decoder_lm\n"
        "model:\n  preset: llama-tiny\n  d_model: 32\n"
        "train: {steps: 1, batch_size: 4, lr: 3.0e-3, progress: false}\n"
        "task:\n  seq_len: 16\n  max_chars: 30000\n"
    )
    run = tmp_path / "run"
    assert main(["train", "lm", "--config", str(tmp_path / "run.yaml"), "--out", str(run)]) == 0
    cfg = json.loads((run / "config.json").read_text())
    m = cfg["model"]
    assert (m["position"], m["n_kv_heads"], m["d_model"], m["max_seq_len"]) == ("rope", 2, 32, 16)
    assert cfg["train"]["lr"] == 3e-3 and cfg["train"]["steps"] == 1
    assert cfg["task"]["max_chars"] == 30000


def test_a_yaml_tag_that_builds_an_object_is_refused_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.yml"
    evil.write_text(
        f"kind: decoder_lm\nmodel: !!python/object/apply:builtins.open ['{marker}', w]\n"
    )
    with pytest.raises(yaml.constructor.ConstructorError):  # the loader safe_load stands for
        yaml.safe_load(evil.read_text())
    assert main(["train", "lm", "--config", str(evil), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab: error: config file {evil} is not valid yml: line 2, column 8")
    assert "python/object/apply:builtins.open" in err and "plain values only" in err
    assert err.count("\n") == 1 and not marker.exists() and not (tmp_path / "run").exists()
    yaml.unsafe_load(evil.read_text()).get("model").close()  # the payload is live: it would run
    assert marker.exists()


class Payload:
    """Unpickled, it writes ``path`` (as a malicious checkpoint would run anything)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self):
        return pathlib.Path.write_text, (self.path, "code from state.pt ran")


def test_a_state_pt_carrying_a_pickle_payload_is_refused(tmp_path):
    run, marker = tmp_path / "run", tmp_path / "marker"
    cfg = base_cfg(steps=2, eval_every=2)
    train(make_model(), ToyTask(), cfg, run)
    state = torch.load(run / "state.pt", weights_only=True)
    assert saved_progress(run)["step"] == 2  # the untouched file is read
    state["progress"]["note"] = Payload(marker)
    torch.save(state, run / "state.pt")

    with pytest.raises(RunDirError, match="cannot read .*state.pt: the file is damaged") as err:
        train(make_model(), ToyTask(), base_cfg(steps=4, eval_every=2), run, resume=True)
    assert "\n" not in str(err.value)
    assert saved_progress(run) is None  # (the resume check reports nothing, runs nothing)
    assert not marker.exists()
    torch.load(run / "state.pt", weights_only=False)  # the payload is live: it would run
    assert marker.read_text() == "code from state.pt ran"

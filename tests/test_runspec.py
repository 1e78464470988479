"""The run description built by the library: ``attnlab.runs.resolve`` and ``build_run``.

Priorities (defaults < file < typed flags < --set), derived fields (vocabulary, context), the
budget rule's trigger and the resume checks, for the two families on it (lm, mlm).
"""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError, EncoderConfig, ModelConfig
from attnlab.errors import UserError
from attnlab.runs import RunSpec, build_run, resolve
from attnlab.runspec.budget import choose_lm_settings


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))


def test_priorities_defaults_file_flags_set():
    file = {"model": {"preset": "gpt2-mini", "n_heads": 2}, "train": {"lr": 1e-3, "steps": 5}}
    spec = resolve(
        file,
        {"train.lr": 2e-3, "task.seq_len": 32},
        ["train.lr=4e-3", "d_model=64"],
        defaults={"train.lr": 1.0, "train.batch_size": 8},
    )
    assert isinstance(spec, RunSpec) and spec.kind == "decoder_lm" and not spec.auto
    assert spec.train.lr == 4e-3 and spec.train.batch_size == 8 and spec.train.steps == 5
    preset = ModelConfig.PRESETS["gpt2-mini"]
    assert spec.model["n_layers"] == preset["n_layers"] and spec.model["n_heads"] == 2
    assert spec.model["d_model"] == 64  # an undotted --set key is a model field
    assert spec.model["max_seq_len"] == spec.task.seq_len == 32  # the context is the window
    assert spec.task.seed == spec.train.seed  # the task's seed follows the training seed


def test_a_typed_steps_replaces_the_files_budget():
    spec = resolve({"train": {"max_time": 60.0}}, {"train.steps": 3}, [], family="lm")
    assert spec.train.steps == 3 and spec.train.max_time is None


def test_no_model_named_leaves_the_model_to_the_budget_rule():
    spec = resolve(None, {"train.steps": 10, "train.batch_size": 4}, [])
    assert "model" in spec.auto and "train.lr" in spec.auto
    assert "train.batch_size" not in spec.auto  # given: kept
    assert not resolve(None, {"train.steps": 10, "model.preset": "tiny"}, []).auto
    lstm = resolve(None, {"train.steps": 10, "kind": "lstm_lm"}, [])
    assert lstm.kind == "lstm_lm" and not lstm.auto  # the rule is for the Transformer
    # the token shift is a wiring of the rule's rows, not a size: the rule still chooses
    shift = resolve(None, {"train.steps": 10}, ["model.token_shift=false"])
    assert "model" in shift.auto and shift.model["token_shift"] is False
    assert not resolve(None, {"train.steps": 10}, ["model.qk_norm=rmsnorm"]).auto


def test_mlm_adds_its_specials_and_starts_from_the_tiny_preset():
    spec = resolve(None, {"train.steps": 1}, [], family="mlm")
    assert spec.kind == "encoder_mlm" and spec.task.type == "mlm"
    assert spec.model["d_model"] == EncoderConfig.PRESETS["tiny"]["d_model"]
    # a run's config.json records vocab = tokenizer + 4 specials: read back, it is derived again
    saved = {"model": {"vocab_size": 104, "d_model": 64}, "task": {"vocab_size": 100}}
    again = resolve(saved, {"train.steps": 1}, [], family="mlm")
    assert again.model.get("vocab_size") != 104 and again.model["d_model"] == 64
    assert again.model_config(vocab_size=58).vocab_size == 58


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sets=["vocab_size=300"]), "comes from the tokenizer"),
        (dict(sets=["max_seq_len=64"], flags={"task.seq_len": 32}), "disagree"),
        (dict(flags={"model.preset": "nope"}), "unknown ModelConfig preset 'nope'"),
        (dict(config_file={"kind": "vit", "model": {}}), "is not a language model"),
    ],
)
def test_bad_settings_are_named(kwargs, match):
    flags = {"train.steps": 1, **kwargs.pop("flags", {})}
    with pytest.raises((UserError, ConfigError), match=match):
        resolve(kwargs.get("config_file"), flags, kwargs.get("sets", []))


def test_a_resume_refuses_settings_that_contradict_the_run():
    saved = resolve(None, {"train.steps": 2, "model.preset": "tiny", "task.seq_len": 16}, [])
    run = {
        "kind": saved.kind,
        "model": saved.model_config(vocab_size=50).to_dict(),
        "train": saved.train.to_dict(),
        "task": {**saved.task.to_dict(), "vocab_size": 50},
    }
    ok = resolve(None, {"train.steps": 4}, [], resume=run, run_dir="runs/x")
    assert ok.train.steps == 4 and ok.model["n_layers"] == saved.model["n_layers"]
    with pytest.raises(UserError, match=r"--resume continues 'runs/x'.*model n_heads=2"):
        resolve(None, {"train.steps": 4}, ["n_heads=2"], resume=run, run_dir="runs/x")
    with pytest.raises(UserError, match=r"--seq-len 32 \(the run has 16\)"):
        resolve(None, {"task.seq_len": 32}, [], resume=run, run_dir="runs/x")


def test_build_run_reads_the_corpus_and_seeds_the_model():
    flags = {"train.steps": 1, "model.preset": "tiny", "task.max_chars": 3000}
    models = []
    for _ in range(2):
        spec = resolve(None, flags, ["task.seq_len=16"])
        model, task = build_run(spec)
        models.append(model)
    assert task.vocab_size == model.config.vocab_size and model.config.max_seq_len == 16
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same seed, the same weights


@pytest.mark.slow
def test_build_run_applies_the_budget_rule_once_the_corpus_is_read():
    spec = resolve(None, {"train.steps": 3, "task.max_chars": 20000}, [])
    model, task = build_run(spec)
    expect = choose_lm_settings(steps=3, corpus_tokens=task.n_tokens["train"], optimizer="auto")
    assert spec.choice == expect and not spec.auto
    assert model.config.d_model == expect.row.d_model and spec.train.lr == expect.lr
    assert "budget rule (3 steps): row" in spec.describe_choice()

"""The settings of ``attnlab train lm``: ``--config FILE``, ``--set KEY=VALUE`` and the typed
flags, merged into the model kind, the model fields, the :class:`~attnlab.config.TrainConfig` and
the :class:`~attnlab.config.LMTaskConfig` of a run.

Priorities (:mod:`attnlab.commands.config_args`): defaults < ``--config FILE`` (or the run's own
config.json on ``--resume``) < typed flags < ``--set``. The model section starts from a preset
(``--preset`` / ``model.preset``) and the other model keys apply on top: the file's, then the
command line's. The vocabulary size comes from the tokenizer and the context ``max_seq_len`` is
the training window ``task.seq_len``.

A Transformer run given no model (no preset, no model key but the backend and checkpointing)
gets its model, and whichever of batch size, window, learning rate and warm-up were not given,
from the budget rule :func:`attnlab.train.budget.choose_lm_settings` (:func:`apply_budget_rule`,
once the corpus is read).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.errors import UserError

__all__ = [
    "LM_KINDS",
    "ARCHS",
    "LMSettings",
    "resolve_lm_settings",
    "check_resume_settings",
    "apply_budget_rule",
    "describe_choice",
    "check_prepared_settings",
]

LM_KINDS = ("decoder_lm", "lstm_lm", "bigram_lm")
ARCHS = {"transformer": "decoder_lm", "lstm": "lstm_lm", "bigram": "bigram_lm"}
#: task fields with their own flag (named in messages)
TASK_FLAGS = {
    "data": "--data",
    "tokenizer": "--tokenizer",
    "vocab_size": "--vocab-size",
    "seq_len": "--seq-len",
    "max_chars": "--max-chars",
}
#: model settings with their own flag: dest -> "model.<field>"
MODEL_FLAGS = {
    "preset": "model.preset",
    "backend": "model.backend",
    "checkpointing": "model.activation_checkpointing",
}
_DEFAULT_PRESET = "tiny"
#: model keys that leave the choice of the model to the budget rule
_NOT_SIZE = {"model.backend", "model.backend_options", "model.activation_checkpointing"}
#: settings the budget rule fills in when not given
_RULE_KEYS = ("train.batch_size", "task.seq_len", "train.lr", "train.warmup_steps")
#: fields a run's config.json records although they follow from others
_DERIVED = ("n_kv_heads", "head_dim", "ffn_hidden")
_DERIVED_FROM = ("d_model", "n_heads", "ffn", "activation")


@dataclass
class LMSettings:
    """What ``attnlab train lm`` was asked for, before the corpus is read.

    Attributes:
        kind: the model kind (``decoder_lm`` | ``lstm_lm`` | ``bigram_lm``).
        model: the model config's fields, every key but ``vocab_size`` (the tokenizer's).
        train: the :class:`~attnlab.config.TrainConfig`.
        task: the :class:`~attnlab.config.LMTaskConfig` (``seed`` filled in).
        auto: what the budget rule still has to choose (``"model"`` and the ``section.key`` of
            each setting not given); empty when the run names its model.
    """

    kind: str
    model: dict[str, Any]
    train: Any
    task: Any
    auto: frozenset[str] = frozenset()

    def model_config(self, vocab_size: int) -> Any:
        """The model config for a tokenizer of ``vocab_size`` tokens."""
        from attnlab.models.registry import get_kind

        return get_kind(self.kind).config_cls.from_dict({**self.model, "vocab_size": vocab_size})


def _flag_keys() -> dict[str, str]:
    from attnlab.config.train import TrainConfig

    keys = {name: f"train.{name}" for name in TrainConfig.field_names()}
    keys.update({dest: f"task.{dest}" for dest in TASK_FLAGS})
    keys.update(MODEL_FLAGS)
    return keys


def _preset_fields(cls: type, name: str | None) -> dict[str, Any]:
    if name is None:
        return {}
    if name not in cls.PRESETS:
        from attnlab.config import ConfigError

        raise ConfigError(f"unknown {cls.__name__} preset {name!r}; choose from {cls.presets()}")
    return dict(cls.PRESETS[name])


def _file_model(base: dict[str, Any], cls: type) -> dict[str, Any]:
    """The model section of a config file, without what a run's config.json records although it
    follows from other values: the tokenizer's ``vocab_size``, ``max_seq_len`` = the task's
    ``seq_len``, and (in a complete section) head widths, KV heads and FFN widths equal to their
    derived values, so that ``--set d_model=128`` on a run's config derives them again."""
    model = dict(base.get("model") or {})
    task = base.get("task") if isinstance(base.get("task"), dict) else {}
    if "vocab_size" in model and model["vocab_size"] == task.get("vocab_size"):
        del model["vocab_size"]
    if "max_seq_len" in model and model["max_seq_len"] == task.get("seq_len"):
        del model["max_seq_len"]
    fields = set(cls.field_names())
    if "preset" in model or not set(_DERIVED_FROM) <= set(model) or not set(model) <= fields:
        return model
    for name in _DERIVED:
        if name in model:
            try:
                derived = getattr(cls.from_dict({**model, name: None}), name)
            except (UserError, ValueError):
                continue
            if derived == model[name]:
                del model[name]
    return model


def resolve_lm_settings(
    args: argparse.Namespace, base: dict[str, Any] | None, *, resume: bool = False
) -> LMSettings:
    """Merge defaults, ``base`` (a config file or the resumed run's config.json), typed flags
    and ``--set`` into the settings of an LM training run.

    The task's ``seed`` (window positions) follows ``--seed`` unless ``task.seed`` is set on its
    own (``--set task.seed=N``, or a resumed run's).

    Raises:
        UserError: an unknown architecture or preset, a model section that does not fit the
            architecture, ``--set vocab_size``, or a ``seq_len`` and ``max_seq_len`` that differ.
        ConfigError: bad values (named).
    """
    from attnlab.commands.config_args import explicit_dests, resolve_sections
    from attnlab.config import LMTaskConfig
    from attnlab.config.train import TrainConfig
    from attnlab.models.registry import get_kind

    base = dict(base or {})
    given = explicit_dests(args)
    kind = ARCHS[args.arch] if "arch" in given else base.get("kind", "decoder_lm")
    if kind not in LM_KINDS:
        raise UserError(
            f"the config's kind {kind!r} is not a language model ({', '.join(LM_KINDS)})"
        )
    if "arch" in given and not resume and base.get("model") and base.get("kind", kind) != kind:
        raise UserError(
            f"--arch {args.arch} does not fit the model section of the config file (a "
            f"{base.get('kind', 'decoder_lm')!r} model); drop --arch or the file"
        )
    cls = get_kind(kind).config_cls
    file_model = _file_model(base, cls)
    keys = _flag_keys()
    sections = resolve_sections(args, keys, base={k: v for k, v in base.items() if k != "model"})
    cli_model = dict(sections["model"])
    cli_preset = cli_model.pop("preset", None)
    file_preset = file_model.pop("preset", None)
    if "vocab_size" in {**file_model, **cli_model}:
        raise UserError(
            "the vocabulary size comes from the tokenizer: use --vocab-size (BPE), "
            "not --set vocab_size"
        )
    explicit = _explicit_keys(args, base, keys)
    auto: frozenset[str] = frozenset()
    if (
        not resume
        and kind == "decoder_lm"
        and file_preset is None
        and cli_preset is None
        and not {k for k in explicit if k.startswith("model.")} - _NOT_SIZE
    ):
        auto = frozenset({"model", *(k for k in _RULE_KEYS if k not in explicit)})
        if "train.warmup_frac" in explicit:
            auto -= {"train.warmup_steps"}
    elif file_preset is None and cli_preset is None:
        file_preset = _DEFAULT_PRESET  # (a run's config.json names every field anyway)
    model = {
        **_preset_fields(cls, file_preset),
        **file_model,
        **_preset_fields(cls, cli_preset),
        **cli_model,
    }
    task = dict(sections["task"])
    given_len = {**file_model, **cli_model}.get("max_seq_len")  # not a preset's default
    if given_len is not None and task.get("seq_len", given_len) != given_len:
        raise UserError(
            f"--seq-len {task['seq_len']} and --set max_seq_len={given_len} disagree "
            "(task.seq_len and model.max_seq_len are the same thing: give one)"
        )
    if "seq_len" not in task:
        task["seq_len"] = model.get("max_seq_len", cls().max_seq_len)
    model["max_seq_len"] = task["seq_len"]
    train = TrainConfig.from_dict(sections["train"])
    if task.get("seed") is None or (
        "seed" in given and not resume and not _set_keys(args, "task.seed")
    ):
        task["seed"] = train.seed
    return LMSettings(kind, model, train, LMTaskConfig.from_dict(task), auto)


def _explicit_keys(
    args: argparse.Namespace, base: dict[str, Any], flag_keys: dict[str, str]
) -> set[str]:
    """``section.key`` of every setting given by the file, a typed flag or ``--set``."""
    from attnlab.commands.config_args import explicit_dests
    from attnlab.config.overrides import parse_overrides

    keys = {
        f"{name}.{key}"
        for name, section in base.items()
        if isinstance(section, dict)
        for key in section
    }
    keys |= {flag_keys[d] for d in explicit_dests(args) if d in flag_keys}
    return keys | set(parse_overrides(getattr(args, "set", None) or []))


def apply_budget_rule(settings: LMSettings, task: Any, *, ref_steps_per_s: float | None = None):
    """Fill in what ``settings.auto`` leaves open from the budget rule.

    Args:
        settings: from :func:`resolve_lm_settings`, with ``auto`` not empty.
        task: the built :class:`~attnlab.tasks.lm.LMTask` (its corpus size and vocabulary).
        ref_steps_per_s: this machine's speed on the rule's reference row (default: measured
            now, in about a second; under ``torchrun`` the speed of issue 12's machine, so that
            every rank chooses alike).

    Returns:
        ``(settings, task, choice)``: the completed settings, the task with the chosen window
        and the :class:`~attnlab.train.budget.LMBudgetChoice` (to print).
    """
    import os

    from attnlab.tasks.lm import LMTask
    from attnlab.train.budget import choose_lm_settings
    from attnlab.train.distributed import resolve_device

    train = settings.train
    if ref_steps_per_s is None and train.timed and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        ref_steps_per_s = _measure_speed(resolve_device(train.device), task.vocab_size)
    choice = choose_lm_settings(
        budget_s=train.max_time,
        steps=None if train.timed else train.steps,
        corpus_tokens=task.n_tokens["train"],
        ref_steps_per_s=ref_steps_per_s,
        vocab_size=task.vocab_size,
    )
    auto = settings.auto
    seq_len = choice.seq_len if "task.seq_len" in auto else settings.task.seq_len
    model = {**choice.model, **settings.model, "max_seq_len": seq_len}
    updates = {
        key: value
        for key, value in (
            ("batch_size", choice.batch_size),
            ("lr", choice.lr),
            ("warmup_steps", choice.warmup_steps),
        )
        if f"train.{key}" in auto
    }
    task_config = settings.task.replace(seq_len=seq_len)
    if seq_len != task.seq_len:
        prepared = task.prepared
        task = LMTask(task.ids, task.tokenizer, task.config.replace(seq_len=seq_len))
        task.prepared = prepared
    new = LMSettings(settings.kind, model, train.replace(**updates), task_config, frozenset())
    return new, task, choice


def _measure_speed(device: Any, vocab_size: int) -> float:
    """The reference row's steps/s, leaving torch on the faster of its threads and one."""
    from attnlab.train.budget import fastest_ref_steps_per_s

    return fastest_ref_steps_per_s(vocab_size=vocab_size, device=device)


def describe_choice(settings: LMSettings, choice: Any) -> str:
    """The line ``attnlab train lm`` prints when the budget rule chose: the budget, the row and
    the settings the run will use (explicit flags included)."""
    train, row = settings.train, choice.row
    import torch

    budget = (
        f"{train.max_time:g} s = {choice.reference_steps:,.0f} reference steps, "
        f"{torch.get_num_threads()} thread(s)"
        if train.timed
        else f"{train.steps} steps"
    )
    return (
        f"budget rule ({budget}): row {row.name}, {row.n_layers} layers x {row.d_model} "
        f"(RoPE, dropout {choice.dropout:g}); seq {settings.task.seq_len}, batch "
        f"{train.batch_size}, lr {train.lr:g}, warm-up {train.warmup_steps}; about "
        f"{choice.steps:,} steps, {choice.epochs:.1f} passes over the corpus"
    )


def _set_keys(args: argparse.Namespace, key: str) -> bool:
    from attnlab.config.overrides import parse_overrides

    return key in parse_overrides(getattr(args, "set", None) or [])


def check_resume_settings(args: argparse.Namespace, want: LMSettings, saved: dict) -> None:
    """A resume continues the run as saved: refuse model or data settings that contradict it."""
    from attnlab.commands.config_args import refuse_resume_changes
    from attnlab.config import LMTaskConfig
    from attnlab.models.registry import get_kind

    diffs = []
    if want.kind != saved["kind"]:
        flag = "--arch" if args.arch is not None else "kind"
        diffs.append(f"{flag} {want.kind!r} (the run has {saved['kind']!r})")
    else:
        cls = get_kind(saved["kind"]).config_cls
        has = json.loads(json.dumps(cls.from_dict(saved["model"]).to_dict()))
        wanted = json.loads(json.dumps(want.model_config(has["vocab_size"]).to_dict()))
        for key in sorted(k for k in wanted if k != "max_seq_len" and wanted[k] != has.get(k)):
            diffs.append(f"model {key}={wanted[key]!r} (the run has {has.get(key)!r})")
    stored = LMTaskConfig.from_dict(saved["task"]).to_dict()
    wanted = want.task.to_dict()
    for key in wanted:
        a, b = wanted[key], stored[key]
        if key == "data" and Path(a).exists() and Path(b).exists():
            a, b = str(Path(a).resolve()), str(Path(b).resolve())
        if key == "vocab_size" and wanted["tokenizer"] != "bpe":
            continue  # a character vocabulary is the corpus's
        if a != b:
            diffs.append(f"{TASK_FLAGS.get(key, 'task.' + key)} {a!r} (the run has {b!r})")
    refuse_resume_changes(repr(args.out), diffs)


def check_prepared_settings(args: argparse.Namespace, task: Any) -> None:
    """A directory written by ``attnlab prepare`` brings its own tokenizer: refuse a
    ``--tokenizer`` or BPE ``--vocab-size`` flag that says otherwise (rather than ignore it)."""
    from attnlab.commands.config_args import explicit_dests

    if task.prepared is None or Path(task.data) != task.prepared.directory:
        return  # prepared into the cache from the settings themselves
    given = explicit_dests(args)
    tok = task.tokenizer
    wrong = []
    if "tokenizer" in given and args.tokenizer != tok.type:
        wrong.append(f"--tokenizer {args.tokenizer}")
    if "vocab_size" in given and tok.type == "bpe" and args.vocab_size != tok.vocab_size:
        wrong.append(f"--vocab-size {args.vocab_size}")
    if wrong:
        raise UserError(
            f"{task.data!r} was prepared with a {tok.type} tokenizer of {tok.vocab_size} tokens; "
            f"drop {' and '.join(wrong)} (or prepare the corpus again with them)"
        )

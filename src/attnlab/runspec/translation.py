"""The translation family of :func:`attnlab.runspec.resolve` (``attnlab train translate``):
encoder-decoders (``rnn``, ``rnn-attn``, ``transformer``, ``t5``) on generated or TSV sentence
pairs.

Settings merge as for every kind (flag defaults < config file < typed flags < ``--set``), over the
kind's training defaults (:func:`attnlab.tasks.translation.train_defaults`: label smoothing and
the schedule). The task's seed follows a typed ``--seed`` unless set apart. The model's
vocabulary sizes come from the data, its context from the longest pair (a file's
``max_seq_len`` wins). A resume continues the run's data and model as saved: settings that
contradict them are refused, each named (another vocabulary would scramble the embeddings).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.config.overrides import parse_overrides
from attnlab.config.train import TrainConfig
from attnlab.config.translation import TranslationTaskConfig
from attnlab.data.translation import build_data
from attnlab.errors import UserError
from attnlab.models.registry import get_kind
from attnlab.models.translation import TRANSLATION_KINDS, translation_config
from attnlab.runspec.spec import Family, Given, RunSpec, refuse_resume_changes
from attnlab.tasks.translation import TranslationTask, train_defaults

__all__ = ["TRANSLATION", "MODEL_KINDS", "resolve_translation", "build_translation"]

#: the model kinds of ``attnlab train translate`` (``--model`` / ``--arch``)
MODEL_KINDS = TRANSLATION_KINDS
#: TranslationTaskConfig field -> the flag that sets it (for messages)
_DATA_FLAGS = {
    "task": "--task",
    "lang": "--lang",
    "low": "--low",
    "high": "--high",
    "n_examples": "--n-examples",
    "path": "--data",
    "src_level": "--src-level",
    "tgt_level": "--tgt-level",
    "bpe_vocab_size": "--bpe-vocab",
    "max_len": "--max-len",
    "lowercase": "--keep-case",
}


def resolve_translation(fam: Family, given: Given) -> RunSpec:
    """The :class:`RunSpec` of a translation model (see :func:`attnlab.runspec.resolve`).

    On a resume the spec's model is the run's saved config and its task the run's.

    Raises:
        UserError: a kind that is not a translation model, a resume whose settings contradict
            the run (each named).
    """
    typed_kind = given.flags.get("kind")
    resume = given.resume
    if resume is not None:
        kind = _translation_kind(resume["kind"], given.run_dir)
        _check_resume(kind, typed_kind, resume, given.merged(given.file), given.run_dir)
        sections = given.merged({k: resume.get(k) or {} for k in ("model", "train", "task")})
        task_cfg = TranslationTaskConfig.from_dict(resume["task"])
        model = dict(resume["model"])
    else:
        sections = given.merged(given.file)
        source = "--model" if typed_kind else given.config_file
        kind = _translation_kind(typed_kind or sections.get("kind") or "transformer", source)
        task = dict(sections["task"])
        # --seed seeds the data as well as the training, unless the task's seed is set apart
        if "train.seed" in given.flags and "task.seed" not in parse_overrides(given.sets):
            task["seed"] = given.flags["train.seed"]
        task.setdefault("seed", sections["train"].get("seed", 0))
        task_cfg = TranslationTaskConfig.from_dict(task)
        model = dict(sections["model"])
    train = TrainConfig.from_dict({**train_defaults(kind), **sections["train"]})
    return RunSpec(
        fam,
        kind,
        model,
        train,
        task_cfg,
        typed=frozenset(given.flags),
        resume=resume,
        run_dir=given.run_dir,
    )


def build_translation(spec: RunSpec) -> tuple[nn.Module, TranslationTask]:
    """Generate (or read) the sentence pairs and build the seeded model of ``spec``."""
    kind = spec.kind
    data = build_data(spec.task)
    if spec.resume is not None:
        model_cfg = get_kind(kind).config_cls.from_dict(spec.model)
    else:
        model_options = dict(spec.model)
        preset = model_options.pop("preset", None)
        longest = max(data.stats["max_src_len"], data.stats["max_tgt_len"])
        max_seq_len = model_options.pop("max_seq_len", 2 * longest + 16)  # a file's value wins
        model_cfg = translation_config(
            kind,
            len(data.src_vocab),
            len(data.tgt_vocab),
            preset=preset,
            max_seq_len=max_seq_len,
            **model_options,
        )
    torch.manual_seed(spec.train.seed)  # the same initial weights for the same settings
    return get_kind(kind).build(model_cfg), TranslationTask(data)


def _translation_kind(kind: str, where: Any) -> str:
    if kind not in MODEL_KINDS:
        where = f"{where}: " if where else ""
        raise UserError(f"{where}{kind!r} is not a translation model ({', '.join(MODEL_KINDS)})")
    return kind


def _check_resume(
    kind: str, typed_kind: str | None, saved: Mapping[str, Any], changes: dict, out: Any
) -> None:
    """A resume continues the run as saved: refuse data or model settings that contradict it
    (a different vocabulary would silently scramble the trained embeddings).

    Args:
        typed_kind: the kind typed now (``--model``), or None.
        changes: the settings given now (a config file, flags and ``--set``), by section.
        out: the run directory, as messages show it.
    """
    diffs = []
    stored_task = TranslationTaskConfig.from_dict(saved["task"]).to_dict()
    task_changes = changes["task"]
    wanted_task = TranslationTaskConfig.from_dict({**stored_task, **task_changes}).to_dict()
    for key in task_changes:
        stored, value = stored_task[key], wanted_task[key]
        if key == "path" and stored is not None and Path(value).resolve() == Path(stored).resolve():
            continue
        if value != stored:
            flag = _DATA_FLAGS.get(key, f"task.{key}")
            shown = "given" if key == "lowercase" else repr(value)
            diffs.append(f"{flag} {shown} (the run has {key}={stored!r})")
    saved_model = saved["model"]
    options = dict(changes["model"])
    preset = options.pop("preset", None)
    if typed_kind is not None and typed_kind != kind:
        diffs.append(f"--model {typed_kind!r} (the run has {kind!r})")
    elif preset is not None or options:
        if preset is not None:  # a preset names every field
            sizes = {k: saved_model[k] for k in ("src_vocab_size", "tgt_vocab_size")}
            wanted = translation_config(
                kind, **sizes, preset=preset, max_seq_len=saved_model.get("max_seq_len"), **options
            ).to_dict()
        else:
            wanted = get_kind(kind).config_cls.from_dict({**saved_model, **options}).to_dict()
        keys = wanted if preset is not None else options
        for key in sorted(k for k in keys if wanted[k] != saved_model.get(k)):
            diffs.append(f"model {key}={wanted[key]!r} (the run has {saved_model.get(key)!r})")
    refuse_resume_changes(out, diffs)


TRANSLATION = Family(
    "translate",
    "translation model",
    MODEL_KINDS,
    TranslationTaskConfig,
    TranslationTask,
    _DATA_FLAGS,
    kind_flag="--model",
    resolver=resolve_translation,
    builder=build_translation,
)

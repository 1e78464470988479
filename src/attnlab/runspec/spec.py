"""The run description's types: :class:`Family` (what one ``attnlab train NAME`` trains) and
:class:`RunSpec` (one run), :func:`merge_sections` (flag defaults < file < typed flags < ``--set``)
and :func:`refuse_resume_changes`; :mod:`attnlab.runspec` resolves and builds them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from attnlab.config.base import Config
from attnlab.config.overrides import apply_overrides, load_config_file, parse_overrides
from attnlab.config.train import TrainConfig
from attnlab.errors import UserError
from attnlab.models.registry import get_kind
from attnlab.runspec.budget import LMBudgetChoice

__all__ = ["Family", "RunSpec", "Given", "merge_sections", "refuse_resume_changes"]


@dataclass(frozen=True)
class Family:
    """How the settings of one ``attnlab train NAME`` become a run.

    Attributes:
        name: the task's ``type`` in config.json (``lm``, ``mlm``).
        what: the family's name in messages (``language model``).
        kinds: the model kinds it trains; the first is the default.
        task_cls: the task config class (config.json's ``task``).
        task_type: the task class (``build(config)``, ``from_config(saved, tokenizer)``).
        task_flags: task fields with a flag of their own, as messages name them.
        kind_flag: the flag that chooses the kind (named in messages).
        kind_names: the values of ``kind_flag`` -> kinds (``{"transformer": "decoder_lm"}``).
        n_specials: tokens the task adds to the tokenizer's vocabulary, or a function of the
            task section that counts them (T5's sentinels: as many as the task asks for).
        budget_rule: a decoder-only model given no size is chosen by the budget rule.
        default_preset: the model preset when none is named.
        resolver: the family's own ``resolve(family, given: Given) -> RunSpec`` (None:
            :func:`attnlab.runspec.resolve`'s corpus families).
        builder: the family's own ``build(spec) -> (model, task)`` (None: the corpus families').
    """

    name: str
    what: str
    kinds: tuple[str, ...]
    task_cls: type[Config]
    task_type: type
    task_flags: Mapping[str, str]
    kind_flag: str | None = None
    kind_names: Mapping[str, str] = field(default_factory=dict)
    n_specials: int | Callable[[Mapping[str, Any]], int] = 0
    budget_rule: bool = False
    default_preset: str = "tiny"
    resolver: Callable[..., RunSpec] | None = field(default=None, repr=False)
    builder: Callable[[RunSpec], tuple[Any, Any]] | None = field(default=None, repr=False)

    def specials_for(self, task: Mapping[str, Any]) -> int:
        """The tokens a task with these settings adds to the tokenizer's vocabulary."""
        return self.n_specials(task) if callable(self.n_specials) else self.n_specials

    def describe_kind_error(self, kind: str) -> str:
        return f"the config's kind {kind!r} is not a {self.what} ({', '.join(self.kinds)})"


@dataclass(frozen=True)
class Given:
    """The settings :func:`attnlab.runspec.resolve` hands a family's own resolver.

    Attributes:
        config_file: a config file (or its parsed sections); None: none. Read by :attr:`file`.
        flags: ``{"section.key": value}`` typed on the command line (``"kind"``: the kind).
        sets: ``--set KEY=VALUE`` items.
        defaults: ``{"section.key": value}``: the command's flag defaults.
        resume: the resumed run's config.json (None for a new run).
        run_dir: the resumed run's directory as given.
    """

    config_file: str | os.PathLike | Mapping[str, Any] | None
    flags: Mapping[str, Any]
    sets: tuple[str, ...]
    defaults: Mapping[str, Any]
    resume: Mapping[str, Any] | None = None
    run_dir: str | os.PathLike | None = None

    @cached_property
    def file(self) -> Mapping[str, Any] | None:
        """The config file's sections (read on first use; None without a file)."""
        if isinstance(self.config_file, Mapping):
            return self.config_file
        return load_config_file(self.config_file) if self.config_file else None

    @property
    def base(self) -> Mapping[str, Any] | None:
        """What the settings start from: the resumed run's config.json, else the file."""
        return self.resume if self.resume is not None else self.file

    def merged(self, base: Mapping[str, Any] | None) -> dict[str, Any]:
        """:func:`merge_sections` of the defaults, ``base``, the typed flags but the kind and
        ``--set``."""
        flags = {k: v for k, v in self.flags.items() if k != "kind"}
        return merge_sections(self.defaults, base, flags, self.sets)


@dataclass
class RunSpec:
    """What one training run is: its kind, model fields, task and training settings.

    Attributes:
        family: the :class:`Family` it belongs to.
        kind: the model kind (``decoder_lm``, ``encoder_mlm``, ...).
        model: the model config's fields, every key but ``vocab_size`` (the tokenizer's).
        train: the :class:`~attnlab.config.TrainConfig`.
        task: the family's task config (``seed`` filled in).
        auto: what the budget rule still has to choose (``"model"`` and the ``section.key`` of
            each setting not given); empty when the run names its model.
        typed: the ``section.key`` of every setting typed on the command line.
        resume: the resumed run's config.json (None for a new run).
        run_dir: the resumed run's directory as given (its tokenizer is read back).
        choice: what the budget rule chose, once :func:`build_run` applied it.
    """

    family: Family
    kind: str
    model: dict[str, Any]
    train: TrainConfig
    task: Any
    auto: frozenset[str] = frozenset()
    typed: frozenset[str] = frozenset()
    resume: Mapping[str, Any] | None = None
    run_dir: str | os.PathLike | None = None
    choice: LMBudgetChoice | None = field(default=None, repr=False)

    def model_config(self, vocab_size: int) -> Config:
        """The model config for a tokenizer of ``vocab_size`` tokens (specials included)."""
        return get_kind(self.kind).config_cls.from_dict({**self.model, "vocab_size": vocab_size})

    def describe_choice(self) -> str:
        """One line: the budget rule's choice (budget, row and the settings the run uses)."""
        if self.choice is None:
            return ""
        train, choice = self.train, self.choice
        row = choice.row
        budget = (
            f"{train.max_time:g} s = {choice.reference_steps:,.0f} reference steps, "
            f"{torch.get_num_threads()} thread(s)"
            if train.timed
            else f"{train.steps} steps"
        )
        optimizer = "Muon for the matrices, AdamW lr" if train.optimizer == "muon" else "lr"
        shift = ", token shift" if self.model.get("token_shift") else ""
        return (
            f"budget rule ({budget}): row {row.name}, {row.n_layers} layers x {row.d_model} "
            f"(RoPE{shift}, dropout {choice.dropout:g}); seq {self.task.seq_len}, batch "
            f"{train.batch_size}, {optimizer} {train.lr:g}, warm-up {train.warmup_steps}; about "
            f"{choice.steps:,} steps, {choice.epochs:.1f} passes over the corpus"
        )


# -- merging ------------------------------------------------------------------------------------


def merge_sections(
    defaults: Mapping[str, Any] | None = None,
    base: Mapping[str, Any] | None = None,
    typed: Mapping[str, Any] | None = None,
    sets: Iterable[str] = (),
) -> dict[str, Any]:
    """Merge settings, lowest priority first, into ``{"model", "train", "task"}`` sections.

    Args:
        defaults: ``{"section.key": value}``: the command's flag defaults.
        base: a config file's sections (or a run's config.json); ``kind`` is kept.
        typed: ``{"section.key": value}``: flags typed on the command line. A typed
            ``train.steps`` without ``train.max_time`` replaces a base's ``max_time`` (the run's
            length is one choice).
        sets: ``--set KEY=VALUE`` items (a key without a section is a model field).

    Raises:
        ConfigError: a bad ``--set`` item.
    """
    typed = dict(typed or {})
    if "train.steps" in typed and "train.max_time" not in typed:
        typed["train.max_time"] = None  # --steps N is the new length, not a budget's fallback
    sections: dict[str, Any] = {"model": {}, "train": {}, "task": {}}
    sections = apply_overrides(sections, dict(defaults or {}))
    for name, section in (base or {}).items():
        if isinstance(section, Mapping):
            sections[name] = {**sections.get(name, {}), **section}
        else:
            sections[name] = section
    sections = apply_overrides(sections, typed)
    return apply_overrides(sections, parse_overrides(list(sets)))


def refuse_resume_changes(out: str, diffs: list[str]) -> None:
    """Refuse a ``--resume`` whose settings disagree with the run's, naming each.

    Args:
        out: the run directory as the message shows it.
        diffs: one ``"--flag value (the run has other)"`` item per disagreement; none: no error.

    Raises:
        UserError: when ``diffs`` is not empty.
    """
    if diffs:
        raise UserError(
            f"--resume continues {out} as it was configured, but "
            + "; ".join(diffs)
            + ". Drop these options, or start a new run (another --out, or --overwrite)"
        )

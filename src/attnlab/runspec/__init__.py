"""One run description for every ``attnlab train KIND``: :class:`RunSpec`, :func:`resolve` and
:func:`build_run` (also importable from :mod:`attnlab.runs`).

A run is described by its model kind, the model config's fields, the task config and the
:class:`~attnlab.config.TrainConfig`. :func:`resolve` merges, from the lowest priority to the
highest::

    the command's flag defaults  <  a config file (or the resumed run's config.json)
                                 <  flags typed on the command line  <  --set KEY=VALUE

The model section starts from a preset (the file's ``model.preset``, then the command line's) and
the other model keys apply on top. The vocabulary size comes from the tokenizer (plus the
family's special tokens) and the context ``max_seq_len`` is the task's ``seq_len``: both are
derived, never set. A decoder-only LM given no model gets it, and whichever of batch size,
window, learning rate and warm-up were not given, from the budget rule
(:func:`attnlab.runspec.budget.choose_lm_settings`) once the corpus is read. A resume continues
the run as saved: settings that contradict it are refused, each named.

    spec = resolve("exp.toml", {"train.steps": 200}, ["model.n_heads=8"], family="lm")
    model, task = build_run(spec)          # reads the corpus, builds the model (seeded)
    train(model, task, spec.train, "runs/exp")

Families: ``lm`` (decoder-only Transformer, Transformer-XL (:mod:`attnlab.runspec.lm_xl`), LSTM,
causal-convolution and bigram LMs) and ``mlm`` (the BERT-style
encoder), resolved here; ``image`` (:mod:`attnlab.runspec.vision`), ``caption`` and ``vqa``
(:mod:`attnlab.runspec.scenes`) and ``translate`` (:mod:`attnlab.runspec.translation`) bring
their own resolver and builder; ``t5-span`` (:mod:`attnlab.runspec.t5_span`) is a corpus family
like ``mlm`` — see :data:`FAMILIES`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.attention.core import check_backend
from attnlab.config import ConfigError, LMTaskConfig, MLMTaskConfig
from attnlab.config.base import Config
from attnlab.config.overrides import load_config_file, parse_overrides
from attnlab.config.train import TrainConfig
from attnlab.data.tokenizers import load_tokenizer
from attnlab.errors import UserError, did_you_mean
from attnlab.models.registry import build_model, get_kind
from attnlab.runspec.budget import choose_lm_settings, fastest_ref_steps_per_s
from attnlab.runspec.clip import CLIP
from attnlab.runspec.lm_xl import XL_KIND, xl_lengths, xl_task
from attnlab.runspec.scenes import CAPTION, VQA
from attnlab.runspec.spec import Family, Given, RunSpec, merge_sections, refuse_resume_changes
from attnlab.runspec.t5_span import T5_SPAN
from attnlab.runspec.translation import TRANSLATION
from attnlab.runspec.vision import IMAGE
from attnlab.tasks.lm import LMTask
from attnlab.tasks.mlm import MLMTask

__all__ = [
    "Family",
    "FAMILIES",
    "RunSpec",
    "resolve",
    "build_run",
    "merge_sections",
    "refuse_resume_changes",
]


_CORPUS_FLAGS = {
    "data": "--data",
    "tokenizer": "--tokenizer",
    "vocab_size": "--vocab-size",
    "seq_len": "--seq-len",
    "max_chars": "--max-chars",
}

#: the families :func:`resolve` knows, by the name of their ``attnlab train NAME``
FAMILIES: dict[str, Family] = {
    "lm": Family(
        "lm",
        "language model",
        ("decoder_lm", "lstm_lm", "bigram_lm", "transformer_xl", "conv_lm"),
        LMTaskConfig,
        LMTask,
        _CORPUS_FLAGS,
        kind_flag="--arch",
        kind_names={
            "transformer": "decoder_lm",
            "lstm": "lstm_lm",
            "bigram": "bigram_lm",
            "transformer-xl": "transformer_xl",
            "conv": "conv_lm",
        },
        budget_rule=True,
    ),
    "mlm": Family(
        "mlm",
        "masked-LM encoder",
        ("encoder_mlm",),
        MLMTaskConfig,
        MLMTask,
        {**_CORPUS_FLAGS, "mask_prob": "--mask-prob"},
        n_specials=4,
    ),
    "image": IMAGE,
    "caption": CAPTION,
    "vqa": VQA,
    "clip": CLIP,
    "translate": TRANSLATION,
    "t5-span": T5_SPAN,
}

#: model keys that leave the choice of the model to the budget rule: how it runs, and the token
#: shift (a wiring of the rule's row xs, C weights, not a size: ``--set model.token_shift=false``)
_NOT_SIZE = {
    "model.backend",
    "model.backend_options",
    "model.activation_checkpointing",
    "model.token_shift",
}
#: settings the budget rule fills in when not given
_RULE_KEYS = (
    "train.batch_size",
    "task.seq_len",
    "train.lr",
    "train.warmup_steps",
    "train.optimizer",
)
#: fields a run's config.json records although they follow from others
_DERIVED = ("n_kv_heads", "head_dim", "ffn_hidden")
_DERIVED_FROM = ("d_model", "n_heads", "ffn", "activation")


def _preset_fields(cls: type[Config], name: str | None) -> dict[str, Any]:
    if name is None:
        return {}
    if name not in cls.PRESETS:
        raise ConfigError(
            f"unknown {cls.__name__} preset {name!r}{did_you_mean(name, cls.presets())}; "
            f"choose from {cls.presets()}"
        )
    return dict(cls.PRESETS[name])


def _file_model(base: Mapping[str, Any], cls: type[Config], fam: Family) -> dict[str, Any]:
    """The model section of a config file, without what a run's config.json records although it
    follows from other values: the tokenizer's ``vocab_size`` (plus the specials),
    ``max_seq_len`` = the task's ``seq_len`` (Transformer-XL: ``seq_len + mem_len``), and (in a complete section) head widths, KV heads
    and FFN widths equal to their derived values, so that ``--set d_model=128`` on a run's
    config derives them again."""
    model = dict(base.get("model") or {})
    task = base.get("task") if isinstance(base.get("task"), dict) else {}
    n_specials = fam.specials_for(task)
    if "vocab_size" in model and model["vocab_size"] == (task.get("vocab_size") or 0) + n_specials:
        del model["vocab_size"]
    if "max_seq_len" in model and model["max_seq_len"] == task.get("seq_len"):
        del model["max_seq_len"]
    elif base.get("kind") == XL_KIND and "max_seq_len" in model and "seq_len" in task:
        if model["max_seq_len"] == task["seq_len"] + model.get("mem_len", cls().mem_len):
            del model["max_seq_len"]  # segment + memory: derived again
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


def resolve(
    config_file: str | os.PathLike | Mapping[str, Any] | None = None,
    flags: Mapping[str, Any] | None = None,
    sets: Iterable[str] = (),
    *,
    family: str | Family = "lm",
    defaults: Mapping[str, Any] | None = None,
    resume: Mapping[str, Any] | None = None,
    run_dir: str | os.PathLike | None = None,
) -> RunSpec:
    """The :class:`RunSpec` of a training run from its settings (see the module docstring).

    Args:
        config_file: a TOML/YAML/JSON file (or its parsed sections); ignored with ``resume``.
        flags: ``{"section.key": value}`` typed on the command line; ``"kind"`` chooses the
            model kind.
        sets: ``--set KEY=VALUE`` items.
        family: a name of :data:`FAMILIES` (or a :class:`Family`).
        defaults: ``{"section.key": value}``: the command's flag defaults.
        resume: the resumed run's config.json; the settings are checked against it.
        run_dir: the resumed run's directory (its tokenizer is read back by :func:`build_run`).

    Returns:
        The spec; its model and task are complete except what the data decide (the vocabulary
        size) and what ``auto`` leaves to the budget rule.

    Raises:
        UserError: a kind of another family, a kind that contradicts the file's model section,
            ``vocab_size`` set by hand, a ``seq_len`` and ``max_seq_len`` that differ, an unknown
            preset, or a resume whose settings contradict the run (each named).
        ConfigError: bad values (named).
    """
    fam = FAMILIES[family] if isinstance(family, str) else family
    flags = dict(flags or {})
    sets = list(sets)
    if fam.resolver is not None:
        given = Given(config_file, flags, tuple(sets), dict(defaults or {}), resume, run_dir)
        return fam.resolver(fam, given)
    if resume is not None:
        base = dict(resume)
    elif isinstance(config_file, Mapping):
        base = dict(config_file)
    else:
        base = dict(load_config_file(config_file)) if config_file else {}
    kind = flags.pop("kind", None)
    kind_typed = kind is not None
    if kind is None:
        kind = base.get("kind", fam.kinds[0])
    if kind not in fam.kinds:
        raise UserError(fam.describe_kind_error(kind))
    if kind_typed and resume is None and base.get("model") and base.get("kind", kind) != kind:
        raise UserError(
            f"{fam.kind_flag} {_kind_name(fam, kind)} does not fit the model section of the "
            f"config file (a {base.get('kind', fam.kinds[0])!r} model); drop {fam.kind_flag} or "
            "the file"
        )
    cls = get_kind(kind).config_cls
    file_model = _file_model(base, cls, fam)
    sections = merge_sections(
        defaults, {k: v for k, v in base.items() if k != "model"}, flags, sets
    )
    cli_model = dict(sections["model"])
    cli_preset = cli_model.pop("preset", None)
    file_preset = file_model.pop("preset", None)
    if "vocab_size" in {**file_model, **cli_model}:
        raise UserError(
            "the vocabulary size comes from the tokenizer: use --vocab-size (BPE), "
            "not --set vocab_size"
        )
    set_keys = set(parse_overrides(sets))
    explicit = {
        f"{name}.{key}"
        for name, section in base.items()
        if isinstance(section, dict)
        for key in section
    }
    explicit |= set(flags) | set_keys
    auto: frozenset[str] = frozenset()
    if (
        fam.budget_rule
        and resume is None
        and kind == "decoder_lm"
        and file_preset is None
        and cli_preset is None
        and not {k for k in explicit if k.startswith("model.")} - _NOT_SIZE
    ):
        auto = frozenset({"model", *(k for k in _RULE_KEYS if k not in explicit)})
        if "train.warmup_frac" in explicit:
            auto -= {"train.warmup_steps"}
    elif file_preset is None and cli_preset is None:
        file_preset = fam.default_preset  # (a run's config.json names every field anyway)
    model = {
        **_preset_fields(cls, file_preset),
        **file_model,
        **_preset_fields(cls, cli_preset),
        **cli_model,
    }
    task = dict(sections["task"])
    given_len = {**file_model, **cli_model}.get("max_seq_len")  # not a preset's default
    if kind == XL_KIND:  # a segment and a memory: max_seq_len = seq_len + mem_len
        xl_lengths(model, task, given_len, cls)
    elif given_len is not None and task.get("seq_len", given_len) != given_len:
        raise UserError(
            f"--seq-len {task['seq_len']} and --set max_seq_len={given_len} disagree "
            "(task.seq_len and model.max_seq_len are the same thing: give one)"
        )
    if kind != XL_KIND:
        if "seq_len" not in task:
            task["seq_len"] = model.get("max_seq_len", cls().max_seq_len)
        model["max_seq_len"] = task["seq_len"]
    train = TrainConfig.from_dict(sections["train"])
    # the task's seed (window positions, masks) follows --seed unless set apart
    if task.get("seed") is None or (
        "train.seed" in flags and resume is None and "task.seed" not in set_keys
    ):
        task["seed"] = train.seed
    spec = RunSpec(
        fam,
        kind,
        model,
        train,
        fam.task_cls.from_dict(task),
        auto,
        typed=frozenset(flags) | ({"kind"} if kind_typed else set()),
        resume=resume,
        run_dir=run_dir,
    )
    if resume is not None:
        _check_resume(spec, resume)
    return spec


def _kind_name(fam: Family, kind: str) -> str:
    """The value of ``fam.kind_flag`` that chooses ``kind`` (``transformer`` for decoder_lm)."""
    return next((name for name, k in fam.kind_names.items() if k == kind), kind)


# -- resume -------------------------------------------------------------------------------------


def _check_resume(spec: RunSpec, saved: Mapping[str, Any]) -> None:
    """A resume continues the run as saved: refuse model or data settings that contradict it."""
    fam = spec.family
    diffs = []
    if spec.kind != saved["kind"]:
        flag = fam.kind_flag if "kind" in spec.typed and fam.kind_flag else "kind"
        diffs.append(f"{flag} {spec.kind!r} (the run has {saved['kind']!r})")
    else:
        cls = get_kind(saved["kind"]).config_cls
        has = json.loads(json.dumps(cls.from_dict(saved["model"]).to_dict()))
        wanted = json.loads(json.dumps(spec.model_config(has["vocab_size"]).to_dict()))
        for key in sorted(k for k in wanted if k != "max_seq_len" and wanted[k] != has.get(k)):
            diffs.append(f"model {key}={wanted[key]!r} (the run has {has.get(key)!r})")
    stored = fam.task_cls.from_dict(saved["task"]).to_dict()
    wanted = spec.task.to_dict()
    for key in wanted:
        a, b = wanted[key], stored[key]
        if key == "data" and Path(a).exists() and Path(b).exists():
            a, b = str(Path(a).resolve()), str(Path(b).resolve())
        if key == "vocab_size" and wanted["tokenizer"] != "bpe":
            continue  # a character vocabulary is the corpus's
        if a != b:
            diffs.append(f"{fam.task_flags.get(key, 'task.' + key)} {a!r} (the run has {b!r})")
    out = repr(str(spec.run_dir)) if spec.run_dir is not None else "the run"
    refuse_resume_changes(out, diffs)


# -- building -----------------------------------------------------------------------------------


def _check_backend(config: Config) -> None:
    """Run the attention backend once on a tiny input: a bad backend fails before the corpus."""
    if hasattr(config, "backend"):
        check_backend(config.backend, config.backend_options, dropout_p=config.attn_dropout)


def _check_prepared(spec: RunSpec, task: Any) -> None:
    """A directory written by ``attnlab prepare`` brings its own tokenizer: refuse a typed
    tokenizer or BPE vocabulary size that says otherwise (rather than ignore it)."""
    prepared = getattr(task, "prepared", None)
    if prepared is None or Path(task.data) != prepared.directory:
        return  # prepared into the cache from the settings themselves
    tok, flags = task.tokenizer, spec.family.task_flags
    wrong = []
    if "task.tokenizer" in spec.typed and spec.task.tokenizer != tok.type:
        wrong.append(f"{flags['tokenizer']} {spec.task.tokenizer}")
    if "task.vocab_size" in spec.typed and tok.type == "bpe":
        if spec.task.vocab_size != tok.vocab_size:
            wrong.append(f"{flags['vocab_size']} {spec.task.vocab_size}")
    if wrong:
        raise UserError(
            f"{task.data!r} was prepared with a {tok.type} tokenizer of {tok.vocab_size} tokens; "
            f"drop {' and '.join(wrong)} (or prepare the corpus again with them)"
        )


def _apply_budget_rule(spec: RunSpec, task: Any, ref_steps_per_s: float | None) -> Any:
    """Fill in what ``spec.auto`` leaves open from the budget rule; the task with the chosen
    window (the same corpus)."""
    train = spec.train
    if ref_steps_per_s is None and train.timed and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        device = train.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        ref_steps_per_s = fastest_ref_steps_per_s(
            vocab_size=task.vocab_size, device=torch.device(device)
        )
    # the rule picks the optimizer unless one is given (Muon: not with FSDP's shards)
    optimizer = train.optimizer
    if "train.optimizer" in spec.auto and train.strategy != "fsdp":
        optimizer = "auto"
    choice = choose_lm_settings(
        budget_s=train.max_time,
        steps=None if train.timed else train.steps,
        corpus_tokens=task.n_tokens["train"],
        ref_steps_per_s=ref_steps_per_s,
        vocab_size=task.vocab_size,
        optimizer=optimizer,
    )
    auto = spec.auto
    seq_len = choice.seq_len if "task.seq_len" in auto else spec.task.seq_len
    updates = {
        key: value
        for key, value in (
            ("batch_size", choice.batch_size),
            ("lr", choice.lr),
            ("warmup_steps", choice.warmup_steps),
            ("optimizer", choice.optimizer),
        )
        if f"train.{key}" in auto
    }
    spec.model = {**choice.model, **spec.model, "max_seq_len": seq_len}
    spec.train = train.replace(**updates)
    spec.task = spec.task.replace(seq_len=seq_len)
    spec.auto = frozenset()
    spec.choice = choice
    if seq_len != task.seq_len:
        prepared = task.prepared
        task = type(task)(task.ids, task.tokenizer, task.config.replace(seq_len=seq_len))
        task.prepared = prepared
    return task


def build_run(spec: RunSpec, *, ref_steps_per_s: float | None = None) -> tuple[nn.Module, Any]:
    """Read the data and build the seeded model of ``spec``.

    A new run checks the model settings and the attention backend before the (slow) corpus
    reading, reads and tokenises the corpus, applies the budget rule when ``spec.auto`` asks for
    it (``spec`` is completed in place: its model, train and task settings, and ``choice``) and
    builds the model under ``torch.manual_seed(spec.train.seed)``. A resumed run rebuilds its
    task from the run's tokenizer and its model from the saved config.

    Args:
        spec: from :func:`resolve`.
        ref_steps_per_s: the budget rule's reference speed (default: measured, in about a
            second, for a timed run in one process; under ``torchrun`` issue 12's machine's).

    Returns:
        ``(model, task)``.

    Raises:
        UserError: bad model settings or backend, an unusable corpus, a prepared corpus whose
            tokenizer contradicts the settings.
    """
    fam = spec.family
    if fam.builder is not None:
        return fam.builder(spec)
    if spec.resume is not None:
        if spec.run_dir is None:
            raise UserError("a resumed RunSpec needs run_dir (the run's directory)")
        task = fam.task_type.from_config(spec.resume["task"], load_tokenizer(spec.run_dir))
        task = xl_task(spec.resume["kind"], task)
        return build_model(spec.resume["kind"], spec.resume["model"]), task
    _check_backend(spec.model_config(vocab_size=256 + fam.specials_for(spec.task.to_dict())))
    if fam.task_type is LMTask:
        task = LMTask.build(spec.task, progress=spec.train.progress)
    else:
        task = fam.task_type.build(spec.task)
    _check_prepared(spec, task)
    if spec.auto:
        task = _apply_budget_rule(spec, task, ref_steps_per_s)
    config = spec.model_config(task.vocab_size)
    torch.manual_seed(spec.train.seed)
    return build_model(spec.kind, config), xl_task(spec.kind, task)

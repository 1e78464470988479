"""Starting a training run from a command line's flags, the same way for every
``attnlab train KIND``: which flags were typed, ``--config FILE`` and ``--set KEY=VALUE``, the
resume checks, and the run resolved and built (:func:`attnlab.runs.resolve`,
:func:`attnlab.runs.build_run`). The shared training flags are :mod:`attnlab.train.cli_args`.

The settings of a run come in three sections (``model``, ``train``, ``task``; see
:mod:`attnlab.config.overrides`), merged from the lowest to the highest priority:

    the command's defaults  <  --config FILE (or the run's config.json on --resume)
                            <  flags typed on the command line  <  --set KEY=VALUE

Only flags the user actually typed override the file: :func:`track_explicit` marks them. The
length of a run is one choice: a typed ``--steps`` (without ``--max-time``) replaces a file's (or a
resumed run's) ``max_time``, which would otherwise win over it.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnlab.config.overrides import load_config_file
from attnlab.config.train import TrainConfig
from attnlab.errors import RunDirError, UserError
from attnlab.runs import build_run, check_resumable, read_config
from attnlab.runspec import Family, RunSpec, resolve
from attnlab.train.checkpoint import check_run_dir
from attnlab.train.distributed import resolve_device
from attnlab.train.stopping import completion

__all__ = [
    "add_config_args",
    "track_explicit",
    "explicit_dests",
    "flag_settings",
    "train_flag_keys",
    "resolve_spec",
    "resumed_config",
    "saved_run",
    "start_run",
]

_GIVEN = "_explicit_dests"


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE`` and ``--set KEY=VALUE`` (repeatable) to a train sub-command."""
    g = parser.add_argument_group("configuration")
    g.add_argument(
        "--config",
        metavar="FILE",
        help="settings from a TOML, YAML or JSON file with [model], [train] and [task] sections "
        "(a run's config.json works too); flags typed here override it",
    )
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting: model.n_heads=8, train.lr=3e-4, task.seq_len=64; a key "
        "without a section is a model field (--set position=alibi). Repeatable",
    )


@functools.cache  # one subclass per action class (each parser build made ~300 new classes)
def _tracked(action_cls: type) -> type:
    def __call__(self, parser, namespace, values, option_string=None):  # noqa: N807
        given = getattr(namespace, _GIVEN, None)
        if given is None:
            given = set()
            setattr(namespace, _GIVEN, given)
        given.add(self.dest)
        return action_cls.__call__(self, parser, namespace, values, option_string)

    return type(f"Tracked{action_cls.__name__}", (action_cls,), {"__call__": __call__})


def track_explicit(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` remember which options were typed (see :func:`explicit_dests`).

    Call it after every argument has been added.
    """
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if not type(action).__name__.startswith("Tracked"):
            action.__class__ = _tracked(type(action))
    return parser


def explicit_dests(args: argparse.Namespace) -> set[str]:
    """The ``dest`` names of the options typed on the command line."""
    return set(getattr(args, _GIVEN, set()))


def flag_settings(
    args: argparse.Namespace, flag_keys: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(typed, defaults)``: the ``{"section.key": value}`` of the flags typed on the command
    line, and of the other flags' defaults (those that are not ``None``)."""
    given = explicit_dests(args)
    defaults = {
        key: getattr(args, dest)
        for dest, key in flag_keys.items()
        if dest not in given and getattr(args, dest, None) is not None
    }
    typed = {key: getattr(args, dest) for dest, key in flag_keys.items() if dest in given}
    return typed, defaults


def train_flag_keys() -> dict[str, str]:
    """``dest -> "train.<field>"`` for every :class:`~attnlab.config.TrainConfig` field (the flags
    of :func:`attnlab.train.add_train_args` are named after them)."""
    return {name: f"train.{name}" for name in TrainConfig.field_names()}


def resolve_spec(
    args: argparse.Namespace,
    family: Family,
    flag_keys: Mapping[str, str],
    saved: Mapping[str, Any] | None,
    *,
    kind: str | None = None,
    typed: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> RunSpec:
    """:func:`attnlab.runs.resolve` on parsed flags: ``--config``, the typed flags and their
    defaults, ``--set``, and (``saved``, on ``--resume``) the run's own config.json.

    Args:
        kind: the model kind a typed flag chose (``--arch``); None when none was typed.
        typed, defaults: more ``{"section.key": value}`` settings, as if typed or defaults
            (those of a flag that stands for several fields).
    """
    typed_flags, flag_defaults = flag_settings(args, flag_keys)
    typed = {**typed_flags, **(typed or {})}
    defaults = {**flag_defaults, **(defaults or {})}
    if kind is not None:
        typed["kind"] = kind
    return resolve(
        getattr(args, "config", None),
        typed,
        getattr(args, "set", None) or [],
        family=family,
        defaults=defaults,
        resume=saved,
        run_dir=args.out if saved is not None else None,
    )


def resumed_config(
    args: argparse.Namespace, kinds: tuple[str, ...], task_type: str, what: str
) -> dict[str, Any] | None:
    """Check ``--out`` (before any data is read) and, on ``--resume``, read the run's settings.

    Args:
        args: parsed ``train`` flags (``out``, ``resume``, ``overwrite``, ``config``).
        kinds: model kinds the command trains.
        task_type: the ``"type"`` of the run's ``task`` section.
        what: the run's name in the error message (``"language-model"``).

    Returns:
        The run's config.json on ``--resume``; None for a new run.

    Raises:
        UserError: ``--resume`` with ``--config``; RunDirError: a run of another kind.
    """
    check_run_dir(args.out, args.resume, args.overwrite)
    if not args.resume:
        return None
    if args.config:
        raise UserError("--resume continues the run's own config.json; drop --config")
    saved = read_config(args.out)
    if saved["kind"] not in kinds or (saved.get("task") or {}).get("type") != task_type:
        raise RunDirError(f"{str(Path(args.out))!r} does not hold a {what} training run")
    return saved


def start_run(
    args: argparse.Namespace,
    family: Family,
    flag_keys: Mapping[str, str],
    saved: Mapping[str, Any] | None,
    *,
    check_device: bool = False,
    **given: Any,
) -> tuple[RunSpec, Any, Any] | None:
    """:func:`resolve_spec`, then :func:`attnlab.runs.build_run`: ``(spec, model, task)``.

    Args:
        saved: the resumed run's settings (None: a new run, or a file read as ``--config``).
        check_device: refuse a bad ``--device`` in one line before the data is read.
        **given: ``kind``, ``typed``, ``defaults`` of :func:`resolve_spec`.

    Returns:
        None when ``--resume`` finds the run complete already (which it prints, before any
        data is read).
    """
    spec = resolve_spec(args, family, flag_keys, saved, **given)
    done = completion(args.out, spec.train) if args.resume else None
    if done:
        print(done)
        return None
    if check_device:
        resolve_device(spec.train.device)
    model, task = build_run(spec)  # the budget rule chooses when no model is named
    return spec, model, task


def saved_run(args: argparse.Namespace, *, file: bool = False) -> dict[str, Any] | None:
    """The settings a ``--resume`` continues from, for the commands that let ``--config`` be
    given on a resume (the strict check is :func:`resumed_config`).

    Args:
        file: read the run's config.json as if it were ``--config`` (only without ``--config``,
            and only when the run has one, checked against its weights first); otherwise refuse
            a bad ``--out`` before any data is read (:func:`check_run_dir`), then read it.

    Returns:
        The run's config.json, or None (a new run, or nothing to read).
    """
    if file:
        saved = Path(args.out) / "config.json"
        if not (args.resume and not args.config and saved.is_file()):
            return None
        check_resumable(args.out)  # config.json against the weights, before the model is built
        return load_config_file(saved)
    check_run_dir(args.out, args.resume, args.overwrite)
    return read_config(args.out) if args.resume else None

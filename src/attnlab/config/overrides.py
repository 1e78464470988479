"""Config files and ``--set KEY=VALUE`` overrides: one parser for every command.

A run's settings have three sections, the same in a config file and in a run's ``config.json``::

    [model]            # the model config (ModelConfig, Seq2SeqConfig, ViTConfig ...)
    n_heads = 8
    [train]            # TrainConfig
    lr = 3e-4
    [task]             # the data / task settings of the command
    data = "pydoc"

Files may be TOML (``.toml``), YAML (``.yaml``/``.yml``) or JSON (``.json``, e.g. a run's own
``config.json``, whose ``kind`` is kept). ``--set`` takes dotted keys (``model.n_heads=8``,
``train.lr=3e-4``); a key without a section means the model's field (``--set position=alibi``).
Values are read as JSON or Python literals (``8``, ``3e-4``, ``true``/``True``, ``null``/``None``,
``[0.9, 0.95]``); anything else is a string. The config classes then check the types.
"""

from __future__ import annotations

import ast
import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from attnlab.config.base import ConfigError
from attnlab.errors import did_you_mean

__all__ = [
    "SECTIONS",
    "parse_value",
    "parse_overrides",
    "load_config_file",
    "apply_overrides",
]

#: sections of a config file and of config.json (``kind`` is also kept when present)
SECTIONS = ("model", "train", "task")

_WORDS = {"true": True, "false": False, "null": None, "none": None}


def parse_value(text: str) -> Any:
    """The value ``text`` denotes: a number, bool, null, list or dict, else the string itself."""
    stripped = text.strip()
    if stripped.lower() in _WORDS:
        return _WORDS[stripped.lower()]
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(stripped)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return text


def parse_overrides(items: Iterable[str], *, default_section: str = "model") -> dict[str, Any]:
    """``["model.n_heads=8", "lr=3e-4"]`` -> ``{"model.n_heads": 8, "model.lr": 3e-4}``.

    Every key comes back with its section; keys without one get ``default_section``.

    Raises:
        ConfigError: an item without ``=``, an empty key, or an unknown section.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE (e.g. model.n_heads=8), got {item!r}")
        section, dot, name = key.partition(".")
        if not dot:
            section, name = default_section, key
        if section not in SECTIONS:
            raise ConfigError(
                f"--set {key}: unknown section {section!r}{did_you_mean(section, SECTIONS)}; use one of {list(SECTIONS)} "
                "(model.n_heads=8, train.lr=3e-4, task.data=stdlib)"
            )
        if not name:
            raise ConfigError(f"--set {key}: no field name after {section!r}.")
        out[f"{section}.{name}"] = parse_value(value)
    return out


def _problem(err: Exception) -> str:
    """A parser's error on one line: YAML's own spans several (the line quoted, a caret)."""
    problem, mark = getattr(err, "problem", None), getattr(err, "problem_mark", None)
    if problem is None or mark is None:
        return str(err)
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    if "could not determine a constructor" in problem:  # !!python/object... (safe_load)
        problem += " (a tag that builds a Python object: a config holds plain values only)"
    return f"{where}: {problem}"


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML, YAML or JSON config file into ``{"model": {...}, "train": {...}, ...}``.

    Raises:
        ConfigError: a missing or unreadable file, a syntax error (with the file's name), a
            top level that is not a mapping, or an unknown section.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from None
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(
                f"config file {path}: unknown format {suffix or '(no extension)'!r}; "
                "use .toml, .yaml/.yml or .json"
            )
    except ConfigError:
        raise
    except Exception as err:  # tomllib, yaml and json each raise their own error types
        raise ConfigError(
            f"config file {path} is not valid {suffix[1:]}: {_problem(err)}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path}: expected sections {list(SECTIONS)} at the top")
    unknown = sorted(set(data) - set(SECTIONS) - {"kind"})
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown section(s) {unknown}; a config has {list(SECTIONS)}"
        )
    for section in SECTIONS:
        if section in data and not isinstance(data[section], Mapping):
            raise ConfigError(f"config file {path}: section {section!r} must be a mapping")
    return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` (sections of fields) with ``{"section.field": value}`` applied.

    A dotted field inside a section (``task.data.path``) sets a nested mapping.
    """
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in config.items()}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        target = out.setdefault(section, {})
        *parents, leaf = name.split(".")
        for p in parents:
            nxt = target.get(p)
            if not isinstance(nxt, dict):
                nxt = {} if nxt is None else nxt
                if not isinstance(nxt, dict):
                    raise ConfigError(f"--set {key}: {p!r} is not a mapping")
                target[p] = nxt
            target = nxt
        target[leaf] = value
    return out

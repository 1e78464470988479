"""The flags of ``attnlab experiment inductive-bias`` and ``patch-size`` as their settings, and
the lines they print: comma lists of numbers, ``--vit-set KEY=VALUE`` items, the summary line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attnlab.config.overrides import parse_overrides
from attnlab.errors import UserError
from attnlab.experiments.inductive_bias import InductiveBiasSettings, format_table
from attnlab.experiments.inductive_bias import run_inductive_bias as _run_inductive_bias
from attnlab.experiments.patch_size import PatchSizeSettings
from attnlab.experiments.patch_size import run_patch_size as _run_patch_size

__all__ = ["numbers", "model_overrides", "inductive_bias", "patch_size"]

AUGMENT = {"auto": None, "on": True, "off": False}


def numbers(text: str, kind: type, flag: str) -> list:
    """``"0.1,0.25"`` -> ``[0.1, 0.25]``. Raises UserError naming ``flag`` on a non-number."""
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} must be comma-separated numbers, got {text!r}") from None


def model_overrides(items: list[str], flag: str) -> dict[str, Any]:
    """``--vit-set d_model=96`` items -> ``{"d_model": 96}`` (the one ``--set`` value parser).

    Raises:
        UserError: an item that sets another section than ``model``.
    """
    out = {}
    for key, value in parse_overrides(items).items():
        section, _, name = key.partition(".")
        if section != "model":
            raise UserError(f"{flag} sets model fields (KEY=VALUE), got {key!r}")
        out[name] = value
    return out


def _settings(cls: type, args: Any, **extra: Any) -> Any:
    named = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
             if f.init and hasattr(args, f.name)}  # fmt: skip
    return cls(**{**named, **extra})


def _summary(result: dict[str, Any], out: str) -> str:
    return (
        f"\n{len(result['runs'])} runs in {result['elapsed']:.0f} s; table, JSON and plot in {out}"
    )


def inductive_bias(args: Any) -> str:
    """Run the sweep the flags describe; its table and summary line."""
    settings = _settings(
        InductiveBiasSettings, args,
        fractions=numbers(args.fractions, float, "--fractions"),
        seeds=numbers(args.seeds, int, "--seeds"),
        models=[m.strip() for m in args.models.split(",") if m.strip()],
        augment=AUGMENT[args.augment],
        **{k: model_overrides(getattr(args, f"{k}_set"), f"--{k}-set")
           for k in ("vit", "cnn", "deit")},
    )  # fmt: skip
    result = _run_inductive_bias(settings, args.out, progress=not args.no_progress,
                                 overwrite=args.overwrite)  # fmt: skip
    return format_table(result) + "\n" + _summary(result, args.out)


def patch_size(args: Any) -> str:
    """Run the patch sizes the flags describe; its table and summary line."""
    settings = _settings(
        PatchSizeSettings, args,
        patch_sizes=numbers(args.patch_sizes, int, "--patch-sizes"),
        seeds=numbers(args.seeds, int, "--seeds"),
        vit=model_overrides(args.vit_set, "--vit-set"),
    )  # fmt: skip
    result = _run_patch_size(settings, args.out, progress=not args.no_progress,
                             overwrite=args.overwrite)  # fmt: skip
    return result["markdown"] + "\n" + _summary(result, args.out)

"""``attnlab inspect RUN``: every attention head of a loaded run scored on the run's probe
batch, and the report written as heads.json.

    heads, probe = inspect_run(attnlab.load("runs/lm"))
    write_report(heads, probe, run, "runs/lm/inspect/heads.json")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnlab.errors import UserError
from attnlab.inspect.diagnostics import HeadScores, diagnose
from attnlab.inspect.probe import probe_for

__all__ = ["inspect_run", "write_report"]


def inspect_run(
    run: Any, *, batch: int = 4, length: int = 16, seed: int = 1234, ablation: bool = True
) -> tuple[list[HeadScores], Any]:
    """Score every head of ``run`` (a :class:`attnlab.runs.LoadedRun`) on its probe batch.

    Args:
        batch, length, seed: the probe batch (``length``: the repeated half of an LM's rows).
        ablation: also measure the loss change of ablating each head (one forward per head).

    Returns:
        ``(head scores, the probe)``; no scores for a model without attention heads.

    Raises:
        UserError: a probe the run's kind cannot have (the sizes are the caller's to check).
    """
    try:
        probe = probe_for(run, batch=batch, length=length, seed=seed)
    except ValueError as err:
        raise UserError(str(err)) from None
    heads = diagnose(
        run.model,
        probe.inputs,
        repeated=probe.repeated,
        loss_fn=probe.loss_fn if ablation else None,
        alignment=probe.alignment,
    )
    return heads, probe


def write_report(heads: list[HeadScores], probe: Any, run_name: str, kind: str, path: Path) -> None:
    """``heads.json``: the run, its kind, the probe's description and every head's scores."""
    report = {
        "run": run_name,
        "kind": kind,
        "probe": probe.description,
        "heads": [h.to_dict() for h in heads],
    }
    path.write_text(json.dumps(report, indent=1) + "\n")

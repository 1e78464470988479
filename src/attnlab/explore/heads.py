"""Per-head diagnostics in the explorer, and ablating heads in the served page.

- :func:`head_rows`: the scores of :mod:`attnlab.inspect.diagnostics` (entropy, uniformity,
  previous-token, first-token, diagonal, causal leak) for every head of every view of a payload,
  computed from the weights the payload holds, with the degenerate-head flags;
- :func:`ablation_from_json` / :func:`ablated`: a served page's request to switch heads off
  (``{"ablate": {"blocks.0.attn": [1]}}``), run as zero ablation at ``attn.hook_z``.

The page script ``static/heads.js`` draws the table and, when served, a checkbox per head that
asks the server for the input's prediction with those heads ablated.

Shape legend: L layers, H heads, Tq queries, Tk keys.
"""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from attnlab.errors import UserError
from attnlab.inspect import ablate_heads, flag_head, pattern_scores
from attnlab.inspect.diagnostics import HeadScores
from attnlab.inspect.families import causal_stacks

__all__ = ["ablated", "ablation_from_json", "add_head_rows", "head_rows", "MAX_ABLATED"]

#: most heads one request may ablate
MAX_ABLATED = 256

_LAYER = re.compile(r"^(?:(?P<stack>.*)\.)?(?P<index>\d+)\.(?P<attn>[A-Za-z_]+)$")


def _decode(array: dict) -> torch.Tensor:
    data = np.frombuffer(base64.b64decode(array["data"]), dtype="<f4")
    return torch.from_numpy(data.reshape(array["shape"]).copy())


def head_rows(view: dict, causal_names: set[str]) -> list[dict]:
    """One row of scores per head of ``view`` (layers first), each with ``layer`` (its module
    name), ``head``, the scores and ``flags``."""
    weights = _decode(view["weights"])  # (L, H, Tq, Tk)
    rows = []
    for i, layer in enumerate(view["layers"]):
        m = _LAYER.match(layer)
        stack, attn = (m["stack"] or "", m["attn"]) if m else ("", layer)
        causal = stack in causal_names and attn == "attn"
        scores = pattern_scores(weights[i][None], causal=causal)
        for h in range(weights.shape[1]):
            values = {k: round(float(v[h]), 4) for k, v in scores.items()}
            hs = HeadScores(stack, int(m["index"]) if m else 0, h, "self", causal, **values)
            rows.append(
                {
                    "layer": layer,
                    "head": h,
                    **values,
                    "flags": flag_head(hs),
                    "ablatable": attn in ("attn", "cross_attn"),
                }
            )
    return rows


def add_head_rows(payload: dict, model: nn.Module) -> dict:
    """``payload`` with ``heads``: ``{view id: head_rows(view)}``."""
    names = causal_stacks(model)
    payload["heads"] = {v["id"]: head_rows(v, names) for v in payload.get("views", [])}
    return payload


def ablation_from_json(body: dict) -> dict[str, list[int]] | None:
    """The ``ablate`` field of a request: ``{layer name: [head, ...]}`` or None.

    Raises:
        UserError: a field of the wrong shape, or too many heads.
    """
    spec = body.get("ablate")
    if spec is None or spec == {}:
        return None
    if not isinstance(spec, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(type(h) is int for h in v)
        for k, v in spec.items()
    ):
        raise UserError(
            'ablate must map layer names to lists of head numbers: {"blocks.0.attn": [1]}'
        )
    if sum(len(v) for v in spec.values()) > MAX_ABLATED:
        raise UserError(f"at most {MAX_ABLATED} heads can be ablated at once")
    return {k: list(v) for k, v in spec.items() if v}


@contextlib.contextmanager
def ablated(model: nn.Module, spec: dict[str, list[int]] | None) -> Iterator[None]:
    """Zero-ablate the heads of ``spec`` for the block (nothing when None).

    Raises:
        UserError: a layer without heads to ablate, or a head out of range.
    """
    if not spec:
        yield
        return
    try:
        manager = ablate_heads(model, spec)
        manager.__enter__()
    except ValueError as err:
        raise UserError(f"cannot ablate {spec}: {err}") from None
    try:
        yield
    except ValueError as err:
        raise UserError(f"cannot ablate {spec}: {err}") from None
    finally:
        manager.__exit__(None, None, None)

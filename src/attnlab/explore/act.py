"""Universal Transformers with adaptive computation time in the explorer: the shared block's
self-attention at every step, and how many steps each position took.

The input is a parity string (``0110…``, :mod:`attnlab.data.parity`), read as
``[CLS] bits``. One forward pass under :func:`attnlab.attention.capture_attention` records the
shared block's attention once per step; the view's "layers" are the steps (a position that has
halted keeps its state, but the block still computes its row, which is shown). The payload gains
``"act"``: ``{"tokens", "steps", "remainder", "ponder", "max_steps", "halting"}``, the steps N,
remainder R and ponder cost N + R of each position, which the page draws as the "Steps per
position" panel.

Shape legend: T tokens (``[CLS]`` included), N steps run.
"""

from __future__ import annotations

import torch

from attnlab.attention.capture import capture_attention
from attnlab.data.parity import VOCAB, encode_bits
from attnlab.errors import UserError
from attnlab.explore.payload import LayerAttention, make_view
from attnlab.runs import LoadedRun

__all__ = ["KINDS", "INPUT", "QUESTION", "DEFAULT_TEXT", "explain", "default_input"]

KINDS = ("universal_transformer",)
INPUT = "text"
QUESTION = False
#: what the served page starts with
DEFAULT_TEXT = "0110100"
PLACEHOLDER = "a parity string of 0s and 1s"


def default_input(run: LoadedRun) -> dict:
    return {"text": DEFAULT_TEXT}


def explain(run: LoadedRun, inp) -> dict:
    """The payload of one bit string: the attention at every step and the steps per position.

    Raises:
        UserError: characters other than 0/1, a string longer than the model's context.
    """
    model = run.model
    ids = encode_bits(inp.text)
    context = int(model.config.max_seq_len)
    if len(ids) > context:
        raise UserError(
            f"the string is {len(ids) - 1} bits; this model reads at most {context - 1} "
            "(max_seq_len, [CLS] included)"
        )
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        out = model(torch.tensor([ids]))
    name = next(iter(maps), None)
    if name is None:
        raise UserError(f"the {run.kind} model recorded no attention")
    weights, scores = maps.calls(name), maps.score_calls(name)
    steps = [
        LayerAttention(f"step {n + 1}", w[0], scores[n][0] if n < len(scores) else None)
        for n, w in enumerate(weights)
    ]
    tokens = [VOCAB[i] for i in ids]
    view = make_view(
        "self",
        "self-attention, step by step",
        steps,
        queries=tokens,
        keys=tokens,
        note="One shared block applied again and again: the 'layers' are its steps. Row i: "
        "what token i attends to at that step.",
        rollout=True,
        head_dim=model.config.head_dim,
        query=0,
    )
    n_steps = [int(v) for v in out.steps[0]]
    p = out.logits[0].float().softmax(-1)
    label = int(p.argmax())
    truth = sum(ids[1:]) % 2
    halting = model.config.halting
    return {
        "family": "act",
        "input": inp.text,
        "summary": [
            f"{len(ids) - 1} bits; predicted parity {label} (p = {float(p[label]):.2f}); "
            f"the true parity is {truth}",
            f"steps per position ({halting}, budget {model.config.max_steps}): "
            + ", ".join(f"{t} {n}" for t, n in zip(tokens, n_steps)),
        ],
        "image": None,
        "views": [view],
        "act": {
            "tokens": tokens,
            "steps": n_steps,
            "remainder": [round(float(v), 4) for v in out.remainder[0]],
            "ponder": [round(float(v), 4) for v in out.ponder[0]],
            "max_steps": int(model.config.max_steps),
            "halting": halting,
        },
    }

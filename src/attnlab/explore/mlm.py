"""Masked-LM encoders in the explorer: bidirectional self-attention over ``[CLS] text [SEP]`` and
what the model fills in at every ``[MASK]``.

One forward pass of ``model(idx)`` under :func:`attnlab.attention.capture_attention` gives each
block's weights ``(H, T, T)`` (every token attends to every token, both sides) and raw scores,
and the logits the predictions are read from. Predictions follow
:func:`attnlab.tasks.mlm.fill_mask`: the text is read as ``[CLS] text [SEP]``, every mask is
predicted from the same input, the candidates are plain tokens (never a special), with the
model's softmax over its whole vocabulary.

The payload gains ``"predictions"``: one entry per ``[MASK]``, ``{"view", "query", "mask",
"candidates": [{"token", "p"}]}`` (``query`` is the mask's row in the view, ``[CLS]`` counted).

Shape legend: T tokens (``[CLS]`` and ``[SEP]`` included), V vocabulary.
"""

from __future__ import annotations

import torch

from attnlab.attention.capture import capture_attention
from attnlab.data.tokenizers import TokenizerWithSpecials
from attnlab.errors import UserError
from attnlab.explore.payload import group_layers, head_dim_of, make_view
from attnlab.explore.text import MAX_CHARS, readable_text, token_labels
from attnlab.runs import LoadedRun

__all__ = ["KINDS", "INPUT", "QUESTION", "TOP_K", "DEFAULT_TEXT", "explain", "default_input"]

KINDS = ("encoder_mlm",)
INPUT = "text"
QUESTION = False
#: candidates shown per [MASK]
TOP_K = 5
#: what the served page starts with (the README's fill-mask example)
DEFAULT_TEXT = "the return [MASK]alue of the function"
#: what the served page's text box says before anything is typed
PLACEHOLDER = "text with [MASK] where a token is to be predicted"


def encode_masked(run: LoadedRun, text: str) -> list[int]:
    """``[CLS] text [SEP]`` as ids, checked against the model's context.

    Raises:
        UserError: a tokenizer without ``[MASK]``, empty text, characters outside a character
            tokenizer's alphabet, more tokens than the context holds.
    """
    tok = run.tokenizer
    if not isinstance(tok, TokenizerWithSpecials):
        raise UserError(f"{run.run_dir} has no tokenizer with [MASK]: train it with 'train mlm'")
    if len(text) > MAX_CHARS:
        raise UserError(
            f"the text has {len(text)} characters; the explorer reads at most {MAX_CHARS}"
        )
    ids = tok.encode(text)  # raises on characters outside a char vocabulary
    if not ids:
        raise UserError("the text is empty: give at least one token")
    seq = [tok.cls_id, *ids, tok.sep_id]
    context = int(run.model.config.max_seq_len)
    if len(seq) > context:
        raise UserError(
            f"the text is {len(ids)} tokens, {len(seq)} with [CLS] and [SEP]; this model's "
            f"context is {context} tokens (max_seq_len): shorten it"
        )
    return seq


def predictions(tok: TokenizerWithSpecials, seq: list[int], logits: torch.Tensor) -> list[dict]:
    """The payload's ``predictions`` for the ``[MASK]`` positions of ``seq`` (``logits (T, V)``)."""
    probs = logits.float().softmax(-1)[:, : tok.base.vocab_size]  # plain tokens only
    k = min(TOP_K, probs.shape[-1])
    out = []
    for n, pos in enumerate(i for i, t in enumerate(seq) if t == tok.mask_id):
        p, idx = probs[pos].topk(k)
        cands = [{"token": tok.decode([int(i)]), "p": float(q)} for q, i in zip(p, idx)]
        out.append({"view": "self", "query": pos, "mask": n, "candidates": cands})
    return out


def explain(run: LoadedRun, inp) -> dict:
    """The payload of one text: the encoder's self-attention view and the masks' predictions."""
    model, tok = run.model, run.tokenizer
    seq = encode_masked(run, inp.text)
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        logits = model(torch.tensor([seq]))  # (1, T, V)
    groups = group_layers(maps, lambda stack, attn, name: "self")
    if "self" not in groups:
        raise UserError(f"the {run.kind} model recorded no attention")
    layers = groups["self"]
    tokens = token_labels(tok, seq)
    preds = predictions(tok, seq, logits[0])
    config = getattr(model, "config", None)
    view = make_view(
        "self",
        "self-attention (bidirectional)",
        layers,
        queries=tokens,
        keys=tokens,
        note="Row i: what token i attends to, on both sides (an encoder has no causal mask).",
        rollout=True,
        head_dim=head_dim_of(model, layers[0].name),
        scores_have_bias=getattr(config, "position", None) == "alibi",
        query=preds[0]["query"] if preds else 0,
    )
    summary = [f"{len(seq)} tokens with [CLS] and [SEP]"]
    for p in preds:
        guesses = ", ".join(f"{c['token']!r} {c['p']:.2f}" for c in p["candidates"])
        summary.append(f"[MASK] {p['mask'] + 1} (token {p['query']}): {guesses}")
    if not preds:
        summary.append("no [MASK] in the text: write [MASK] where a token is to be predicted")
    return {
        "family": "mlm",
        "input": inp.text,
        "summary": summary,
        "image": None,
        "views": [view],
        "predictions": preds,
    }


def default_input(run: LoadedRun) -> dict | None:
    """What the served page shows first: ``{"text": DEFAULT_TEXT}`` less the characters the
    vocabulary lacks (None when nothing is left)."""
    tok, context = run.tokenizer, int(run.model.config.max_seq_len)
    if not isinstance(tok, TokenizerWithSpecials):
        return None
    text = readable_text(tok, DEFAULT_TEXT, keep=("[MASK]",))
    while " " in text and len(tok.encode(text)) + 2 > context:  # [CLS] and [SEP]
        text = text.rsplit(" ", 1)[0]
    if not text.strip() or len(tok.encode(text)) + 2 > context:
        return None
    return {"text": text}

"""Language models in the explorer: the self-attention of every layer and head over a text.

One forward pass of ``model(idx)`` under :func:`attnlab.attention.capture_attention` gives each
block's weights ``(H, T, T)`` and raw scores; the page draws the head view (lines from every token
to the tokens it attends), the model view (layers × heads), the entropies and the rollout. The
summary is the model's guess for the next token.

Shape legend: T tokens, V vocabulary.
"""

from __future__ import annotations

import torch

from attnlab.attention.capture import capture_attention
from attnlab.errors import UserError
from attnlab.explore.payload import group_layers, head_dim_of, make_view, top_guesses
from attnlab.runs import LoadedRun

__all__ = [
    "KINDS",
    "INPUT",
    "QUESTION",
    "MAX_CHARS",
    "DEFAULT_TEXT",
    "explain",
    "token_labels",
    "readable_text",
    "default_input",
]

KINDS = ("decoder_lm",)
INPUT = "text"
QUESTION = False
#: longest text the explorer reads (the context bounds it further)
MAX_CHARS = 4000
#: what the served page starts with when no --input is given
DEFAULT_TEXT = "The attention weights of the model are"
PLACEHOLDER = "text to explain"


def token_labels(tokenizer, ids: list[int]) -> list[str]:
    """What each token reads as: the text it adds to the decoded prefix (a byte-level BPE token
    that ends inside a multi-byte character shows as the part it completes)."""
    labels, prev = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1])
        labels.append(
            text[len(prev) :] if text.startswith(prev) else tokenizer.decode(ids[i : i + 1])
        )
        prev = text
    return labels


def readable_text(tokenizer, text: str, *, keep: tuple[str, ...] = ()) -> str:
    """``text`` without the characters ``tokenizer`` cannot encode (a character vocabulary
    lacks some); the strings in ``keep`` (special tokens) stay whole."""
    if tokenizer is None:
        return ""
    out, pos = [], 0
    while pos < len(text):
        special = next((k for k in keep if text.startswith(k, pos)), None)
        if special:
            out.append(special)
            pos += len(special)
            continue
        try:
            if tokenizer.encode(text[pos]):
                out.append(text[pos])
        except (UserError, KeyError, ValueError):
            pass
        pos += 1
    return "".join(out)


def default_input(run: LoadedRun) -> dict | None:
    """What the served page shows first: ``{"text": ...}``, :data:`DEFAULT_TEXT` less the
    characters the vocabulary lacks, cut to the context (None when nothing is left)."""
    text = readable_text(run.tokenizer, DEFAULT_TEXT)
    context = int(getattr(run.model.config, "max_seq_len", len(text)))
    while text and len(run.tokenizer.encode(text)) > context:
        text = text.rsplit(" ", 1)[0] if " " in text else text[:context]
    return {"text": text} if text.strip() else None


def encode_text(run: LoadedRun, text: str) -> list[int]:
    """Token ids of ``text``, checked against the model's context.

    Raises:
        UserError: no tokenizer in the run, empty text, characters outside a character
            tokenizer's alphabet, or more tokens than the context holds.
    """
    if run.tokenizer is None:
        raise UserError(
            f"{run.run_dir} has no tokenizer.json: the explorer cannot read text for it"
        )
    if len(text) > MAX_CHARS:
        raise UserError(
            f"the text has {len(text)} characters; the explorer reads at most {MAX_CHARS}"
        )
    ids = run.tokenizer.encode(text)
    if not ids:
        raise UserError("the text is empty: give at least one token")
    context = run.model.config.max_seq_len
    if len(ids) > context:
        raise UserError(
            f"the text is {len(ids)} tokens; this model's context is {context} tokens "
            "(max_seq_len): shorten it"
        )
    return ids


def explain(run: LoadedRun, inp) -> dict:
    """The payload of one text: one self-attention view over its tokens, plus the next token."""
    model = run.model
    ids = encode_text(run, inp.text)
    idx = torch.tensor([ids])  # (1, T)
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        logits = model(idx)  # (1, T, V)
    groups = group_layers(maps, lambda stack, attn, name: "self")
    if "self" not in groups:
        raise UserError(f"the {run.kind} model recorded no attention")
    tokens = token_labels(run.tokenizer, ids)
    layers = groups["self"]
    config = getattr(model, "config", None)
    causal = run.kind == "decoder_lm"
    view = make_view(
        "self",
        "self-attention",
        layers,
        queries=tokens,
        keys=tokens,
        note=(
            "Row i: what token i attends to"
            + (" (causal: only itself and earlier tokens)." if causal else ".")
        ),
        rollout=True,
        head_dim=head_dim_of(model, layers[0].name),
        scores_have_bias=getattr(config, "position", None) == "alibi",
        query=len(ids) - 1,
    )
    guesses = top_guesses(logits[0, -1], 5, lambda i: repr(run.tokenizer.decode([i])))
    return {
        "family": "text",
        "input": inp.text,
        "summary": [f"{len(ids)} tokens", f"next token: {guesses}"],
        "image": None,
        "views": [view],
    }

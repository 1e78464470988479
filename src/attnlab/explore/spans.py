"""Span filling in the explorer: a ``t5_span`` run reads a text with sentinels (``<extra_id_0>``
where a span is missing) and writes the spans; the views are the translation family's: encoder
self-attention, decoder self-attention, and the cross-attention from each written token to the
input tokens (:func:`attnlab.explore.translation.alignment_views`).

The text is filled greedily through :mod:`attnlab.decoding`, then the model reads the input and
its own output once more with teacher forcing under :func:`attnlab.attention.capture_attention`,
as for translation.

Shape legend: S input tokens, T output tokens.
"""

from __future__ import annotations

import torch

from attnlab.attention.capture import capture_attention
from attnlab.decoding import greedy_search
from attnlab.errors import UserError
from attnlab.explore.payload import group_layers
from attnlab.explore.translation import alignment_views, classify_layer
from attnlab.runs import LoadedRun

__all__ = ["KINDS", "INPUT", "QUESTION", "DEFAULT_TEXT", "explain", "fill"]

KINDS = ("t5_span",)
INPUT = "text"
QUESTION = False
DEFAULT_TEXT = "the return <extra_id_0> of the function"
PLACEHOLDER = "text with <extra_id_0>, <extra_id_1>, ... where spans are missing"
MAX_CHARS = 2000
#: most tokens written for the spans
MAX_OUTPUT = 64


def _pieces(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


def fill(run: LoadedRun, text: str) -> tuple[list[int], list[int]]:
    """Greedy span filling of ``text``: ``(input ids with </s>, output ids)``.

    Raises:
        UserError: a text without a sentinel, a text too long, characters the tokenizer lacks.
    """
    tok, model = run.tokenizer, run.model
    if len(text) > MAX_CHARS:
        raise UserError(f"the text has {len(text)} characters; the explorer reads {MAX_CHARS}")
    if "<extra_id_0>" not in text:
        raise UserError("write <extra_id_0> (then <extra_id_1>, ...) where a span is missing")
    ids = tok.special_ids
    src_ids = [*tok.encode(text), ids["</s>"]]
    src = torch.tensor([src_ids])  # (1, S)
    mask = torch.ones_like(src, dtype=torch.bool)
    with torch.no_grad():
        state = model.start_decoding(src, mask, MAX_OUTPUT + 1)
        start = torch.tensor([[ids["<pad>"]]])
        pad = ids["<pad>"]  # the decoder's start, never written
        hyp = greedy_search(
            model, state, start, max_len=MAX_OUTPUT, end_id=ids["</s>"], pad_id=pad, banned=[pad]
        )[0]
    return src_ids, list(hyp.ids)


def explain(run: LoadedRun, inp) -> dict:
    """The payload of one text: encoder, decoder and cross-attention views."""
    model, tok = run.model, run.tokenizer
    src_ids, out_ids = fill(run, inp.text)
    if not out_ids:
        raise UserError("the model wrote nothing for this text")
    tgt_in = [tok.special_ids["<pad>"], *out_ids[:-1]]  # (T,): what each decoder position reads
    src = torch.tensor([src_ids])
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(src, torch.ones_like(src, dtype=torch.bool), torch.tensor([tgt_in]))
    groups = group_layers(maps, classify_layer)
    views = alignment_views(
        run.kind, model, groups, _pieces(tok, src_ids), _pieces(tok, out_ids), _pieces(tok, tgt_in)
    )
    return {
        "family": "translation",
        "input": inp.text,
        "summary": [f"spans: {tok.decode(out_ids)}", f"{len(src_ids)} input tokens"],
        "image": None,
        "views": views,
    }

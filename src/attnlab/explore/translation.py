"""Translation in the explorer: encoder self-attention, decoder self-attention and the
cross-attention alignment between the source words and the output words.

The sentence is translated greedily through :mod:`attnlab.decoding`, then the model reads the
source and its own output once more with teacher forcing, ``model(src, src_mask, tgt_in)``, under
:func:`attnlab.attention.capture_attention`; with a KV cache or without, the decoder computes the
same attention, so these are the weights the translation was made with. Row t of a decoder map is
the position that produced output word t (its input is ``<start>`` or word t − 1).

The Transformer reports every layer's ``encoder.*.attn``, ``decoder.*.attn`` and
``decoder.*.cross_attn``; the RNN with Bahdanau attention reports one ``(S,)`` distribution per
decoding step, stacked here into one single-head alignment.

Shape legend: S source tokens, T output tokens.
"""

from __future__ import annotations

import torch

from attnlab.attention.additive import SCORE_FORMULAS
from attnlab.attention.capture import capture_attention
from attnlab.decoding import greedy_search
from attnlab.errors import UserError
from attnlab.explore.payload import group_layers, head_dim_of, make_view
from attnlab.runs import LoadedRun

__all__ = [
    "KINDS",
    "INPUT",
    "QUESTION",
    "MAX_SOURCE_TOKENS",
    "DEFAULT_TEXT",
    "explain",
    "translate",
    "alignment_views",
    "classify_layer",
    "default_input",
]

KINDS = ("transformer", "t5", "rnn-attn")
INPUT = "text"
QUESTION = False
#: longest source sentence (tokens) for models without a context length of their own
MAX_SOURCE_TOKENS = 256
MAX_CHARS = 2000
#: what the served page starts with (the numbers task's example)
DEFAULT_TEXT = "three hundred and forty two"
PLACEHOLDER = "a sentence to translate"

PAD, START, END = "<pad>", "<start>", "<end>"
#: what the raw scores of each kind are (the Transformer's: q·k/√d)
_SCORE_LABELS = {
    "t5": "q·k + b(j − i)",
    "t5_span": "q·k + b(j − i)",
}


def _score_label(kind: str, model) -> str:
    """What the raw scores of ``model`` are: its alignment score's formula for ``rnn-attn``."""
    score = getattr(getattr(model, "config", None), "score", None)
    if kind == "rnn-attn" and score in SCORE_FORMULAS:
        return SCORE_FORMULAS[score]
    return _SCORE_LABELS.get(kind, "q·k/√d")


def classify_layer(stack: str, attn: str, name: str) -> str | None:
    """Which view a captured layer belongs to: ``cross``, ``encoder``, ``decoder`` (or None)."""
    s = stack.lower()
    if "cross" in attn or attn == "attention":  # Transformer cross-attention; Bahdanau's
        return "cross"
    if "enc" in s:
        return "encoder"
    if "dec" in s:
        return "decoder"
    return None


def _source_limit(model) -> int:
    limit = getattr(getattr(model, "config", None), "max_seq_len", None)
    return min(int(limit), MAX_SOURCE_TOKENS) if limit else MAX_SOURCE_TOKENS


def translate(run: LoadedRun, text: str) -> tuple[list[str], list[int], list[int]]:
    """Greedy translation of ``text``.

    Returns:
        ``(source tokens, source ids, output ids)``; the output ends with ``<end>`` unless it ran
        to the vocabulary's ``max_tgt_len``.

    Raises:
        UserError: an empty sentence, unknown source tokens, a sentence longer than the model's
            context.
    """
    vocabs, model = run.tokenizer, run.model
    if len(text) > MAX_CHARS:
        raise UserError(f"the sentence has {len(text)} characters; the explorer reads {MAX_CHARS}")
    ids = vocabs.encode_source(text)  # raises on an empty sentence or unknown tokens
    limit = _source_limit(model)
    if len(ids) > limit:
        raise UserError(
            f"the sentence is {len(ids)} tokens; this model's context is {limit} tokens: shorten it"
        )
    tokens = vocabs.src.tokenize(vocabs.normalizer(text))
    if len(tokens) != len(ids):  # a vocabulary whose tokens are not one id each
        tokens = [vocabs.src.itos[i] for i in ids]
    tgt = vocabs.tgt
    start, end, pad = tgt.stoi[START], tgt.stoi[END], tgt.stoi[PAD]
    src = torch.tensor([ids])  # (1, S)
    src_mask = torch.ones_like(src, dtype=torch.bool)  # (1, S)
    # as long as the longest training target twice, plus slack, within the positions
    max_len = 2 * int(vocabs.max_tgt_len) + 8
    cap = getattr(getattr(model, "config", None), "max_seq_len", None)
    max_len = min(max_len, int(cap)) if cap else max_len
    state = model.start_decoding(src, src_mask, max_len)
    hyp = greedy_search(
        model,
        state,
        torch.tensor([[start]]),
        max_len=max_len,
        end_id=end,
        pad_id=pad,
        banned=[pad, start],
    )[0]
    return tokens, ids, list(hyp.ids)


def explain(run: LoadedRun, inp) -> dict:
    """The payload of one sentence: encoder, decoder and cross-attention views."""
    model, tgt = run.model, run.tokenizer.tgt
    src_tokens, src_ids, out_ids = translate(run, inp.text)
    if not out_ids:
        raise UserError("the model produced no output for this sentence")
    tgt_in = [tgt.stoi[START], *out_ids[:-1]]  # (T,): what each decoder position reads
    src = torch.tensor([src_ids])
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(src, torch.ones_like(src, dtype=torch.bool), torch.tensor([tgt_in]))
    groups = group_layers(maps, classify_layer)
    if not groups:
        raise UserError(f"the {run.kind} model recorded no attention")
    produced = [tgt.itos[i] for i in out_ids]
    read = [tgt.itos[i] for i in tgt_in]
    views = alignment_views(run.kind, model, groups, src_tokens, produced, read)
    translation = tgt.decode(out_ids) if hasattr(tgt, "decode") else " ".join(produced)
    return {
        "family": "translation",
        "input": inp.text,
        "summary": [f"translation: {translation}", f"{len(src_ids)} source tokens"],
        "image": None,
        "views": views,
    }


def default_input(run: LoadedRun) -> dict | None:
    """What the served page shows first: :data:`DEFAULT_TEXT` when the source vocabulary has its
    words, else the first few words of the vocabulary."""
    vocabs = run.tokenizer
    try:
        vocabs.encode_source(DEFAULT_TEXT)
        return {"text": DEFAULT_TEXT}
    except UserError:
        pass
    words = [t for t in vocabs.src.itos if not (t.startswith("<") and t.endswith(">"))][:4]
    sep = "" if vocabs.src.level == "char" else " "
    return {"text": sep.join(words)} if words else None


def alignment_views(
    kind: str,
    model,
    groups: dict,
    src_tokens: list[str],
    produced: list[str],
    read: list[str],
) -> list[dict]:
    """The cross-attention, encoder and decoder views of an encoder–decoder's captured maps.

    Args:
        kind: the run's kind (its score label: T5's scores are unscaled).
        groups: :func:`~attnlab.explore.payload.group_layers` of the maps.
        src_tokens: the source tokens (keys of the encoder and cross views).
        produced: the output tokens (queries of the decoder and cross views).
        read: what each decoder position reads (keys of the decoder view).
    """
    views = []
    specs = {
        "encoder": (
            "encoder self-attention",
            src_tokens,
            src_tokens,
            "Each source token attends to every source token.",
        ),
        "decoder": (
            "decoder self-attention",
            produced,
            read,
            "Row t: the position that produced word t; columns: the decoder's inputs so far "
            "(causal).",
        ),
        "cross": (
            "cross-attention (alignment)",
            produced,
            src_tokens,
            "Row t: where in the source the decoder looked while producing word t.",
        ),
    }
    unscaled = kind in ("t5", "t5_span")
    for vid in ("cross", "encoder", "decoder"):
        if vid not in groups:
            continue
        title, queries, keys, note = specs[vid]
        layers = groups[vid]
        views.append(
            make_view(
                vid,
                title,
                layers,
                queries=queries,
                keys=keys,
                note=note,
                rollout=vid == "encoder",
                # T5 does not divide by √d: no "without the 1/√d" column for its scores
                head_dim=None if unscaled else head_dim_of(model, layers[0].name),
                scores_have_bias=unscaled and vid != "cross",  # T5's relative bias
                # Bahdanau scores e_j = vᵀ tanh(W_s s + W_h h_j), when the layer reports them
                score_label=_score_label(kind, model)
                if not (unscaled and vid == "cross")
                else "q·k",
            )
        )
    return views

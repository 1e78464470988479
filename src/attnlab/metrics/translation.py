"""Translating sentences with a trained model, and scoring translations: exact match, BLEU, chrF.

Every translation model (``rnn``, ``rnn-attn``, ``transformer``) implements the decoding interface
of :mod:`attnlab.decoding` (``start_decoding(src, src_mask, max_len)``, ``decode_step(tokens,
state)``), so :func:`decode` is :func:`attnlab.decoding.beam_search` (greedy = width 1) with the
translation vocabulary's conventions: ``<start>`` is fed first, ``<end>`` finishes a sentence,
``<pad>`` and ``<start>`` are never generated. Alignments (:func:`cross_attention_step`) are the
per-step cross-attention of every decoder layer and head (Transformer) or Bahdanau's α
(``rnn-attn``), read through :func:`attnlab.attention.capture_attention`.

Shape legend: B sentences, S source length, T output steps, L decoder layers, H heads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.attention.capture import AttentionMaps
from attnlab.data.translation import (
    END_ID,
    PAD_ID,
    START_ID,
    Batch,
    TranslationVocabs,
    collate,
)
from attnlab.decoding.search import Hypothesis, beam_search
from attnlab.errors import UserError
from attnlab.layers import evaluating

__all__ = [
    "Translation",
    "cross_attention_step",
    "decode",
    "default_max_len",
    "translate_texts",
    "exact_match",
    "bleu",
    "chrf",
    "token_bleu",
    "evaluate_pairs",
    "pair_batches",
    "teacher_forced_tokens",
]


@dataclass
class Translation:
    """A translated input sentence with its tokens (for printing and alignment plots).

    Attributes:
        alignment: ``(L, H, T, S)`` attention of each output step over the source tokens
            (``rnn-attn``: L = H = 1, Bahdanau's α), or None.
    """

    source: str
    text: str
    src_tokens: list[str]
    out_tokens: list[str]  # includes "<end>" when produced: the alignment's rows
    score: float
    alignment: Tensor | None = None
    extra: dict = field(default_factory=dict)


def cross_attention_step(maps: AttentionMaps) -> Tensor | None:
    """One decoding step's attention over the source, ``(B, L, H, S)``, from a capture.

    Transformer: the cross-attention (layers named ``…cross_attn``) of every decoder layer and
    head for the step's last query; ``rnn-attn``: Bahdanau's α as ``L = H = 1``; None for a model
    without attention over the source (``rnn``).
    """
    cross = maps.select("cross_attn")  # L tensors (B, H, T, S)
    if cross:
        return torch.stack([w[:, :, -1] for w in cross], dim=1)  # (B, L, H, S)
    alpha = maps.select("attention")  # Bahdanau: (B, S) for one step
    if alpha:
        return alpha[0][:, None, None, :]  # (B, 1, 1, S)
    return None


def default_max_len(model: nn.Module, max_tgt_len: int) -> int:
    """Decoding limit: twice the longest training target plus slack, within the positions."""
    limit = 2 * max_tgt_len + 8
    cap = getattr(getattr(model, "config", None), "max_seq_len", None)
    return min(limit, cap) if cap else limit


@torch.no_grad()
def decode(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    *,
    beam: int = 1,
    max_len: int,
    alpha: float = 0.6,
    need_weights: bool = False,
) -> list[Hypothesis]:
    """Greedy (``beam == 1``) or beam-search translations of a batch of source sentences.

    Args:
        model: a translation model (the decoding interface of :mod:`attnlab.decoding`).
        src: ``(B, S)`` source ids; src_mask: ``(B, S)`` True for real tokens.
        beam: width (1 = greedy); alpha: GNMT length-penalty exponent (beam search; greedy
            scores are plain log-probabilities).
        max_len: most output tokens per sentence (``<end>`` included).
        need_weights: attach ``Hypothesis.alignment`` ``(L, H, T, S)`` (None without attention).

    Returns:
        The best :class:`~attnlab.decoding.Hypothesis` per sentence.
    """
    state = model.start_decoding(src, src_mask, max_len)
    first = torch.full((src.shape[0], 1), START_ID, dtype=torch.long, device=src.device)
    return beam_search(
        model,
        state,
        first,
        beam=beam,
        max_len=max_len,
        end_id=END_ID,
        pad_id=PAD_ID,
        alpha=alpha if beam > 1 else 0.0,
        banned=(PAD_ID, START_ID),
        step_attention=cross_attention_step if need_weights else None,
    )


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def translate_texts(
    model: nn.Module,
    vocabs: TranslationVocabs,
    texts: Sequence[str],
    *,
    beam: int = 1,
    alpha: float = 0.6,
    batch_size: int = 64,
    max_len: int | None = None,
    need_weights: bool = False,
    strict: bool = True,
) -> list[Translation]:
    """Normalise, encode, decode and detokenise a list of sentences.

    Args:
        model: a trained translation model (eval mode is set here).
        vocabs: the run's vocabularies (``attnlab.runs.load(run_dir)[1]``).
        texts: input sentences.
        beam, alpha: beam width and length penalty (beam 1 = greedy).
        batch_size: sentences decoded together.
        max_len: output limit (default from the training data's longest target).
        need_weights: attach alignments.
        strict: refuse sentences with tokens outside the source vocabulary.

    Raises:
        UserError: an empty sentence, (``strict``) unknown tokens, or a sentence longer than the
            Transformer's ``max_seq_len``; the message names them.
    """
    if not texts:
        raise UserError("no input sentences to translate")
    model.eval()
    ids = []
    for i, t in enumerate(texts):
        try:
            ids.append(vocabs.encode_source(t, strict=strict))
        except UserError as err:
            if len(texts) > 1:
                err.args = (f"input {i + 1}: {err}",)  # (the same class: UnknownTokens stays)
            raise
    cap = getattr(getattr(model, "config", None), "max_seq_len", None)  # transformer positions
    for i, x in enumerate(ids):
        if cap is not None and len(x) > cap:
            where = f"input {i + 1}" if len(ids) > 1 else "the input"
            raise UserError(
                f"{where} has {len(x)} source tokens; this model takes at most {cap} "
                "(max_seq_len, set from the longest training pair)"
            )
    max_len = max_len or default_max_len(model, vocabs.max_tgt_len)
    dev = _device(model)
    out: list[Translation] = []
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        batch = collate(chunk)
        hyps = decode(
            model,
            batch.src.to(dev),
            batch.src_mask.to(dev),
            beam=beam,
            max_len=max_len,
            alpha=alpha,
            need_weights=need_weights,
        )
        for j, h in enumerate(hyps):
            src_ids = chunk[j]
            a = None if h.alignment is None else h.alignment[..., : len(src_ids)]
            out.append(
                Translation(
                    texts[start + j],
                    vocabs.tgt.decode(h.ids),
                    [vocabs.src.itos[i] for i in src_ids],
                    [vocabs.tgt.itos[i] for i in h.ids],
                    h.score,
                    a,
                )
            )
    return out


# ----------------------------------------------------------------------------------------------
# scores


def exact_match(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Fraction of hypotheses identical to their reference (after whitespace normalisation)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not refs:
        return 0.0
    return sum(" ".join(h.split()) == " ".join(r.split()) for h, r in zip(hyps, refs)) / len(refs)


def bleu(hyps: Sequence[str], refs: Sequence[str], *, tokenize: str = "13a") -> float:
    """Corpus BLEU (sacrebleu), 0-100; ``tokenize="none"`` for pre-tokenised text."""
    import sacrebleu  # lazy: ~0.3 s and ~80 modules; only scoring needs it

    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)], tokenize=tokenize).score)


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus chrF (sacrebleu), 0-100: character n-gram F-score, kinder to compound words."""
    import sacrebleu  # lazy: ~0.3 s and ~80 modules; only scoring needs it

    return float(sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score)


def token_bleu(vocabs: TranslationVocabs, hyps: Sequence[str], refs: Sequence[str]) -> float | None:
    """BLEU over the target vocabulary's tokens of normalised ``hyps`` and ``refs``.

    Returns None when no reference has four tokens (BLEU-4 is undefined, not 0).
    """
    hyp_toks = [" ".join(vocabs.tgt.tokenize(h)) for h in hyps]
    ref_toks = [" ".join(vocabs.tgt.tokenize(r)) for r in refs]
    if not any(len(r.split()) >= 4 for r in ref_toks):
        return None
    return bleu(hyp_toks, ref_toks, tokenize="none")


@torch.no_grad()
def evaluate_pairs(
    model: nn.Module,
    vocabs: TranslationVocabs,
    pairs: Sequence[tuple[str, str]],
    *,
    beam: int = 1,
    alpha: float = 0.6,
    batch_size: int = 64,
    max_len: int | None = None,
) -> dict:
    """Translate the sources of ``pairs`` and score them against the targets.

    Exact match compares target-vocabulary token sequences (so word-level detokenisation spaces
    do not count). BLEU is computed over the target vocabulary's tokens (words, BPE pieces or
    characters, both sides tokenised the same way): Italian and German numbers are single
    compound words, so word-level BLEU would only repeat exact match. chrF works on the
    detokenised text. Unknown source tokens become ``<unk>`` here (held-out data may contain
    unseen words).

    Returns:
        ``{"exact_match", "bleu", "chrf", "n", "hypotheses", "references", "correct"}``;
        ``bleu`` is None when no reference has four tokens.
    """
    with evaluating(model):  # translate_texts leaves the model in eval mode
        res = translate_texts(
            model,
            vocabs,
            [s for s, _ in pairs],
            beam=beam,
            alpha=alpha,
            batch_size=batch_size,
            max_len=max_len,
            strict=False,
        )
    hyps = [r.text for r in res]
    refs = [vocabs.normalizer(t) for _, t in pairs]
    # exact match on token sequences: word-level output is detokenised with a space between all
    # tokens ("buongiorno , anna !"), which the reference text does not have
    correct = [vocabs.tgt.tokenize(h) == vocabs.tgt.tokenize(r) for h, r in zip(hyps, refs)]
    return {
        "exact_match": sum(correct) / len(correct) if correct else 0.0,
        "bleu": token_bleu(vocabs, hyps, refs),
        "chrf": chrf(hyps, refs),
        "n": len(pairs),
        "hypotheses": hyps,
        "references": refs,
        "correct": correct,
    }


def pair_batches(
    vocabs: TranslationVocabs,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int = 128,
    device: torch.device | str = "cpu",
) -> Iterator[Batch]:
    """Teacher-forcing batches of ``(source, reference)`` pairs, in order (unknown source
    tokens become ``<unk>``)."""
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        yield collate(
            [vocabs.src.encode(vocabs.normalizer(s)) for s, _ in chunk],
            [vocabs.tgt.encode(vocabs.normalizer(t)) for _, t in chunk],
        ).to(device)


@torch.no_grad()
def teacher_forced_tokens(
    model: nn.Module,
    vocabs: TranslationVocabs,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int = 128,
) -> tuple[Tensor, Tensor]:
    """Logits and targets of every reference token (``<end>`` included) under teacher forcing.

    Returns:
        ``(logits (N, V) float32 on the CPU, targets (N,))`` over the N non-padding positions.
    """
    logits, targets = [], []
    with evaluating(model):
        for batch in pair_batches(vocabs, pairs, batch_size=batch_size, device=_device(model)):
            out = model(batch.src, batch.src_mask, batch.tgt_in)  # (B, T, V)
            real = batch.tgt_out != PAD_ID  # (B, T)
            logits.append(out[real].float().cpu())
            targets.append(batch.tgt_out[real].cpu())
    return torch.cat(logits), torch.cat(targets)

"""Decoding and evaluation for the translation models: greedy, beam search, alignments, metrics.

Models expose a small incremental-decoding interface (``rnn``, ``rnn-attn`` and ``transformer``
alike)::

    state = model.start_decoding(src (B,S), src_mask (B,S), max_len)   # encode once
    logits (B,V), state = model.decode_step(prev (B,), state, need_weights=...)
    state = state.reorder(index (B',))                                   # beam bookkeeping

so one beam search serves all of them; the Transformer's state carries its KV caches.

Beam search keeps the K best partial translations of each sentence by summed log-probability;
a beam that has produced ``<end>`` is finished and only carries its score forward. The final choice
normalises by the GNMT length penalty (Wu et al. 2016)

    score(y) = log p(y | x) / lp(y),   lp(y) = ((5 + |y|) / 6)^α     (|y| counts <end>)

with α = 0 meaning no normalisation. Width 1 is exactly greedy decoding.

Shape legend: B sentences, K beam width, S source length, V target vocabulary, L decoder layers,
H heads, T output steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.data.translation import END_ID, PAD_ID, START_ID, TranslationVocabs, collate
from attnlab.errors import UserError

__all__ = [
    "Hypothesis",
    "Translation",
    "greedy_decode",
    "beam_search",
    "decode",
    "length_penalty",
    "translate_texts",
    "exact_match",
    "bleu",
    "chrf",
    "evaluate_pairs",
    "default_max_len",
    "build_model",
    "model_config",
    "model_from_config",
    "train_defaults",
]


def _families() -> dict:
    from attnlab.models.rnn import AttnRNNSeq2Seq, RNNSeq2Seq, RNNSeq2SeqConfig
    from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

    return {
        "rnn": (RNNSeq2Seq, RNNSeq2SeqConfig),
        "rnn-attn": (AttnRNNSeq2Seq, RNNSeq2SeqConfig),
        "transformer": (Seq2SeqTransformer, Seq2SeqConfig),
    }


def model_config(
    kind: str,
    src_vocab_size: int,
    tgt_vocab_size: int,
    *,
    preset: str | None = None,
    max_seq_len: int | None = None,
    **overrides,
):
    """The config :func:`build_model` would use (``RNNSeq2SeqConfig`` or ``Seq2SeqConfig``).

    Raises:
        UserError: unknown kind, preset or config field for this kind.
    """
    families = _families()
    if kind not in families:
        raise UserError(f"unknown translation model {kind!r}; choose from {sorted(families)}")
    cfg_cls = families[kind][1]
    fields = cfg_cls.__dataclass_fields__
    bad = sorted(set(overrides) - set(fields))
    if bad:
        raise UserError(f"option(s) {bad} do not apply to model {kind!r}")
    if max_seq_len is not None and "max_seq_len" in fields:
        overrides["max_seq_len"] = max_seq_len
    try:
        return cfg_cls.preset(
            preset or "small",
            src_vocab_size=src_vocab_size,
            tgt_vocab_size=tgt_vocab_size,
            **overrides,
        )
    except ValueError as err:
        raise UserError(str(err)) from None


def build_model(
    kind: str,
    src_vocab_size: int,
    tgt_vocab_size: int,
    *,
    preset: str | None = None,
    max_seq_len: int | None = None,
    **overrides,
) -> nn.Module:
    """A fresh ``rnn`` / ``rnn-attn`` / ``transformer`` model sized for the vocabularies.

    Args:
        kind: model kind.
        src_vocab_size, tgt_vocab_size: from the data's vocabularies.
        preset: size preset of the family (default ``small``).
        max_seq_len: transformer: position/cache capacity (ignored by the RNNs).
        **overrides: config fields (``cell="lstm"``, ``norm_position="pre"``...).

    Raises:
        UserError: unknown kind, preset or config field for this kind.
    """
    cfg = model_config(
        kind,
        src_vocab_size,
        tgt_vocab_size,
        preset=preset,
        max_seq_len=max_seq_len,
        **overrides,
    )
    return _families()[kind][0](cfg)


def model_from_config(kind: str, config: dict) -> nn.Module:
    """A fresh model of ``kind`` from a saved config dict (``config.json``'s ``"model"``)."""
    cls, cfg_cls = _families()[kind]
    return cls(cfg_cls.from_dict(config))


def train_defaults(kind: str) -> dict:
    """Training settings that differ by family (applied where the user gave none).

    Transformer: label smoothing 0.1, the paper's warm-up + inverse-square-root schedule and Adam
    betas (0.9, 0.98). RNNs: no smoothing, cosine schedule.
    """
    if kind == "transformer":
        return {"label_smoothing": 0.1, "schedule": "inverse_sqrt", "betas": (0.9, 0.98)}
    return {"label_smoothing": 0.0, "schedule": "cosine"}


@dataclass
class Hypothesis:
    """One decoded sentence.

    Attributes:
        ids: output ids without ``<start>``, ending with ``<end>`` unless cut at ``max_len``.
        logprob: summed log-probability of ``ids``.
        score: ``logprob / length_penalty(len(ids))`` (what beam search maximises at the end).
        alignment: ``(L, H, T, S)`` attention of each output step over the source (``rnn-attn``:
            L = H = 1, Bahdanau's α; ``transformer``: cross-attention of every layer and head),
            or None when not requested / the model has no attention.
    """

    ids: list[int]
    logprob: float
    score: float
    alignment: Tensor | None = None


@dataclass
class Translation:
    """A translated input sentence with its tokens (for printing and alignment plots)."""

    source: str
    text: str
    src_tokens: list[str]
    out_tokens: list[str]  # includes "<end>" when produced: the alignment's rows
    score: float
    alignment: Tensor | None = None
    extra: dict = field(default_factory=dict)


def length_penalty(length: Tensor | int, alpha: float) -> Tensor:
    """GNMT length penalty ``((5 + length) / 6) ** alpha``."""
    length = torch.as_tensor(length, dtype=torch.float32)
    return ((5.0 + length) / 6.0) ** alpha


def _step_weights(model: nn.Module, state) -> Tensor | None:
    """The last step's attention as ``(B, L, H, S)``."""
    w = getattr(state, "weights", None)
    if w is None:
        return None
    if w.dim() == 2:  # rnn-attn: (B, S)
        return w[:, None, None, :]
    return w.permute(1, 0, 2, 3)  # transformer: (L, B, H, S) -> (B, L, H, S)


def _has_attention(model: nn.Module) -> bool:
    return getattr(model, "attention", None) is not None or hasattr(model, "cross_attention")


def default_max_len(model: nn.Module, max_tgt_len: int) -> int:
    """Decoding limit: twice the longest training target plus slack, within the positions."""
    limit = 2 * max_tgt_len + 8
    cap = getattr(getattr(model, "config", None), "max_seq_len", None)
    return min(limit, cap) if cap else limit


@torch.no_grad()
def greedy_decode(
    model: nn.Module, src: Tensor, src_mask: Tensor, *, max_len: int, need_weights: bool = False
) -> list[Hypothesis]:
    """Pick the most probable next token at every step, for a batch of sentences.

    Args:
        model: a translation model (see the module docstring for the interface).
        src: ``(B, S)`` source ids; src_mask: ``(B, S)`` True for real tokens.
        max_len: most output tokens per sentence (``<end>`` included).
        need_weights: also collect the attention of every step (``Hypothesis.alignment``).

    Returns:
        One :class:`Hypothesis` per sentence (score = logprob).
    """
    B = src.shape[0]
    state = model.start_decoding(src, src_mask, max_len)
    prev = torch.full((B,), START_ID, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    logprob = torch.zeros(B, device=src.device)
    out, weights = [], []
    want = need_weights and _has_attention(model)
    for _ in range(max_len):
        logits, state = model.decode_step(prev, state, need_weights=want)
        logp = _next_logp(logits)  # (B, V)
        tok = logp.argmax(-1)
        logprob += torch.where(done, 0.0, logp.gather(1, tok[:, None])[:, 0])
        tok = tok.masked_fill(done, PAD_ID)
        out.append(tok)
        if want:
            weights.append(_step_weights(model, state))
        done = done | (tok == END_ID)
        prev = tok
        if bool(done.all()):
            break
    ids = torch.stack(out, 1).tolist()  # (B, T)
    align = torch.stack(weights, 3) if want else None  # (B, L, H, T, S)
    hyps = []
    for b in range(B):
        seq = _cut(ids[b])
        a = None if align is None else align[b, :, :, : len(seq)].cpu()
        hyps.append(Hypothesis(seq, float(logprob[b]), float(logprob[b]), a))
    return hyps


def _next_logp(logits: Tensor) -> Tensor:
    """Next-token log-probabilities; ``<pad>`` and ``<start>`` are never generated."""
    logits = logits.float().clone()
    logits[:, PAD_ID] = float("-inf")
    logits[:, START_ID] = float("-inf")
    return logits.log_softmax(-1)


def _cut(seq: list[int]) -> list[int]:
    """Up to and including the first ``<end>`` (padding after it dropped)."""
    return seq[: seq.index(END_ID) + 1] if END_ID in seq else [t for t in seq if t != PAD_ID]


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    *,
    beam: int = 4,
    max_len: int,
    alpha: float = 0.6,
    need_weights: bool = False,
) -> list[Hypothesis]:
    """Batched beam search of width ``beam`` with the GNMT length penalty ``alpha``.

    All B·K beams advance together through one ``decode_step`` per output position; the model's
    state (the Transformer's KV caches) is reordered to follow the surviving beams.

    Args:
        model, src, src_mask, max_len, need_weights: as in :func:`greedy_decode`.
        beam: width K (1 = greedy).
        alpha: length-penalty exponent (0 = rank by raw log-probability).

    Returns:
        The best :class:`Hypothesis` per sentence by ``score``.

    Raises:
        ValueError: ``beam < 1`` or ``max_len < 1``.
    """
    if beam < 1:
        raise ValueError(f"beam width must be at least 1, got {beam}")
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    B, K, dev = src.shape[0], beam, src.device
    state = model.start_decoding(src, src_mask, max_len)
    state = state.reorder(torch.arange(B, device=dev).repeat_interleave(K))  # (B·K, ...)
    scores = torch.full((B, K), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step is not K copies
    prev = torch.full((B * K,), START_ID, dtype=torch.long, device=dev)
    done = torch.zeros(B * K, dtype=torch.bool, device=dev)
    lengths = torch.zeros(B * K, dtype=torch.long, device=dev)
    tokens = torch.zeros(B * K, 0, dtype=torch.long, device=dev)
    align: Tensor | None = None  # (B·K, L, H, t, S)
    want = need_weights and _has_attention(model)
    for _ in range(max_len):
        logits, state = model.decode_step(prev, state, need_weights=want)
        step_w = _step_weights(model, state) if want else None  # (B·K, L, H, S), parent rows
        logp = _next_logp(logits)  # (B·K, V)
        V = logp.shape[-1]
        # a finished beam may only "emit" padding, at no cost, so its score carries forward
        logp = logp.masked_fill(done[:, None], float("-inf"))
        logp[:, PAD_ID] = logp[:, PAD_ID].masked_fill(done, 0.0)
        cand = (scores.view(B * K, 1) + logp).view(B, K * V)  # (B, K·V)
        scores, idx = cand.topk(K, dim=-1)  # (B, K); -inf entries are dead beams
        parent = idx // V  # (B, K): the beam each survivor extends
        rows = (torch.arange(B, device=dev)[:, None] * K + parent).view(-1)  # (B·K,)
        tok = (idx % V).view(-1)  # (B·K,)
        was_done = done[rows]
        done = was_done | (tok == END_ID)
        lengths = lengths[rows] + (~was_done).long()
        tokens = torch.cat([tokens[rows], tok[:, None]], 1)  # (B·K, t)
        state = state.reorder(rows)
        if step_w is not None:
            w = step_w.index_select(0, rows)[..., None, :]  # (B·K, L, H, 1, S)
            align = w if align is None else torch.cat([align.index_select(0, rows), w], dim=-2)
        prev = tok
        if bool((done | torch.isinf(scores.view(-1))).all()):  # every live beam has ended
            break
    final = scores.view(-1) / length_penalty(lengths, alpha).to(dev)  # (B·K,)
    final = final.masked_fill(~torch.isfinite(scores.view(-1)), float("-inf"))
    best = final.view(B, K).argmax(-1)  # (B,)
    hyps = []
    toks = tokens.tolist()
    for b in range(B):
        r = b * K + int(best[b])
        seq = _cut(toks[r])
        a = None if align is None else align[r, :, :, : len(seq)].cpu()
        hyps.append(Hypothesis(seq, float(scores.view(-1)[r]), float(final[r]), a))
    return hyps


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
    """Greedy for ``beam == 1``, beam search otherwise."""
    if beam == 1:
        return greedy_decode(model, src, src_mask, max_len=max_len, need_weights=need_weights)
    return beam_search(
        model, src, src_mask, beam=beam, max_len=max_len, alpha=alpha, need_weights=need_weights
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
            raise UserError(f"input {i + 1}: {err}" if len(texts) > 1 else str(err)) from None
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
            out_tokens = [vocabs.tgt.itos[i] for i in h.ids]
            a = None if h.alignment is None else h.alignment[..., : len(src_ids)]
            out.append(
                Translation(
                    texts[start + j],
                    vocabs.tgt.decode(h.ids),
                    [vocabs.src.itos[i] for i in src_ids],
                    out_tokens,
                    h.score,
                    a,
                )
            )
    return out


# ----------------------------------------------------------------------------------------------
# metrics


def exact_match(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Fraction of hypotheses identical to their reference (after whitespace normalisation)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not refs:
        return 0.0
    return sum(" ".join(h.split()) == " ".join(r.split()) for h, r in zip(hyps, refs)) / len(refs)


def bleu(hyps: Sequence[str], refs: Sequence[str], *, tokenize: str = "13a") -> float:
    """Corpus BLEU (sacrebleu), 0-100; ``tokenize="none"`` for pre-tokenised text."""
    import sacrebleu

    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)], tokenize=tokenize).score)


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus chrF (sacrebleu), 0-100: character n-gram F-score, kinder to compound words."""
    import sacrebleu

    return float(sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score)


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
    do not count). BLEU is computed over the target vocabulary's tokens (words, BPE pieces or characters, both
    sides tokenised the same way): Italian and German numbers are single compound words, so
    word-level BLEU would only repeat exact match. chrF works on the detokenised text. Unknown
    source tokens become ``<unk>`` here (held-out data may contain unseen words).

    Returns:
        ``{"exact_match", "bleu", "chrf", "n", "hypotheses", "correct"}``; ``bleu`` is None when
        no reference has four tokens.
    """
    was_training = model.training
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
    model.train(was_training)
    hyps = [r.text for r in res]
    refs = [vocabs.normalizer(t) for _, t in pairs]

    def toks(text: str) -> str:
        return " ".join(vocabs.tgt.tokenize(text))

    ref_toks = [toks(r) for r in refs]
    # exact match on token sequences: word-level output is detokenised with a space between all
    # tokens ("buongiorno , anna !"), which the reference text does not have
    correct = [vocabs.tgt.tokenize(h) == vocabs.tgt.tokenize(r) for h, r in zip(hyps, refs)]
    # BLEU-4 needs 4-grams: with only shorter references it is undefined (None), not 0
    has_4grams = any(len(r.split()) >= 4 for r in ref_toks)
    return {
        "exact_match": sum(correct) / len(correct) if correct else 0.0,
        "bleu": (bleu([toks(h) for h in hyps], ref_toks, tokenize="none") if has_4grams else None),
        "chrf": chrf(hyps, refs),
        "n": len(pairs),
        "hypotheses": hyps,
        "correct": correct,
    }

"""Translation decoding through attnlab.decoding: exhaustive optimum on hand-built and real
models, width 1 = greedy, KV cache and recurrent state against recomputation, alignments, scores."""

import itertools
import math
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from attnlab.attention.cache import DecodeState
from attnlab.data.translation import END_ID, PAD_ID, START_ID, Normalizer, TranslationVocabs, Vocab
from attnlab.decoding import length_penalty
from attnlab.metrics.translation import decode, evaluate_pairs
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.models.translation import build_translation_model


def greedy_decode(model, src, mask, *, max_len, need_weights=False):
    return decode(model, src, mask, beam=1, max_len=max_len, need_weights=need_weights)


def beam_search(model, src, mask, *, beam, max_len, alpha=0.6, need_weights=False):
    return decode(
        model, src, mask, beam=beam, max_len=max_len, alpha=alpha, need_weights=need_weights
    )


# ids 0-3 are <pad> <start> <end> <unk>; the fake models' "words" are 4 and 5
A, B = 4, 5
V = 6


@dataclass
class State(DecodeState):
    prefix: torch.Tensor  # (N, t) tokens fed so far, <start> first
    src: torch.Tensor  # (N, S)


class TableModel(nn.Module):
    """Next-token log-probabilities looked up by (source sentence, prefix): a fixed, hand-made or
    seeded-random table, so every sequence's exact score is known."""

    def __init__(self, table=None, seed=0):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.table, self.seed = table or {}, seed

    def logits_for(self, src: tuple, prefix: tuple) -> torch.Tensor:
        if prefix in self.table:
            probs = torch.full((V,), 1e-9)
            for tok, p in self.table[prefix].items():
                probs[tok] = p
            return probs.log()
        g = torch.Generator().manual_seed(hash((self.seed, src, prefix)) % (2**31))
        return torch.randn(V, generator=g) * 2.0

    def start_decoding(self, src, src_mask, max_len):
        return State(torch.zeros(src.shape[0], 0, dtype=torch.long), src)

    def decode_step(self, tokens, state):
        state.prefix = torch.cat([state.prefix, tokens], 1)
        rows = [
            self.logits_for(tuple(s.tolist()), tuple(p.tolist()[1:]))
            for s, p in zip(state.src, state.prefix)
        ]
        return torch.stack(rows), state


def seq_logprob(model: TableModel, src: tuple, seq: tuple) -> float:
    """Exact log p(seq) under the decoders' rule (<pad> and <start> are never generated)."""
    total = 0.0
    for t, tok in enumerate(seq):
        logits = model.logits_for(src, seq[:t]).clone()
        logits[PAD_ID] = logits[START_ID] = float("-inf")
        total += float(logits.log_softmax(-1)[tok])
    return total


def brute_force(model: TableModel, src: tuple, max_len: int, alpha: float):
    """Every output the decoders can produce: words then <end>, or max_len words."""
    words = [A, B, 3]
    best, best_seq = -math.inf, None
    for n in range(max_len + 1):
        for body in itertools.product(words, repeat=n):
            seq = body + (END_ID,) if n < max_len else body
            if not seq:
                continue
            lp = seq_logprob(model, src, seq)
            score = lp / float(length_penalty(len(seq), alpha))
            if score > best:
                best, best_seq = score, list(seq)
    return best_seq, best


def sources(n=1, S=2):
    src = torch.randint(4, 10, (n, S))
    return src, torch.ones(n, S, dtype=torch.bool)


def test_beam_beats_greedy_when_greedy_is_myopic():
    """p(A)=0.6 but every continuation of A is uncertain; p(B)=0.4 then <end> is almost sure:
    greedy takes A (best 0.6·0.4), beam 2 finds B <end> (0.4·0.95)."""
    table = {
        (): {A: 0.6, B: 0.4},
        (A,): {END_ID: 0.4, A: 0.3, B: 0.3},
        (B,): {END_ID: 0.95, A: 0.05},
        (A, END_ID): {},
        (A, A): {END_ID: 1.0},
        (A, B): {END_ID: 1.0},
    }
    model = TableModel(table)
    src, mask = sources()
    g = greedy_decode(model, src, mask, max_len=3)[0]
    b = beam_search(model, src, mask, beam=2, max_len=3, alpha=0.0)[0]
    assert g.ids == [A, END_ID]
    assert b.ids == [B, END_ID]
    assert b.logprob == pytest.approx(math.log(0.4 * 0.95), abs=1e-5)
    assert g.logprob == pytest.approx(math.log(0.6 * 0.4), abs=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_beam_finds_the_exhaustive_optimum(alpha, seed):
    """With width >= the number of live hypotheses nothing is pruned: beam search must return
    exactly the brute-force argmax of logprob / lp(length), for each sentence of a batch."""
    model = TableModel(seed=seed)
    src, mask = sources(n=3)
    max_len = 4
    hyps = beam_search(model, src, mask, beam=3**max_len, max_len=max_len, alpha=alpha)
    for s, h in zip(src, hyps):
        seq, score = brute_force(model, tuple(s.tolist()), max_len, alpha)
        assert h.ids == seq
        assert h.score == pytest.approx(score, abs=1e-4)
        assert h.logprob == pytest.approx(
            seq_logprob(model, tuple(s.tolist()), tuple(seq)), abs=1e-4
        )


@pytest.mark.parametrize("seed", range(4))
def test_beam_never_scores_below_greedy_and_width_one_is_greedy(seed):
    model = TableModel(seed=seed)
    src, mask = sources(n=4)
    g = greedy_decode(model, src, mask, max_len=5)
    b1 = beam_search(model, src, mask, beam=1, max_len=5, alpha=0.0)
    b3 = beam_search(model, src, mask, beam=3, max_len=5, alpha=0.0)
    assert [h.ids for h in b1] == [h.ids for h in g]
    for gh, bh in zip(g, b3):
        assert bh.logprob >= gh.logprob - 1e-5


def test_batched_beam_equals_one_sentence_at_a_time():
    model = TableModel(seed=7)
    src, mask = sources(n=5)
    together = beam_search(model, src, mask, beam=3, max_len=5)
    alone = [
        beam_search(model, src[i : i + 1], mask[i : i + 1], beam=3, max_len=5)[0] for i in range(5)
    ]
    assert [h.ids for h in together] == [h.ids for h in alone]


def _transformer():
    cfg = Seq2SeqConfig.preset("tiny", src_vocab_size=15, tgt_vocab_size=11, dropout=0.0)
    return Seq2SeqTransformer(cfg).eval()


def _src(B=4, S=6):
    lengths = torch.tensor([6, 4, 2, 5])[:B]
    mask = torch.arange(S)[None] < lengths[:, None]
    return torch.randint(4, 15, (B, S)).masked_fill(~mask, 0), mask


def test_cached_greedy_equals_recomputing_the_whole_prefix():
    """The KV-cached decoder produces the same tokens as full forward passes over the prefix."""
    model = _transformer()
    src, mask = _src()
    hyps = greedy_decode(model, src, mask, max_len=8)
    with torch.no_grad():
        ys = torch.full((src.shape[0], 1), START_ID)
        for _ in range(8):
            logits = model(src, mask, ys)[:, -1]
            logits[:, [PAD_ID, START_ID]] = float("-inf")
            ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], 1)
    for b, h in enumerate(hyps):
        ref = ys[b, 1:].tolist()
        ref = ref[: ref.index(END_ID) + 1] if END_ID in ref else ref
        assert h.ids == ref


def test_transformer_width_one_is_greedy_and_alignments_have_one_row_per_output():
    model = _transformer()
    src, mask = _src()
    g = greedy_decode(model, src, mask, max_len=7, need_weights=True)
    b1 = beam_search(model, src, mask, beam=1, max_len=7, need_weights=True)
    b4 = beam_search(model, src, mask, beam=4, max_len=7, need_weights=True)
    assert [h.ids for h in g] == [h.ids for h in b1]
    for hg, hb in zip(g, b1):
        torch.testing.assert_close(hg.alignment, hb.alignment)
    L, H = model.config.n_dec_layers, model.config.n_heads
    for h, n in zip(b4, mask.sum(1).tolist()):
        assert h.alignment.shape == (L, H, len(h.ids), src.shape[1])
        assert h.alignment[..., n:].abs().sum() == 0  # no attention on padding
        # the recorded rows are the cross-attention of the chosen hypothesis: re-run it
        with torch.no_grad():
            i = b4.index(h)
            ys = torch.tensor([[START_ID, *h.ids[:-1]]])
            _, weights = model(src[i : i + 1], mask[i : i + 1], ys, need_weights=True)
        cross = torch.stack(weights["cross"])[:, 0]  # (L, H, T, S)
        torch.testing.assert_close(h.alignment, cross, atol=1e-5, rtol=1e-4)


def test_rnn_attn_alignment_is_bahdanau_alpha_of_the_chosen_hypothesis():
    """rnn-attn: one (1, 1, T, S) map per hypothesis, equal to the α of a teacher-forced re-run;
    the fixed-context rnn has none."""
    model = build_translation_model("rnn-attn", 15, 11, preset="tiny").eval()
    src, mask = _src()
    for h, i in zip(beam_search(model, src, mask, beam=3, max_len=6, need_weights=True), range(4)):
        with torch.no_grad():
            ys = torch.tensor([[START_ID, *h.ids[:-1]]])
            _, alpha = model(src[i : i + 1], mask[i : i + 1], ys, need_weights=True)
        torch.testing.assert_close(h.alignment, alpha[:, None], atol=1e-5, rtol=1e-4)
    rnn = build_translation_model("rnn", 15, 11, preset="tiny").eval()
    assert all(
        h.alignment is None for h in greedy_decode(rnn, src, mask, max_len=4, need_weights=True)
    )


def test_length_penalty_is_gnmt():
    assert float(length_penalty(1, 0.6)) == pytest.approx(1.0)
    assert float(length_penalty(7, 0.6)) == pytest.approx((12 / 6) ** 0.6)
    assert float(length_penalty(9, 0.0)) == 1.0
    with pytest.raises(ValueError, match="beam width"):
        beam_search(TableModel(), *sources(), beam=0, max_len=3)


class Recompute(nn.Module):
    """The same Transformer decoded without any cache: every step re-runs the teacher-forced
    forward pass over the whole prefix, and "reordering" just selects prefix rows. An independent
    reference for the cached decoder's cache reordering under beam search."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def start_decoding(self, src, src_mask, max_len):
        return PrefixState(src, src_mask, torch.zeros(src.shape[0], 0, dtype=torch.long))

    def decode_step(self, tokens, state):
        state.prefix = torch.cat([state.prefix, tokens], 1)  # (N, t)
        return self.model(state.src, state.mask, state.prefix)[:, -1], state


@dataclass
class PrefixState(DecodeState):
    src: torch.Tensor  # (N, S)
    mask: torch.Tensor  # (N, S)
    prefix: torch.Tensor  # (N, t)


@pytest.mark.parametrize("kind", ["transformer", "rnn", "rnn-attn"])
def test_cached_beam_search_equals_recomputing_every_prefix(kind):
    """Beam 3 over a padded batch: the decoding state (the Transformer's self/cross KV caches,
    the RNN's recurrent state), reordered after every step, gives the same hypotheses and scores
    as full recomputation; each returned log-probability is the teacher-forced sum for its
    tokens; each sentence alone gives the same result."""
    if kind == "transformer":
        model = _transformer()
    else:
        model = build_translation_model(kind, 15, 11, preset="tiny").eval()
    src, mask = _src()
    cached = beam_search(model, src, mask, beam=3, max_len=7, alpha=0.6)
    ref = beam_search(Recompute(model), src, mask, beam=3, max_len=7, alpha=0.6)
    assert [h.ids for h in cached] == [h.ids for h in ref]
    for hc, hr in zip(cached, ref):
        assert hc.score == pytest.approx(hr.score, abs=1e-4)
    for i, h in enumerate(cached):
        n = int(mask[i].sum())
        alone = beam_search(model, src[i : i + 1, :n], mask[i : i + 1, :n], beam=3, max_len=7)
        assert alone[0].ids == h.ids  # unpadded and alone: padding and batch mates change nothing
        with torch.no_grad():
            ys = torch.tensor([[START_ID, *h.ids[:-1]]])
            logits = model(src[i : i + 1], mask[i : i + 1], ys)[0]
        logits[:, [PAD_ID, START_ID]] = float("-inf")
        lp = logits.log_softmax(-1).gather(1, torch.tensor(h.ids)[:, None]).sum()
        assert h.logprob == pytest.approx(float(lp), abs=1e-4)


class Oracle(nn.Module):
    """A perfect translator: looks up each source sentence's reference target ids."""

    def __init__(self, table: dict, vocab_size: int):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.table, self.V = table, vocab_size

    def start_decoding(self, src, src_mask, max_len):
        refs = [[*self.table[tuple(s[m].tolist())], END_ID] for s, m in zip(src, src_mask)]
        n = max(len(r) for r in refs)
        padded = torch.tensor([r + [END_ID] * (n - len(r)) for r in refs])  # (N, n)
        return OracleState(padded, 0)

    def decode_step(self, tokens, state):
        state.fed += tokens.shape[1]
        N, n = state.refs.shape
        logits = torch.full((N, self.V), -10.0)
        logits[torch.arange(N), state.refs[:, min(state.fed - 1, n - 1)]] = 10.0
        return logits, state


@dataclass
class OracleState(DecodeState):
    refs: torch.Tensor  # (N, n) each reference then <end>, padded with <end>
    fed: int  # tokens fed so far (<start> first): the next output is refs[:, fed - 1]


@pytest.mark.parametrize("level", ["word", "char", "bpe"])
def test_a_perfect_translator_scores_full_marks(level):
    """Exact match, BLEU and chrF of a model that outputs every reference exactly are 100, also
    for punctuation that word-level detokenisation writes with extra spaces."""
    pairs = [
        ("Good morning, Anna!", "Buongiorno, Anna!"),
        ("Where is the station?", "Dov'è la stazione?"),
        ("I have two cats and one dog.", "Ho due gatti e un cane."),
        ("It's 3.5 km (more or less).", "Sono 3,5 km (più o meno)."),
    ]
    norm = Normalizer()
    src = Vocab.build([norm(s) for s, _ in pairs], "word")
    tgt = Vocab.build([norm(t) for _, t in pairs], level, bpe_vocab_size=60)
    vocabs = TranslationVocabs(src, tgt, norm, max_tgt_len=40)
    table = {tuple(src.encode(norm(s))): tgt.encode(norm(t)) for s, t in pairs}
    for beam in (1, 3):
        res = evaluate_pairs(Oracle(table, len(tgt)), vocabs, pairs, beam=beam)
        assert res["exact_match"] == 1.0 and all(res["correct"]), res["hypotheses"]
        assert res["bleu"] == pytest.approx(100.0) and res["chrf"] == pytest.approx(100.0)
        # the printed text: detokenised back to the reference (word level: but for "3,5")
        assert res["hypotheses"][:3] == [norm(t) for _, t in pairs[:3]]


def _teacher_forced_logprob(model, src, mask, seq) -> float:
    """log p(seq | src) from one teacher-forced forward (<pad>, <start> never generated)."""
    with torch.no_grad():
        logits = model(src, mask, torch.tensor([[START_ID, *seq[:-1]]]))[0]  # (T, V)
    logits[:, [PAD_ID, START_ID]] = float("-inf")
    return float(logits.log_softmax(-1).gather(1, torch.tensor(seq)[:, None]).sum())


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["rnn", "rnn-attn", "transformer"])
def test_real_models_wide_beam_equals_exhaustive_search(kind, alpha):
    """A tiny target vocabulary (3 words + the 4 specials), max_len 3: every output the decoder
    can produce (words then <end>, or 3 tokens cut at max_len) scored by a teacher-forced
    forward; beam search as wide as the search space returns the best one with its score."""
    V_tgt, max_len = 7, 3
    torch.manual_seed(1)
    model = build_translation_model(kind, 15, V_tgt, preset="tiny", dropout=0.0).eval()
    # sharpen the untrained model's next-token distributions (logits × 5, the same in the
    # forward and in decode_step), so that the optimum is not always the shortest output
    head = model.lm_head if kind == "transformer" else model.out
    head.register_forward_hook(lambda module, args, out: out * 5.0)
    src, mask = _src()
    tokens = [t for t in range(V_tgt) if t not in (PAD_ID, START_ID, END_ID)]  # <unk> and words
    candidates = [
        (*body, END_ID) if n < max_len else body
        for n in range(max_len + 1)
        for body in itertools.product(tokens, repeat=n)
    ]
    width = len(tokens) ** max_len  # more than the live prefixes at any step
    hyps = beam_search(model, src, mask, beam=width, max_len=max_len, alpha=alpha)
    for i, h in enumerate(hyps):
        row_src, row_mask = src[i : i + 1], mask[i : i + 1]
        scored = [
            (_teacher_forced_logprob(model, row_src, row_mask, list(seq)), seq)
            for seq in candidates
        ]
        best_lp, best = max(scored, key=lambda x: x[0] / float(length_penalty(len(x[1]), alpha)))
        assert h.ids == list(best)
        assert h.logprob == pytest.approx(best_lp, abs=1e-4)
        assert h.score == pytest.approx(best_lp / float(length_penalty(len(best), alpha)), abs=1e-4)

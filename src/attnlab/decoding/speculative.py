"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023) and prompt lookup: several
tokens per read of the target's weights, with the target's output distribution exactly.

Batch-1 decoding reads every weight once per token. A forward over k + 1 tokens reads them once
too, so if something cheap guesses the next k tokens, the target can check all of them at once:

    draft   x₁ … x_k ~ q(· | prefix) one at a time       (a small LM with its own KV cache, or
                                                          prompt lookup: copied from the context)
    target  p₁ … p_{k+1} = p(· | prefix, x<ᵢ)            (one forward of k + 1 tokens, KV cache)
    accept  xᵢ with probability min(1, pᵢ(xᵢ) / qᵢ(xᵢ)), left to right, until one is rejected
    then    at the first rejection i: a token ~ norm(max(0, pᵢ − qᵢ))   (the correction)
            all accepted: a token ~ p_{k+1}                               (the bonus)

Every round yields between 1 and k + 1 tokens, and each token is distributed exactly as the
target's (the papers' theorem: P(x) = min(p, q)(x) + (1 − Σ min(p, q)) · norm(p − q)⁺(x) = p(x)).
``p`` and ``q`` are the *processed* distributions (temperature, top-k, top-p:
:func:`~attnlab.decoding.probs.next_token_probs`), so sampling with those settings keeps the
target's processed distribution. Greedy decoding accepts xᵢ when it is the target's argmax and
then emits the target's argmax: the tokens of plain greedy decoding (the logits of a k + 1 token
forward equal those of k + 1 single steps up to float rounding, so only a near-tie can differ;
greedy verifications run inside :func:`~attnlab.fast.attention.rows_as_steps`, and for a target
prepared by :func:`attnlab.fast.for_decoding` every row is then its step's bit for bit).
The prompt, and the window re-encoded after a slide, go through the target alone, as plain
decoding sends them, before any draft is verified: a prompt's product may round otherwise than a
step's (on a CPU it takes other kernels than a few rows do).
After a round both KV caches are cropped (:meth:`attnlab.attention.cache.KVCache.crop`) to the
accepted tokens; the rejected positions are overwritten by the next round.

How many tokens to draft (``speculate`` = K, the most): a round of k drafts yields
``E(k) = 1 + S₁ + … + S_k`` tokens, S_i the probability that the first i drafts are all accepted
(with independent acceptance α, ``(1 − α^(k+1)) / (1 − α)``), and costs ``1 + k·c + v·β + r``
target steps: r = :data:`ROUND_COST` when k > 0, c the draft's cost per token relative to the
target's (:func:`step_cost`: the bytes of weights each reads plus a fixed cost per block, less
for a compiled step; 0 for prompt lookup), β what each extra verified token adds to a forward
(:data:`VERIFY_COST`), v = k, or the drafts of the padded width when the verification is
compiled (:func:`verify_width`).
With ``adapt=True`` every round takes the k in 0 … K maximising ``E(k) / cost(k)``, S estimated
from the recent rounds: per draft position, the rounds that reached it and the rejections there,
decayed by every round (a plain one too) and shrunk towards the pooled rate (prior α = 0.6
for greedy drafts, 0.3 for sampled ones, which are kept less often; weight 2). Per position, because acceptance is not independent: where the text repeats a round
is accepted whole, elsewhere the first draft fails, and a single α would draft too few in the
one case. Prompt lookup keeps one estimate per n-gram size. k = 0 is a plain step; after 8 of
those a round drafts one token, so the estimate can recover, and while such probes find nothing
to gain they come twice as rarely each time, up to one in 64 rounds; meanwhile the plain rounds
age the estimate towards the prior, so greedy drafting also resumes by itself (at the
sampling prior a round does not pay: sampling resumes through the probes). The choice depends only
on the tokens, not on timings: seeded sampling stays reproducible. ``adapt=False`` drafts K
every round.

With ``compile=True`` both models decode over static caches with compiled steps
(:mod:`attnlab.fast.compiled`): the draft's single-token step, and the target's single-token
step and its verifying forwards. Those are padded (:func:`verify_width`) to 1 + the next power of
two of the k drafts, at most K + 1 tokens (2, 3, 5, 9, 17: five graphs for K = 16), the padding
cropped with the rejected positions: adapting k compiles a handful of graphs, and a short round
does not pay for K + 1 tokens.
``draft_compile`` sets the draft's apart: a small draft's eager step is mostly Python and
kernel launches, which its compiled step removes, while a large target's eager int8 or bf16 step
may be the faster of its two. Greedy drafts of a compiled draft on a CPU run up to
:data:`~attnlab.fast.compiled.DRAFT_CHUNK` steps per compiled call
(:func:`~attnlab.fast.compiled.compiled_greedy_draft`: the argmax fed back inside the graph, no
call or sync per token); sampled drafts keep single steps.

Rows of a batch are decoded one after another (their accepted lengths differ).

Shape legend: V vocab, k drafted tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.decoding.draft_length import (
    PRIOR_GREEDY,
    PRIOR_SAMPLING,
    PROBE_EVERY,
    PROBE_MAX,
    ROUND_COST,
    VERIFY_COST,
    Acceptance,
    best_k,
    expected_tokens,
    step_cost,
    verify_width,
)
from attnlab.decoding.lookup import NgramIndex
from attnlab.decoding.probs import next_token_probs
from attnlab.decoding.stream import RowStream
from attnlab.errors import UserError
from attnlab.fast.attention import rows_as_steps
from attnlab.layers import evaluating

__all__ = [
    "SpeculativeStats",
    "acceptance_probs",
    "residual_probs",
    "expected_tokens",
    "best_k",
    "step_cost",
    "verify_width",
    "ROUND_COST",
    "check_draft",
    "check_tokenizers",
    "speculative_stream",
    "VERIFY_COST",
]


@dataclass
class SpeculativeStats:
    """What speculative decoding did (pass one as ``stats=`` to fill it in).

    Attributes:
        rounds: target forwards (one per round).
        drafted: tokens proposed, over all rounds.
        accepted: proposed tokens accepted.
        tokens: tokens emitted.
        k_used: how many rounds drafted k tokens, per k.
    """

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    k_used: Counter = field(default_factory=Counter)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed tokens (0 when nothing was proposed)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Accepted tokens per round that drafted (0 when none did)."""
        drafting = sum(n for k, n in self.k_used.items() if k > 0)
        return self.accepted / drafting if drafting else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens emitted per target forward."""
        return self.tokens / self.rounds if self.rounds else 0.0


# ----------------------------------------------------------------------------------------------
# the rule of the papers (pure functions: the exactness test enumerates with them)


def acceptance_probs(p: Tensor, q: Tensor, drafts: Tensor) -> Tensor:
    """``min(1, pᵢ(xᵢ) / qᵢ(xᵢ))``: the probability of accepting each drafted token.

    Args:
        p: ``(k, V)`` the target's processed distributions at the drafted positions.
        q: ``(k, V)`` the distributions the drafts were sampled from (one-hot for lookup).
        drafts: ``(k,)`` the drafted tokens (``q`` gives each a positive probability).

    Returns:
        ``(k,)``.
    """
    rows = torch.arange(drafts.shape[0], device=p.device)
    pd, qd = p[rows, drafts], q[rows, drafts]
    return (pd / qd.clamp(min=torch.finfo(qd.dtype).tiny)).clamp(max=1.0)


def residual_probs(p: Tensor, q: Tensor) -> Tensor:
    """``norm(max(0, p − q))``: where the token comes from after a rejection ``(V,)``.

    A rejection implies ``p(x) < q(x)`` for the drafted x, so the residual has mass; should
    rounding leave none, ``p`` itself is returned."""
    r = (p - q).clamp(min=0.0)
    total = r.sum()
    return r / total if float(total) > 0 else p


# ----------------------------------------------------------------------------------------------
# checks


def check_draft(model: nn.Module, draft: nn.Module) -> None:
    """Refuse a draft that cannot speak for ``model``: both must be KV-cache Transformer LMs
    (:class:`~attnlab.DecoderLM`) with the same vocabulary size.

    Raises:
        UserError: naming what differs.
    """
    for name, m in (("the model", model), ("the draft", draft)):
        if not (callable(getattr(m, "make_caches", None)) and hasattr(m, "tok_emb")):
            raise UserError(
                f"speculative decoding needs Transformer LMs with a KV cache; {name} is a "
                f"{type(m).__name__}"
            )
    vt, vd = model.config.vocab_size, draft.config.vocab_size
    if vt != vd:
        raise UserError(
            f"the draft's vocabulary has {vd} tokens but the model's has {vt}: a draft must use "
            "the model's tokenizer"
        )


def check_tokenizers(target_tokenizer, draft_tokenizer) -> None:
    """Refuse a draft whose tokenizer is not the model's (its saved form differs).

    Raises:
        UserError: the tokenizers differ (type, vocabulary size, or their tokens).
    """
    ta, tb = target_tokenizer, draft_tokenizer
    if ta is None or tb is None:
        return
    if type(ta) is not type(tb) or ta.vocab_size != tb.vocab_size:
        raise UserError(
            f"the draft's tokenizer ({type(tb).__name__}, {tb.vocab_size} tokens) is not the "
            f"model's ({type(ta).__name__}, {ta.vocab_size} tokens); train the draft on the "
            "model's tokenizer"
        )
    if ta.to_json() != tb.to_json():
        raise UserError(
            f"the draft's tokenizer has the model's size ({ta.vocab_size} tokens) but other "
            "tokens (their tokenizer.json files differ): the same id would mean different text; "
            "train the draft on the model's tokenizer"
        )


# ----------------------------------------------------------------------------------------------
# decoding


class _Row:
    """Speculative decoding of one row (a prompt without padding)."""

    def __init__(
        self,
        model: nn.Module,
        prompt: list[int],
        max_new_tokens: int,
        *,
        draft: nn.Module | None,
        k_max: int,
        adapt: bool,
        ngram: int,
        sampling: dict,
        generator: torch.Generator | None,
        compile: bool,
        draft_compile: bool,
        stats: SpeculativeStats,
    ) -> None:
        self.tokens = list(prompt)
        self.remaining = max_new_tokens
        self.k_max, self.adapt, self.sampling = k_max, adapt, sampling
        self.greedy = sampling["temperature"] == 0
        self.generator, self.stats = generator, stats
        widths = {verify_width(n, k_max) for n in range(1, k_max + 2)}
        self.target = RowStream(model, compile=compile, compiled_widths=widths)
        self.draft = (
            None if draft is None else RowStream(draft, compile=draft_compile, compiled_widths={1})
        )
        # greedy drafts from a compiled draft on a CPU: several steps per compiled call
        self.chained_drafts = (
            self.draft is not None
            and draft_compile
            and self.greedy
            and self.draft.device.type == "cpu"
        )
        self.index = NgramIndex(ngram, prompt) if draft is None else None
        self.draft_cost = (
            0.0
            if draft is None
            else step_cost(draft, compiled=draft_compile, chained=self.chained_drafts)
            / step_cost(model, compiled=compile)
        )
        self.acceptance = Acceptance(PRIOR_GREEDY if self.greedy else PRIOR_SAMPLING)
        self.rounds_without, self.probe_gap = 0, PROBE_EVERY

    # -- windows --------------------------------------------------------------------------------

    def _target_window(self) -> int:
        """Slide the target's window as plain decoding does; the most tokens it may verify."""
        t, L = self.target, len(self.tokens)
        ctx = t.ctx
        if t.state is None or L - t.start > ctx:
            start = 0 if t.state is None else L - (ctx - ctx // 4)
            t.open(start, L - start + self.remaining + self.k_max + 1)
        # every position verified is predicted from the same window [start, m), m - start <= ctx
        return max(0, min(ctx + t.start - L, t.room - (L - t.cached)))

    def _draft_window(self, k: int) -> int:
        d, L = self.draft, len(self.tokens)
        ctx = d.ctx
        if d.state is None or L + k - 1 - d.start > ctx:
            start = 0 if d.state is None and L + k - 1 <= ctx else L + k - 1 - (ctx - ctx // 4)
            start = min(max(start, 0), L - 1)
            d.open(start, L - start + self.remaining + self.k_max + 1)
        return max(0, min(k, ctx + d.start - L + 1, d.room - (L - d.cached) + 1))

    # -- one round ------------------------------------------------------------------------------

    def _choose_k(self, key: int) -> int:
        if not self.adapt:
            return self.k_max
        k = best_k(
            self.acceptance.survival(key, self.k_max),
            self.k_max,
            self.draft_cost,
            padded=self.target.compile,
        )
        if k > 0:
            self.rounds_without, self.probe_gap = 0, PROBE_EVERY
            return k
        self.rounds_without += 1
        if self.rounds_without >= self.probe_gap:
            # a probe of one draft; while probes find nothing to gain they grow rarer
            self.rounds_without, self.probe_gap = 0, min(2 * self.probe_gap, PROBE_MAX)
            k = 1
        return k

    def _pick(self, logits: Tensor) -> tuple[int, Tensor | None]:
        """A token from one position's logits, with the distribution it came from."""
        if self.greedy:
            return int(logits.float().argmax()), None
        q = next_token_probs(logits, **self.sampling)
        return int(torch.multinomial(q, 1, generator=self.generator)), q

    def step(self) -> list[int]:
        """One round: the tokens it emits (1 … k + 1, at most the tokens still wanted)."""
        L = len(self.tokens)
        limit = min(self._target_window(), self.remaining - 1)
        if L - self.target.cached > 1:
            return self._prefill()
        key = 0
        qs: list[Tensor] | None = None
        if self.draft is not None:
            k = min(self._choose_k(0), limit)
            k = self._draft_window(k) if k > 0 else 0
            drafts: list[int] = []
            qs = []
            if k > 0 and self.chained_drafts:
                drafts = self.draft.greedy_drafts(self.tokens[self.draft.cached : L], k)
                qs = [None] * k
            elif k > 0:
                d = self.draft
                logits = d.feed(self.tokens[d.cached : L])[-1]
                for i in range(k):
                    tok, q = self._pick(logits)
                    drafts.append(tok)
                    qs.append(q)
                    if i < k - 1:
                        logits = d.feed([tok])[-1]
        else:
            proposal, key = self.index.propose(self.k_max)
            k = min(self._choose_k(key), limit) if proposal else 0
            drafts = proposal[:k]
            k = len(drafts)
        t = self.target
        fed = self.tokens[t.cached : L] + drafts
        pad = 0
        if t.compile and k > 0:
            # a handful of compiled graphs for every number of drafts (the padding is cropped)
            pad = verify_width(len(fed), self.k_max) - len(fed)
            if pad > t.room - len(fed):
                pad = 0
        # greedy: every row as the one-token step at its position computes it (eager decoding
        # over a growing cache would otherwise attend over the whole window: attnlab.fast)
        with rows_as_steps() if self.greedy else nullcontext():
            logits = t.feed(fed + [fed[-1]] * pad, keep=k + 1 + pad)[: k + 1]  # (k + 1, V)
        n, last = self._verify(logits, drafts, qs)
        new = drafts[:n] + [last]
        # roll back: the target keeps the prefix and the accepted drafts (the new last token is
        # fed next round); the draft keeps what it has of them
        t.crop(L + n)
        if self.draft is not None and self.draft.state is not None and k > 0:
            self.draft.crop(min(L + n, self.draft.cached))
        self._record(key, k, n)
        self.tokens += new
        if self.index is not None:
            self.index.extend(new)
        self.remaining -= len(new)
        return new

    def _prefill(self) -> list[int]:
        """A round without drafts over the window's uncached tokens (the prompt, or the window
        after a slide): the same forward as plain decoding's, so the tokens that follow are
        computed from the same cache. Verifying drafts in that forward instead would give the
        drafts' positions a prompt's product (on a CPU, more rows than the few-row kernels
        take), whose rounding can differ from a one-token step's."""
        t, L = self.target, len(self.tokens)
        logits = t.feed(self.tokens[t.cached : L], keep=1)  # (1, V)
        _, last = self._verify(logits, [], None)
        self._record(0, 0, 0)
        self.tokens.append(last)
        if self.index is not None:
            self.index.extend([last])
        self.remaining -= 1
        return [last]

    def _verify(
        self, logits: Tensor, drafts: list[int], qs: list[Tensor | None] | None
    ) -> tuple[int, int]:
        """How many drafts are accepted, and the token after them."""
        k = len(drafts)
        if self.greedy:
            best = logits.float().argmax(dim=-1).tolist()  # (k + 1,)
            n = 0
            while n < k and drafts[n] == best[n]:
                n += 1
            return n, best[n]
        p = next_token_probs(logits, **self.sampling)  # (k + 1, V)
        if k == 0:
            return 0, int(torch.multinomial(p[0], 1, generator=self.generator))
        d = torch.tensor(drafts, device=p.device)
        if qs is None:  # prompt lookup: the proposal is a point mass
            q = torch.nn.functional.one_hot(d, p.shape[-1]).to(p.dtype)
        else:
            q = torch.stack(qs)  # (k, V)
        a = acceptance_probs(p[:k], q, d)
        u = torch.rand(k, generator=self.generator, device=p.device)
        rejected = (u >= a).tolist()
        n = rejected.index(True) if True in rejected else k
        dist = residual_probs(p[n], q[n]) if n < k else p[k]
        return n, int(torch.multinomial(dist, 1, generator=self.generator))

    def _record(self, key: int, k: int, n: int) -> None:
        s = self.stats
        s.rounds += 1
        s.drafted += k
        s.accepted += n
        s.tokens += n + 1
        s.k_used[k] += 1
        self.acceptance.update(key, k, n)  # a plain round (k = 0) ages the estimate


@torch.no_grad()
def speculative_stream(
    model: nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    draft: nn.Module | None = None,
    speculate: int = 5,
    adapt: bool = True,
    prompt_lookup: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_ids: Sequence[int] = (),
    generator: torch.Generator | None = None,
    compile: bool = False,
    draft_compile: bool | None = None,
    stats: SpeculativeStats | None = None,
) -> Iterator[Tensor]:
    """Yield the next token of every row ``(B,)`` (see :func:`attnlab.decoding.generate`'s
    ``draft``, ``speculate`` and ``prompt_lookup``).

    Args:
        model: the target :class:`~attnlab.DecoderLM`.
        prompts: one list of token ids per row (padding removed).
        draft: the draft LM (None: prompt lookup).
        speculate: K, the most tokens drafted per round.
        adapt: choose k ≤ K each round from the acceptance rate (module docstring).
        prompt_lookup: the longest n-gram matched (with ``draft`` None).
        stop_ids: ids that end a row (later columns repeat the first).
        compile: both models over static caches with compiled steps.
        draft_compile: the draft's steps compiled or not apart from the model's (None: as
            ``compile``).
        stats: filled with what happened (:class:`SpeculativeStats`).

    Raises:
        UserError: bad settings, an incompatible draft.
    """
    if draft is None and prompt_lookup is None:
        raise UserError("speculative decoding needs a draft model or prompt_lookup=N")
    if draft is not None and prompt_lookup is not None:
        raise UserError("give a draft model or prompt lookup, not both")
    if speculate < 1:
        raise UserError(f"speculate (tokens drafted per round) must be >= 1, got {speculate}")
    if prompt_lookup is not None and prompt_lookup < 1:
        raise UserError(f"prompt lookup's n-gram size must be >= 1, got {prompt_lookup}")
    check_draft(model, draft if draft is not None else model)
    stats = SpeculativeStats() if stats is None else stats
    draft_compile = compile if draft_compile is None else draft_compile
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    stops = set(stop_ids)
    with evaluating(model), evaluating(draft if draft is not None else model):
        if len(prompts) == 1:
            yield from _one_row(
                model,
                prompts[0],
                max_new_tokens,
                draft,
                speculate,
                adapt,
                prompt_lookup,
                sampling,
                generator,
                compile,
                draft_compile,
                stats,
                stops,
            )
            return
        rows = [
            list(_one_row(model, p, max_new_tokens, draft, speculate, adapt, prompt_lookup,
                          sampling, generator, compile, draft_compile, stats, stops))
            for p in prompts
        ]  # fmt: skip
    width = max(len(r) for r in rows)
    device = model.tok_emb.weight.device
    fill = next(iter(stop_ids), 0)
    for j in range(width):
        yield torch.stack(
            [r[j] if j < len(r) else torch.tensor([fill], device=device) for r in rows]
        ).view(-1)


def _one_row(
    model, prompt, max_new_tokens, draft, speculate, adapt, ngram, sampling, generator,
    compile, draft_compile, stats, stops,
) -> Iterator[Tensor]:  # fmt: skip
    row = _Row(
        model,
        prompt,
        max_new_tokens,
        draft=draft,
        k_max=speculate,
        adapt=adapt,
        ngram=ngram or 1,
        sampling=sampling,
        generator=generator,
        compile=compile,
        draft_compile=draft_compile,
        stats=stats,
    )
    device = model.tok_emb.weight.device
    while row.remaining > 0:
        for tok in row.step():
            yield torch.tensor([tok], device=device)
            if tok in stops:
                return

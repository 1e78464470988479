"""How many tokens to draft per round of speculative decoding (:mod:`attnlab.decoding.speculative`).

A round of k drafts yields ``E(k) = 1 + S₁ + … + S_k`` tokens (S_i: the probability that the first
i drafts are all accepted) and costs ``1 + k·c + v·β + r`` single-token target steps (see
:func:`best_k`); :class:`Acceptance` estimates S from the recent rounds, per draft position, and
:func:`step_cost` gives c from the bytes of weights each model reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

__all__ = [
    "Acceptance",
    "best_k",
    "expected_tokens",
    "verify_width",
    "step_cost",
    "LAYER_OVERHEAD_BYTES",
    "COMPILED_LAYER_OVERHEAD_BYTES",
    "CHAINED_LAYER_OVERHEAD_BYTES",
    "PRIOR_GREEDY",
    "PRIOR_SAMPLING",
    "PROBE_EVERY",
    "PROBE_MAX",
    "ROUND_COST",
    "VERIFY_COST",
]

#: what each extra token of a verifying forward costs, in single-token target steps (β). A
#: forward reads the weights once however many tokens it carries, but on a CPU without bf16/int8
#: matrix instructions the products of a few rows cost more than the one-row kernel's. Fitted
#: (a line through round time against K) to benchmarks/speculative.py's fixed-K rows, K = 6, 10,
#: 16, int8 target eager and compiled, on an AVX-512 CPU: β ~ 0.15 (near 0 on a GPU). With the
#: few-row kernels, compiled on an AVX2 CPU, β ~ 0.11; 0.15 is kept, the two choosing alike in
#: a replay of benchmarks/speculative.py's greedy text (docs/performance.md, section 4)
VERIFY_COST = 0.15
#: a drafting round's fixed cost (the draft's catch-up, bookkeeping, the verifying forward's
#: extra work), in target steps: a round drafts only where it is predicted to gain more than
#: this. Refitted after verifications took the one-query attention and the few-row kernels
#: (compiled int8 target on an AVX2 CPU: a forward of w tokens costs about 1 + 0.1 + 0.11·(w − 1)
#: steps); the earlier fit, 0.5, made a round of four drafts at α = 0.8 look barely worth it
ROUND_COST = 0.2
#: with adaptive k: a round that would draft nothing drafts one token every PROBE_EVERY rounds
PROBE_EVERY = 8
#: ... and after each probe that found nothing to gain, twice as many rounds, up to PROBE_MAX
PROBE_MAX = 64
_DECAY = 0.9  # weight of the past in the acceptance estimate, per round
#: the prior acceptance rate of greedy drafts (a draft kept when it is the target's argmax)
PRIOR_GREEDY = 0.6
#: ... and of sampled ones, kept with probability min(1, p/q): Σ min(p, q) per token on average,
#: below the argmax agreement (the benchmark's pair: 91-99 % greedy, 12-37 % sampled at 0.8).
#: Plain rounds age the estimate towards the prior, so with 0.6 a sampling row that loses by
#: drafting drafted again about every eighth round
PRIOR_SAMPLING = 0.3
_PRIOR_WEIGHT = 2.0  # the prior's pseudo-rounds
_SHRINK = 2.0  # pseudo-rounds at the pooled rate in each position's rejection rate


def expected_tokens(alpha: float | Sequence[float], k: int) -> float:
    """Tokens a round of ``k`` drafts yields.

    Args:
        alpha: α, each draft accepted independently with that probability:
            ``1 + α + … + α^k = (1 − α^(k+1)) / (1 − α)``; or the survival ``S`` with ``S[i − 1]``
            the probability that the first i drafts are all accepted: ``1 + S₁ + … + S_k``.
    """
    if isinstance(alpha, (int, float)):
        return float(sum(alpha**i for i in range(k + 1)))
    return 1.0 + float(sum(alpha[:k]))


def verify_width(n: int, k_max: int) -> int:
    """The tokens a compiled verification of ``n`` fed tokens (the last emitted token and n − 1
    drafts) carries: padded to 1 + the next power of two of the drafts, at most K + 1
    (2, 3, 5, 9, 17, ..., K + 1), so that adapting k uses a handful of compiled graphs; ``n``
    itself for a single step and above K + 1 (an eager forward)."""
    if n <= 1 or n > k_max + 1:
        return n
    drafts = 1
    while drafts < n - 1:
        drafts *= 2
    return 1 + min(drafts, k_max)


def best_k(
    alpha: float | Sequence[float],
    k_max: int,
    draft_cost: float,
    verify_cost: float = VERIFY_COST,
    round_cost: float = ROUND_COST,
    *,
    padded: bool = False,
) -> int:
    """The k in 0 … ``k_max`` maximising tokens per unit of time,
    ``expected_tokens(alpha, k) / (1 + k·draft_cost + v·verify_cost + round_cost·[k > 0])``
    with v = k verified drafts, or, when ``padded`` (a compiled verification), the drafts of
    its padded width ``verify_width(k + 1, k_max) − 1``."""

    def cost(k: int) -> float:
        verified = verify_width(k + 1, k_max) - 1 if padded and k > 0 else k
        return 1.0 + k * draft_cost + verified * verify_cost + round_cost * (k > 0)

    rates = [expected_tokens(alpha, k) / cost(k) for k in range(k_max + 1)]
    return max(range(k_max + 1), key=lambda k: (rates[k], -k))


#: the fixed cost per step of a block (and of the embedding and head together): Python and
#: kernel launches, in bytes of weights read in the same time (eager, ~0.2 ms on a CPU reading
#: ~12 GB/s; fitted so that a 1 x 128 draft of a 4 x 512 bf16 target costs the measured 15 %)
LAYER_OVERHEAD_BYTES = 2_500_000
#: ... for a compiled single-token step (one graph, no Python per layer, but a call, Dynamo's
#: checks and a device sync per token): a compiled 1 x 128 int8 draft step takes 0.15 ms, 0.10
#: of a compiled 4 x 512 int8 target's step (2-core AVX-512 EPYC, 2026-12-07), which this gives
#: (0.095). Until then it was 200_000, fitted to the same ratio for an fp32 draft (0.08-0.12)
#: but giving an int8 one 0.05: sampled drafts, taken one step at a time, looked cheaper than
#: they were
COMPILED_LAYER_OVERHEAD_BYTES = 600_000
#: ... for greedy steps chained in one compiled graph (:func:`attnlab.fast.compiled_greedy_draft`:
#: no call or sync per token): the same int8 draft 0.053 ms a token, 0.037 of the target's step;
#: this gives 0.045
CHAINED_LAYER_OVERHEAD_BYTES = 200_000


def step_cost(model: nn.Module, *, compiled: bool = False, chained: bool = False) -> float:
    """A model's cost per decoding step, in bytes: the weights it reads plus a fixed cost per
    block and once for the embedding and head (what makes a small draft dearer than its size):
    :data:`LAYER_OVERHEAD_BYTES` for an eager step, :data:`COMPILED_LAYER_OVERHEAD_BYTES` for a
    ``compiled`` one, :data:`CHAINED_LAYER_OVERHEAD_BYTES` for compiled greedy steps
    ``chained`` in one graph."""
    seen = {id(p): p for p in model.parameters()}
    seen.update({id(b): b for name, b in model.named_buffers() if "weight" in name})
    weights = sum(t.numel() * t.element_size() for t in seen.values())
    if chained:
        overhead = CHAINED_LAYER_OVERHEAD_BYTES
    else:
        overhead = COMPILED_LAYER_OVERHEAD_BYTES if compiled else LAYER_OVERHEAD_BYTES
    return float(weights + overhead * (len(getattr(model, "blocks", ())) + 1))


class Acceptance:
    """The decayed acceptance counts per draft position (one set per key: the n-gram size for
    prompt lookup), and the survival they give.

    Acceptance is not independent from one draft to the next: where the text repeats itself
    a round is accepted whole, elsewhere the first draft fails. So each position i keeps how
    many rounds reached it and how many were rejected there; its rejection rate is shrunk
    towards the pooled one (``_SHRINK`` pseudo-rounds; the pool starts from the prior α of
    weight 2: ``prior``, :data:`PRIOR_GREEDY` or :data:`PRIOR_SAMPLING`), so that positions
    never drafted yet take the pooled rate."""

    def __init__(self, prior: float = PRIOR_GREEDY) -> None:
        if not 0.0 < prior < 1.0:
            raise ValueError(f"the prior acceptance rate must be in (0, 1), got {prior}")
        self.prior_rejected = _PRIOR_WEIGHT * (1.0 - prior)  # pseudo-rejections
        self.reached: dict[int, list[float]] = {}
        self.rejected: dict[int, list[float]] = {}

    def alpha(self, key: int = 0) -> float:
        """The pooled per-draft acceptance rate."""
        reached, rejected = sum(self.reached.get(key, ())), sum(self.rejected.get(key, ()))
        return 1.0 - (rejected + self.prior_rejected) / (reached + _PRIOR_WEIGHT)

    def survival(self, key: int, k_max: int) -> list[float]:
        """``S[i − 1]``: the estimated probability that drafts 1 … i are all accepted."""
        reached, rejected = self.reached.get(key, []), self.rejected.get(key, [])
        pooled = 1.0 - self.alpha(key)
        out, s = [], 1.0
        for i in range(k_max):
            n = reached[i] if i < len(reached) else 0.0
            r = rejected[i] if i < len(rejected) else 0.0
            s *= 1.0 - (r + _SHRINK * pooled) / (n + _SHRINK)
            out.append(s)
        return out

    def update(self, key: int, drafted: int, accepted: int) -> None:
        """A round drafted ``drafted`` tokens and the first ``accepted`` were kept. Every round
        ages the counts, a plain one (``drafted`` = 0) too: an estimate that stopped drafting
        relaxes towards the prior, so drafting resumes where the text may have changed."""
        reached = self.reached.setdefault(key, [])
        rejected = self.rejected.setdefault(key, [])
        grow = drafted - len(reached)
        if grow > 0:
            reached += [0.0] * grow
            rejected += [0.0] * grow
        for i in range(len(reached)):
            reached[i] *= _DECAY
            rejected[i] *= _DECAY
        for i in range(min(accepted + 1, drafted)):
            reached[i] += 1.0
        if accepted < drafted:
            rejected[accepted] += 1.0

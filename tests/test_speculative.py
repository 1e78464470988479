"""Speculative decoding and prompt lookup (attnlab.decoding.speculative, .lookup): greedy output
equals plain greedy decoding for every position scheme and GQA; sampled output has exactly the
target's distribution (exhaustive enumeration of the procedure on a tiny vocabulary, and a
chi-square test of seeded samples); cache rollback equals recomputation; a draft with another
tokenizer or vocabulary is refused."""

import contextlib
import copy
import itertools
import json

import pytest
import torch
from scipy.stats import chi2

import attnlab.decoding.draft_length as draft_length
import attnlab.decoding.speculative as speculative_mod
import attnlab.decoding.stream as stream_mod
import attnlab.fast.compiled as compiled_mod
from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.data.tokenizers import CharTokenizer
from attnlab.decoding import generate
from attnlab.decoding.lookup import NgramIndex
from attnlab.decoding.sampling import next_token_probs
from attnlab.decoding.speculative import (
    SpeculativeStats,
    acceptance_probs,
    best_k,
    check_draft,
    check_tokenizers,
    expected_tokens,
    residual_probs,
    verify_width,
)
from attnlab.errors import UserError
from attnlab.fast import for_decoding
from attnlab.fast.quant import quantize_int8
from attnlab.models.lm import DecoderLM
from attnlab.runs import save_model

POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "t5", "none"]


def _lm(vocab=13, d=32, layers=2, heads=4, ctx=40, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads, max_seq_len=ctx)
    return DecoderLM(ModelConfig.from_dict({**cfg, **kw})).eval()


@pytest.fixture
def eager_static(monkeypatch):
    """``compile=True`` over static caches, with the step run eagerly (no cold compile)."""

    def eager(model, *, mode="auto"):
        return lambda idx, **kwargs: model(idx, **kwargs)

    monkeypatch.setattr(compiled_mod, "compiled_forward", eager)
    monkeypatch.setattr(compiled_mod, "_compile_step", lambda fn: fn)  # the chained drafts


# ----------------------------------------------------------------------------------------------
# greedy: the tokens of plain greedy decoding


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_greedy_speculation_equals_plain_greedy(position, kv_heads):
    # 60 new tokens in a context of 40: the window slides (re-encoding both caches) on the way
    target = _lm(position=position, n_kv_heads=kv_heads)
    draft = _lm(d=16, layers=1, heads=2, seed=1, position=position, ctx=24)
    idx = torch.randint(0, 13, (1, 6), generator=torch.Generator().manual_seed(2))
    plain = generate(target, idx, 60, temperature=0)
    stats = SpeculativeStats()
    for kw in (
        dict(draft=draft, speculate=3, adapt=False, stats=stats),
        dict(draft=draft, speculate=4),
        dict(draft=target, speculate=5, adapt=False),
        dict(prompt_lookup=2, speculate=4),
    ):
        assert torch.equal(generate(target, idx, 60, temperature=0, **kw), plain), kw
    assert stats.drafted > 0 and stats.tokens == 60 and stats.rounds < 60


def test_greedy_speculation_over_static_caches_and_other_dtypes(eager_static, monkeypatch):
    target = _lm(position="rope", n_kv_heads=2)
    draft = _lm(d=16, layers=1, heads=2, seed=1, position="rope")
    idx = torch.tensor([[1, 2, 3, 1, 2, 3, 1]])
    plain = generate(target, idx, 30, temperature=0)
    for kw in (dict(draft=draft, speculate=3), dict(prompt_lookup=3, speculate=4)):
        assert torch.equal(generate(target, idx, 30, temperature=0, compile=True, **kw), plain)
    # the draft compiled apart from the target (draft_compile), either way round
    static_for = []
    real_start = stream_mod.start_static

    def spy(model, *args, **kwargs):
        static_for.append(model)
        return real_start(model, *args, **kwargs)

    monkeypatch.setattr(stream_mod, "start_static", spy)
    for compile, draft_compile in ((False, True), (True, False)):
        static_for.clear()
        kw = dict(draft=draft, speculate=3, compile=compile, draft_compile=draft_compile)
        assert torch.equal(generate(target, idx, 30, temperature=0, **kw), plain)
        assert {id(m) for m in static_for} == {id(draft if draft_compile else target)}
    # a bf16 draft for an fp32 target: other proposals, the target's tokens all the same
    out = generate(target, idx, 30, temperature=0, draft=draft.to(torch.bfloat16), speculate=3)
    assert torch.equal(out, plain)


def test_chained_greedy_drafts_are_the_steps_greedy_tokens(monkeypatch):
    """compiled_greedy_draft (inductor, no mocking): k greedy tokens in chunks of at most
    DRAFT_CHUNK compiled steps are the tokens of k single decoding steps, and the caches end
    as after those steps (the cursors k further on, the same keys and values)."""
    monkeypatch.setattr(compiled_mod, "DRAFT_CHUNK", 2)  # 3 = 2 + 1: two graphs, a chain
    draft = _lm(d=16, layers=1, heads=2, seed=1, position="rope", init_std=1.0)  # no loop
    prompt = torch.tensor([[9, 2, 6, 5, 3]])  # then 1, 4, 7: no token repeats
    with torch.no_grad():
        ref = draft.start_decoding(1, 16, static=True)
        logits, _ = draft.decode_step(prompt, ref)
        steps = []
        for _ in range(3):
            steps.append(int(logits.argmax()))
            logits, _ = draft.decode_step(torch.tensor([[steps[-1]]]), ref)
        state = draft.start_decoding(1, 16, static=True)
        draft.decode_step(prompt[:, :-1], state)
        chained = compiled_mod.compiled_greedy_draft(draft)(prompt[:, -1:], state.caches, 3)
    assert chained.tolist() == [steps] and len(set(steps)) == 3
    for a, b in zip(state.caches, ref.caches):
        # the reference also fed its third token: compare the slots both wrote
        assert int(a.cursor) == 5 - 1 + 3 == int(b.cursor) - 1
        torch.testing.assert_close(a.k[..., :7, :], b.k[..., :7, :])
        torch.testing.assert_close(a.v[..., :7, :], b.v[..., :7, :])


def test_greedy_drafts_of_a_compiled_draft_are_chained(eager_static, monkeypatch):
    """Greedy speculation with a compiled draft on a CPU drafts through compiled_greedy_draft
    (several steps per call) and proposes what the draft's single steps propose: the same
    acceptance, round by round; sampling keeps the single steps (its drafts are sampled)."""
    target = _lm(position="rope", n_kv_heads=2, init_std=1.0)  # greedy text that does not loop
    draft = copy.deepcopy(target)  # a near copy: some drafts accepted, some not
    with torch.no_grad():
        g = torch.Generator().manual_seed(5)
        for w in draft.parameters():
            w.add_(0.03 * torch.randn(w.shape, generator=g))
    idx = torch.tensor([[1, 2, 3, 1, 2, 3, 1]])
    chained: list[int] = []
    real = stream_mod.compiled_greedy_draft

    def spy(model):
        steps = real(model)

        def counted(x, caches, k):
            chained.append(k)
            return steps(x, caches, k)

        return counted

    monkeypatch.setattr(stream_mod, "compiled_greedy_draft", spy)
    plain = generate(target, idx, 40, temperature=0)
    stats = {}
    for draft_compile in (True, False):
        stats[draft_compile] = SpeculativeStats()
        out = generate(target, idx, 40, temperature=0, draft=draft, speculate=4, adapt=False,
                       compile=True, draft_compile=draft_compile, stats=stats[draft_compile])  # fmt: skip
        assert torch.equal(out, plain)
    assert sum(chained) == stats[True].drafted
    assert 0 < stats[True].accepted < stats[True].drafted and len(stats[True].k_used) > 2
    assert stats[True] == stats[False]
    chained.clear()
    generate(target, idx, 20, temperature=0.8, draft=draft, speculate=4, compile=True,
             generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert chained == []


def test_prompts_and_window_slides_are_plain_decodings_forwards(monkeypatch):
    """Every target forward over more tokens than a verification (the prompt, the window
    re-encoded after a slide) is one plain greedy decoding makes, with the same tokens: the
    drafts are never verified in it (a prompt's product may round otherwise than a step's on a
    CPU: more rows than the few-row kernels take)."""
    target = _lm(position="rope")  # a context of 40: 50 new tokens slide the window
    draft = _lm(d=16, layers=1, heads=2, seed=1)
    idx = torch.tensor([[1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 1, 2]])
    seen: list[tuple[int, ...]] = []
    forward = DecoderLM.forward

    def recording(self, x, *args, **kwargs):
        if self is target:
            seen.append(tuple(x[0].tolist()))
        return forward(self, x, *args, **kwargs)

    monkeypatch.setattr(DecoderLM, "forward", recording)
    plain = generate(target, idx, 50, temperature=0)
    long_plain = {t for t in seen if len(t) > 1}
    assert len(long_plain) >= 2  # the prompt and at least one slide
    for kw in (dict(draft=draft, speculate=4), dict(prompt_lookup=2, speculate=4)):
        seen.clear()
        assert torch.equal(generate(target, idx, 50, temperature=0, **kw), plain)
        assert seen[0] == tuple(idx[0].tolist())  # the prompt alone
        long_spec = {t for t in seen if len(t) > 4 + 1}
        assert long_spec and long_spec <= long_plain, kw


def test_compiled_verifications_take_a_handful_of_widths(monkeypatch):
    """Over static caches every verifying forward is padded to a width of verify_width (2, 3, 5,
    7 for K = 6), the tokens still plain greedy decoding's."""
    widths = []

    def recording(model, *, mode="auto"):
        def step(idx, **kwargs):
            widths.append(idx.shape[1])
            return model(idx, **kwargs)

        return step

    monkeypatch.setattr(compiled_mod, "compiled_forward", recording)
    target = _lm(position="rope")
    idx = torch.tensor([[1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 1, 2]])
    plain = generate(target, idx, 20, temperature=0)
    stats = SpeculativeStats()
    out = generate(target, idx, 20, temperature=0, compile=True, prompt_lookup=2, speculate=6,
                   stats=stats)  # fmt: skip
    assert torch.equal(out, plain)
    # every round but the first (the prompt's prefill alone, as plain decoding's: eager) is one
    # compiled forward (12 + 20 tokens and K + 1 of room fit the context of 40: the window
    # never slides)
    assert stats.rounds < 20 and len(widths) == stats.rounds - 1
    assert stats.k_used[0] >= 1  # the prefill: a round without drafts
    assert set(widths) <= {1, 2, 3, 5, 7}, widths
    # adapting k used widths below K + 1 (a round of a few drafts does not pay for K + 1)
    assert {w for w in widths if 1 < w < 7}, widths


def test_batches_stops_and_padding_follow_plain_decoding():
    target = _lm(position="learned")
    draft = _lm(d=16, layers=1, heads=2, seed=1)
    idx = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
    mask = torch.tensor([[False, False, True, True], [True, True, True, True]])
    plain = generate(target, idx, 12, temperature=0, attention_mask=mask)
    spec = generate(target, idx, 12, temperature=0, attention_mask=mask, draft=draft)
    assert torch.equal(spec, plain)
    stop = int(plain[1, 7])  # a token row 1 generates
    plain = generate(target, idx, 12, temperature=0, attention_mask=mask, stop=stop)
    spec = generate(target, idx, 12, temperature=0, attention_mask=mask, stop=stop, draft=draft)
    assert torch.equal(spec, plain)


# ----------------------------------------------------------------------------------------------
# sampling: exactly the target's distribution

SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=2), dict(temperature=1.3, top_p=0.7)]


def test_greedy_verifications_ask_for_rows_as_steps_and_sampling_ones_do_not(monkeypatch):
    """Greedy speculation verifies inside attnlab.fast.attention.rows_as_steps (each row
    attends as its one-token step did, tests/test_fast_paths.py); sampling, which needs no
    bit-for-bit rows, keeps the whole-window attention. Both give the plain results."""
    target = for_decoding(_lm(position="rope", n_kv_heads=2).to(torch.bfloat16))
    draft = _lm(d=16, layers=1, heads=2, seed=1, position="rope")
    idx = torch.tensor([[1, 2, 3, 1, 2, 3, 1]])
    entered = []
    real = speculative_mod.rows_as_steps

    @contextlib.contextmanager
    def spy():
        entered.append(1)
        with real():
            yield

    monkeypatch.setattr(speculative_mod, "rows_as_steps", spy)
    plain = generate(target, idx, 20, temperature=0)
    assert torch.equal(generate(target, idx, 20, temperature=0, draft=draft, speculate=3), plain)
    greedy_rounds = len(entered)
    assert greedy_rounds > 0
    generate(target, idx, 20, temperature=0.8, draft=draft, speculate=3,
             generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert len(entered) == greedy_rounds


def _probs(model, ctx, settings):
    logits = model(torch.tensor([ctx]), logits_to_keep=1)[0, -1].double()
    return next_token_probs(logits, **settings).double()


def _round(target, ctx, k, settings, draft):
    """Every outcome of one round of the procedure from ``ctx`` with ``k`` drafts:
    ``{emitted tokens: probability}``, enumerating the drafts and the acceptances."""
    V = target.config.vocab_size
    outcomes: dict[tuple, float] = {}
    if draft is None:  # prompt lookup: one deterministic proposal
        proposals = [(tuple(NgramIndex(2, ctx).propose(k)[0]), 1.0)]
    else:
        proposals = []
        for xs in itertools.product(range(V), repeat=k):
            w = 1.0
            for i in range(k):
                w *= float(_probs(draft, ctx + list(xs[:i]), settings)[xs[i]])
            proposals.append((xs, w))
    for xs, w in proposals:
        if w == 0:
            continue
        n_drafts = len(xs)
        p = torch.stack([_probs(target, ctx + list(xs[:i]), settings) for i in range(n_drafts + 1)])
        d = torch.tensor(xs, dtype=torch.long)
        if draft is None:
            q = torch.nn.functional.one_hot(d, V).double()
        else:
            q = torch.stack([_probs(draft, ctx + list(xs[:i]), settings) for i in range(n_drafts)])
        a = acceptance_probs(p[:n_drafts], q, d) if n_drafts else torch.zeros(0)
        reach = w
        for n in range(n_drafts + 1):
            if n < n_drafts:
                stay = reach * (1 - float(a[n]))
                dist = residual_probs(p[n], q[n])
            else:
                stay, dist = reach, p[n]
            for tok in range(V):
                key = (*xs[:n], tok)
                outcomes[key] = outcomes.get(key, 0.0) + stay * float(dist[tok])
            if n < n_drafts:
                reach *= float(a[n])
    return outcomes


def _first_two(target, prompt, k, settings, draft):
    """P(first two emitted tokens) under the procedure, rounds of k drafts."""
    dist: dict[tuple, float] = {}
    for out, w in _round(target, prompt, k, settings, draft).items():
        if len(out) >= 2:
            dist[out[:2]] = dist.get(out[:2], 0.0) + w
        else:
            for out2, w2 in _round(target, prompt + list(out), k, settings, draft).items():
                dist[(*out, out2[0])] = dist.get((*out, out2[0]), 0.0) + w * w2
    return dist


def _target_joint(target, prompt, settings):
    V = target.config.vocab_size
    p1 = _probs(target, prompt, settings)
    return {
        (a, b): float(p1[a] * _probs(target, prompt + [a], settings)[b])
        for a in range(V)
        for b in range(V)
    }


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("mode", ["draft", "lookup"])
@torch.no_grad()
def test_the_procedure_has_exactly_the_targets_distribution(settings, mode):
    target = _lm(vocab=3, d=16, heads=2, ctx=16, init_std=0.5, position="rope").double()
    draft = _lm(vocab=3, d=8, layers=1, heads=2, ctx=16, seed=1, init_std=0.5).double()
    prompt = [1, 2, 0, 1, 2]  # lookup proposes the tokens after the earlier "1 2"
    got = _first_two(target, prompt, 2, settings, draft if mode == "draft" else None)
    want = _target_joint(target, prompt, settings)
    assert abs(sum(got.values()) - 1) < 1e-6
    for pair, p in want.items():
        assert abs(got.get(pair, 0.0) - p) < 1e-6, (pair, got.get(pair), p)
    if mode == "draft":  # the test can tell: accepting every draft gives the draft's joint
        naive = _target_joint(draft, prompt, settings)
        assert max(abs(naive[x] - want[x]) for x in want) > 1e-2


def _sample_counts(target, prompt, n, **kw):
    V = target.config.vocab_size
    counts = torch.zeros(V * V)
    gen = torch.Generator().manual_seed(0)
    idx = torch.tensor([prompt] * 50)
    for _ in range(n // 50):
        out = generate(target, idx, 4, generator=gen, temperature=0.9, **kw)
        counts += torch.bincount(out[:, len(prompt)] * V + out[:, len(prompt) + 1], minlength=V * V)
    return counts


@pytest.mark.slow
@torch.no_grad()
def test_seeded_samples_pass_a_chi_square_test_against_the_target():
    target = _lm(vocab=3, d=16, heads=2, ctx=16, init_std=0.5, position="alibi")
    draft = _lm(vocab=3, d=8, layers=1, heads=2, ctx=16, seed=1, init_std=0.5, position="alibi")
    prompt = [1, 2, 0, 1, 2]
    want = torch.tensor(
        list(_target_joint(target.double(), prompt, dict(temperature=0.9)).values())
    )
    target.float()
    n = 1500
    limit = chi2.ppf(0.999, df=len(want) - 1)
    for kw in (dict(draft=draft, speculate=3, adapt=False), dict(prompt_lookup=2, speculate=3)):
        counts = _sample_counts(target, prompt, n, **kw)
        stat = float(((counts - n * want) ** 2 / (n * want)).sum())
        assert stat < limit, (kw, stat, limit)
    # and the test has power: the draft's own samples are far from the target's distribution
    counts = _sample_counts(draft, prompt, n)
    assert float(((counts - n * want) ** 2 / (n * want)).sum()) > limit


def test_acceptance_rule_and_k_choice_by_hand():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    q = torch.tensor([[0.25, 0.6, 0.15], [0.2, 0.2, 0.6]])
    a = acceptance_probs(p, q, torch.tensor([1, 2]))
    assert torch.allclose(a, torch.tensor([0.5, 1.0]))
    # max(0, p − q) = (0.25, 0, 0.05), normalised
    assert torch.allclose(residual_probs(p[0], q[0]), torch.tensor([0.25, 0.0, 0.05]) / 0.3)
    assert expected_tokens(0.5, 2) == 1.75
    assert best_k(0.0, 5, 0.1) == 0 and best_k(0.95, 5, 0.0, 0.08) == 5
    # α = 0.8, draft cost 0.1, β = 0.08, round cost 0.1: E(k)/(1.1 + 0.18k) peaks at k = 4
    # (3.362 / 1.82 = 1.847; k = 3: 2.952 / 1.64 = 1.800; k = 5: 3.689 / 2.0 = 1.845)
    rates = [expected_tokens(0.8, k) / (1 + 0.18 * k + 0.1 * (k > 0)) for k in range(6)]
    assert best_k(0.8, 5, 0.1, 0.08, 0.1) == max(range(6), key=rates.__getitem__) == 4
    # a round must gain more than its fixed cost: α = 0.12 gains 1.12 / 1.08 without one, and
    # loses 1.12 / 1.18 with it
    assert best_k(0.12, 5, 0.0, 0.08, 0.0) == 1 and best_k(0.12, 5, 0.0, 0.08, 0.1) == 0
    # a compiled verification is padded to 1 + the next power of two of the drafts, at most
    # K + 1 tokens (a fed sequence longer than K + 1 goes eager, unpadded)
    assert [verify_width(n, 16) for n in (2, 3, 4, 5, 6, 9, 10, 17, 20)] == [
        2, 3, 5, 5, 9, 9, 17, 17, 20,
    ]  # fmt: skip
    assert [verify_width(n, 6) for n in (1, 4, 6, 7)] == [1, 5, 7, 7]
    # ... and costed so: α = 0.7, β = 0.2, K = 4, no round cost, E(k) = 1, 1.7, 2.19, 2.533,
    # 2.7731. Unpadded k = 3 wins (2.533 / 1.6 = 1.583 > k = 2's 2.19 / 1.4 = 1.564 > k = 4's
    # 2.7731 / 1.8 = 1.541); padded, three drafts cost four (2.533 / 1.8 = 1.407): k = 2
    assert best_k(0.7, 4, 0.0, 0.2, 0.0) == 3 and best_k(0.7, 4, 0.0, 0.2, 0.0, padded=True) == 2
    # a survival S (S[i-1] = P(drafts 1..i all accepted)) in place of α
    assert expected_tokens([0.5, 0.5, 0.25], 3) == 2.25 == expected_tokens(0.5, 2) + 0.5


def test_step_cost_counts_weight_bytes_and_a_fixed_cost_per_block():
    """The bytes of weights read (parameters, and an int8 layer's weight buffer, once each)
    plus a fixed cost per block and once for the embedding and head, smaller for a compiled
    step (one graph: no Python per layer), smaller again for greedy steps chained in one graph
    (no call per token)."""
    model = _lm(vocab=13, d=32, layers=2, heads=4, ctx=40)  # fp32, tied head
    params = sum(p.numel() for p in model.parameters())
    eager = draft_length.LAYER_OVERHEAD_BYTES
    compiled = draft_length.COMPILED_LAYER_OVERHEAD_BYTES
    chained = draft_length.CHAINED_LAYER_OVERHEAD_BYTES
    assert draft_length.step_cost(model) == 4 * params + 3 * eager
    assert draft_length.step_cost(model, compiled=True) == 4 * params + 3 * compiled
    assert draft_length.step_cost(model, compiled=True, chained=True) == 4 * params + 3 * chained
    assert chained < compiled < eager
    q = quantize_int8(_lm(vocab=13, d=32, layers=2, heads=4, ctx=40))
    int8 = sum(b.numel() for n, b in q.named_buffers() if n.endswith("weight"))
    floats = sum(p.numel() for p in q.parameters())
    assert int8 > 0 and draft_length.step_cost(q, compiled=True) == int8 + 4 * floats + 3 * compiled


def test_acceptance_estimate_per_draft_position():
    est = draft_length.Acceptance()
    assert est.survival(0, 2) == pytest.approx([0.6, 0.36])  # the prior, α = 0.6
    est.update(0, 2, 0)  # two drafted, the first rejected: position 1 reached, rejected there
    # pooled rejection rate (1 + 0.8) / (1 + 2) = 0.6; position 1: (1 + 2 · 0.6) / (1 + 2);
    # position 2, never reached: the pooled 0.6
    s1 = 1 - 2.2 / 3
    assert est.survival(0, 2) == pytest.approx([s1, s1 * 0.4])
    # rounds accepted whole or failing at once (text that repeats, then text that does not):
    # the first draft is the risky one, the later ones are kept once it is (a single α makes
    # every draft as risky as the average)
    est = draft_length.Acceptance()
    for _ in range(6):
        est.update(0, 8, 8)
        est.update(0, 8, 0)
    s = est.survival(0, 8)
    assert s[0] < 0.6 < est.alpha(0)
    assert min(b / a for a, b in zip(s, s[1:])) > 0.9
    assert best_k(s, 8, 0.05) == 8
    assert est.update(1, 3, 3) is None and est.survival(0, 8) == s  # keys are apart
    # a plain round (nothing drafted) ages the counts by 0.9 too: an estimate that stopped
    # drafting relaxes towards the prior instead of keeping its last rejections for ever
    est = draft_length.Acceptance()
    est.update(0, 2, 0)
    est.update(0, 0, 0)  # reached = rejected = (0.9, 0)
    pooled = (0.9 + 0.8) / (0.9 + 2)
    s1 = 1 - (0.9 + 2 * pooled) / (0.9 + 2)
    assert est.survival(0, 2) == pytest.approx([s1, s1 * (1 - pooled)])
    for _ in range(100):
        est.update(0, 0, 0)
    assert est.survival(0, 2) == pytest.approx([0.6, 0.36], abs=1e-3)


# ----------------------------------------------------------------------------------------------
# cache rollback, prompt lookup's index


def test_greedy_speculation_with_a_token_shift(eager_static):
    # the token shift keeps one more cache (the embeddings), rolled back with the others
    target = _lm(position="rope", token_shift=True)
    draft = _lm(d=16, layers=1, heads=2, seed=1, position="rope", token_shift=True)
    for m in (target, draft):
        with torch.no_grad():
            m.shift_mix.normal_(generator=torch.Generator().manual_seed(4))
    idx = torch.randint(0, 13, (1, 6), generator=torch.Generator().manual_seed(2))
    plain = generate(target, idx, 50, temperature=0)
    for kw in (
        dict(draft=draft, speculate=4),
        dict(draft=draft, speculate=3, compile=True),
        dict(prompt_lookup=2, speculate=4),
    ):
        assert torch.equal(generate(target, idx, 50, temperature=0, **kw), plain), kw


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("position", ["rope", "t5", "alibi", "learned"])
@torch.no_grad()
def test_cropped_caches_equal_a_fresh_recomputation(static, position):
    model = _lm(position=position, n_kv_heads=2)
    ids = torch.randint(0, 13, (1, 12), generator=torch.Generator().manual_seed(3))
    state = model.start_decoding(1, 20, static=static)
    model.decode_step(ids[:, :5], state)
    model.decode_step(ids[:, 5:12], state)  # 7 "drafts", 3 of them accepted
    for cache in state.caches:
        cache.crop(8)
    if static:
        state.mask[:, 8:] = False
    else:
        state.mask = state.mask[:, :8]
    fresh = model.start_decoding(1, 20, static=static)
    model.decode_step(ids[:, :8], fresh)
    for a, b in zip(state.caches, fresh.caches):
        assert a.length == b.length == 8
        torch.testing.assert_close(a.get()[0][:, :, :8], b.get()[0][:, :, :8])
        torch.testing.assert_close(a.get()[1][:, :, :8], b.get()[1][:, :, :8])
    nxt = torch.tensor([[4, 7]])
    torch.testing.assert_close(
        model.decode_step(nxt, state)[0], model.decode_step(nxt, fresh)[0], atol=1e-5, rtol=0
    )
    with pytest.raises(ValueError, match="cannot crop"):
        state.caches[0].crop(11)


def test_ngram_index_proposes_what_followed_the_latest_occurrence():
    index = NgramIndex(3, [5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2])
    assert index.propose(3) == ([4, 7, 1], 2)  # "1 2" last followed by 4 7 1 (not 3 9)
    index.extend([4])
    assert index.propose(2) == ([7, 1], 3)  # "1 2 4"
    assert NgramIndex(2, [1, 2, 3]).propose(4) == ([], 0)
    # a copy that reaches the end continues periodically: "3 4" last followed by "5 3 4" (the
    # end), so the run 5 3 4 5 3 4 ... goes on
    assert NgramIndex(2, [3, 4, 5, 3, 4]).propose(5) == ([5, 3, 4, 5, 3], 2)
    assert NgramIndex(2, [1, 1, 1]).propose(4) == ([1, 1, 1, 1], 2)


# ----------------------------------------------------------------------------------------------
# refusals


def test_mismatched_vocabularies_and_tokenizers_are_refused():
    target = _lm()
    with pytest.raises(UserError, match="draft's vocabulary has 11 tokens but the model's has 13"):
        generate(target, torch.tensor([[1]]), 3, draft=_lm(vocab=11))
    with pytest.raises(UserError, match="draft model or prompt lookup, not both"):
        generate(target, torch.tensor([[1]]), 3, draft=target, prompt_lookup=2)
    with pytest.raises(UserError, match="speculate"):
        generate(target, torch.tensor([[1]]), 3, draft=target, speculate=0)
    with pytest.raises(UserError, match="Transformer LMs"):
        check_draft(target, torch.nn.Linear(2, 2))
    check_tokenizers(CharTokenizer("abc"), CharTokenizer("abc"))
    with pytest.raises(UserError, match="other tokens"):
        check_tokenizers(CharTokenizer("abc"), CharTokenizer("abd"))
    with pytest.raises(UserError, match="4 tokens"):
        check_tokenizers(CharTokenizer("abc"), CharTokenizer("abcd"))


def _run(path, model, chars):
    path.mkdir()
    cfg = {"kind": "decoder_lm", "model": model.config.to_dict()}
    (path / "config.json").write_text(json.dumps(cfg))
    save_model(model, path / "model.safetensors")
    CharTokenizer(chars).save(path)
    return str(path)


def test_cli_speculates_and_refuses_a_draft_with_another_tokenizer(tmp_path, capsys):
    chars = "abcdefghij \n"
    target = _run(tmp_path / "t", _lm(vocab=len(chars)), chars)
    draft = _run(tmp_path / "d", _lm(vocab=len(chars), d=16, layers=1, heads=2), chars)
    other = _run(tmp_path / "o", _lm(vocab=len(chars), d=16, layers=1), "abcdefghij \t")
    common = ["generate", target, "--prompt", "abc", "-n", "12", "--temperature", "0"]
    assert main([*common, "--no-stream"]) == 0
    plain = capsys.readouterr().out
    assert main([*common, "--no-stream", "--draft", draft, "--speculate", "3"]) == 0
    out = capsys.readouterr()
    assert out.out == plain and "drafted tokens accepted" in out.err
    assert main([*common, "--prompt-lookup", "2"]) == 0
    assert capsys.readouterr().out == plain
    assert main([*common, "--no-stream", "--draft", draft, "--draft-dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out == plain  # another dtype drafts, the model decides
    for argv, message in (
        ([*common, "--draft", other], "other tokens"),
        ([*common, "--draft", draft, "--prompt-lookup", "2"], "not both"),
        ([*common, "--speculate", "3"], "add --draft RUN"),
        ([*common, "--draft-compile"], "add --draft RUN"),
        ([*common, "--prompt-lookup", "2", "--no-draft-compile"], "are for --draft RUN"),
        ([*common[:-2], "--draft", draft, "--beam", "2"], "drop it or --beam"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("attnlab: error:") and message in err[0], err


def test_sampled_drafts_start_from_a_lower_prior():
    """A sampled draft is kept with probability min(1, p/q), less often than a greedy one is the
    argmax: its estimate starts (and relaxes back) to PRIOR_SAMPLING, below PRIOR_GREEDY."""
    assert draft_length.PRIOR_SAMPLING < draft_length.PRIOR_GREEDY
    assert draft_length.Acceptance(0.3).survival(0, 2) == pytest.approx([0.3, 0.09])
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match="prior"):
            draft_length.Acceptance(bad)

    def row(temperature):
        return speculative_mod._Row(
            _lm(), [1, 2, 3], 10, draft=None, k_max=4, adapt=True, ngram=2,
            sampling=dict(temperature=temperature, top_k=None, top_p=None), generator=None,
            compile=False, draft_compile=False, stats=SpeculativeStats(),
        )  # fmt: skip

    assert row(0.0).acceptance.alpha() == pytest.approx(draft_length.PRIOR_GREEDY)
    assert row(0.8).acceptance.alpha() == pytest.approx(draft_length.PRIOR_SAMPLING)
    # at the sampling prior a lookup round does not pay (r = 0.2, β = 0.15): only probes draft
    assert (
        best_k(row(0.8).acceptance.survival(1, 4), 4, 0.0)
        == 0
        < best_k(row(0.0).acceptance.survival(1, 4), 4, 0.0)
    )


def test_a_chained_greedy_draft_is_priced_as_chained():
    """The draft's cost per token in the rule: chained greedy steps (compiled draft, CPU) at
    CHAINED_LAYER_OVERHEAD_BYTES a block, a sampled draft's single compiled steps at
    COMPILED_LAYER_OVERHEAD_BYTES, over the target's compiled step."""
    target, draft = _lm(), _lm(d=16, layers=1, heads=2, seed=1)

    def row(temperature):
        return speculative_mod._Row(
            target, [1, 2, 3], 10, draft=draft, k_max=4, adapt=True, ngram=1,
            sampling=dict(temperature=temperature, top_k=None, top_p=None), generator=None,
            compile=True, draft_compile=True, stats=SpeculativeStats(),
        )  # fmt: skip

    step = draft_length.step_cost(target, compiled=True)
    greedy, sampled = row(0.0), row(0.8)
    assert greedy.chained_drafts and not sampled.chained_drafts
    cost = draft_length.step_cost
    assert greedy.draft_cost == cost(draft, compiled=True, chained=True) / step
    assert sampled.draft_cost == cost(draft, compiled=True) / step > greedy.draft_cost


def test_probes_grow_rarer_while_they_find_nothing():
    target = _lm()
    row = speculative_mod._Row(
        target, [1, 2, 3], 500, draft=None, k_max=4, adapt=True, ngram=2,
        sampling=dict(temperature=0.0, top_k=None, top_p=None), generator=None,
        compile=False, draft_compile=False, stats=SpeculativeStats(),
    )  # fmt: skip
    for _ in range(20):
        row.acceptance.update(1, 4, 0)  # every first draft rejected: drafting never pays
    assert best_k(row.acceptance.survival(1, 4), 4, 0.0) == 0
    ks = [row._choose_k(1) for _ in range(200)]
    # gaps of 8, 16, 32, then 64 plain rounds between one-token probes
    assert [i for i, k in enumerate(ks) if k] == [7, 23, 55, 119, 183]
    assert {k for k in ks if k} == {1}
    row.target.compile = True  # padded, a probe of one draft is a forward of two tokens
    assert {row._choose_k(1) for _ in range(64)} == {0, 1}

"""Generation: KV-cache decoding equals full recomputation for every preset and position scheme
(through the caches and through decode_step), the LSTM's decode_step equals its full forward,
batched left-padded prompts equal each prompt alone, greedy equals a hand-written argmax loop
(the cached path feeding one token per step and reading what it cached),
beam search as wide as the search space equals exhaustive search, top-k / top-p restrict the
support, stop ids, the sliding context, bad input."""

import importlib
import inspect
import itertools

import pytest
import torch

import attnlab
from attnlab import generate as attnlab_generate
from attnlab.config import PRESETS, BigramConfig, LSTMConfig, ModelConfig
from attnlab.decoding import beam_generate, generate, left_pad, sample_next, stream_generate
from attnlab.errors import UserError
from attnlab.models.lm import DecoderLM
from attnlab.models.rnn_lm import LSTMLM, BigramLM

SHRINK = dict(n_layers=1, vocab_size=64, max_seq_len=64)
CASES = [(n, SHRINK if n.endswith("small") or n == "gpt2" else {}) for n in PRESETS] + [
    ("tiny", {"position": "alibi"}),
    ("tiny", {"position": "sinusoidal"}),
    ("llama-tiny", {"n_kv_heads": 1, "qk_norm": "rmsnorm"}),
    ("tiny", {"norm_position": "post"}),
    ("llama-tiny", {"position": "alibi", "n_kv_heads": 2}),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items() if k not in SHRINK)}" for n, o in CASES]


@pytest.mark.parametrize("name,overrides", CASES, ids=IDS)
def test_incremental_decoding_with_cache_equals_full_recomputation(name, overrides):
    cfg = ModelConfig.preset(name, **overrides)
    model = DecoderLM(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 14))
    with torch.no_grad():
        full = model(idx)
        caches = model.make_caches(2, 20)
        steps = [model(idx[:, :5], caches=caches)]  # prefill, then one token at a time
        steps += [model(idx[:, t : t + 1], caches=caches) for t in range(5, 14)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("tiny", {}),
        ("llama-tiny", {}),
        ("mixtral-tiny", {}),
        ("tiny", {"position": "alibi"}),
        ("llama-tiny", {"n_kv_heads": 1}),
    ],
)
def test_left_padded_batch_generates_the_same_tokens_as_each_prompt_alone(name, overrides):
    model = DecoderLM(ModelConfig.preset(name, **overrides)).eval()
    prompts = [torch.randint(0, 256, (n,)).tolist() for n in (3, 11, 7)]
    idx, mask = left_pad(prompts)
    batched = generate(model, idx, 12, temperature=0, attention_mask=mask)
    for b, p in enumerate(prompts):
        alone = generate(model, torch.tensor([p]), 12, temperature=0)
        assert batched[b, -12:].tolist() == alone[0, -12:].tolist()


def _greedy_reference(model, idx, n):
    # the definition: append argmax of the full forward pass, n times
    for _ in range(n):
        idx = torch.cat([idx, model(idx)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


def _forward_calls(model):
    """Record (tokens fed, whether KV caches were passed) of every call of ``model``."""
    calls = []

    def hook(module, args, kwargs):
        calls.append((args[0].shape[1], kwargs.get("caches") is not None))

    return calls, model.register_forward_pre_hook(hook, with_kwargs=True)


def test_greedy_with_and_without_cache_equals_the_argmax_loop():
    model = DecoderLM(ModelConfig.preset("llama-tiny")).eval()
    idx = torch.randint(0, 256, (2, 5))
    with torch.no_grad():
        ref = _greedy_reference(model, idx, 15)
    calls, handle = _forward_calls(model)
    try:
        assert torch.equal(generate(model, idx, 15, temperature=0), ref)
        # the cached path encodes the prompt once, then feeds one token per step into the caches
        assert calls == [(5, True)] + [(1, True)] * 14
        calls.clear()
        assert torch.equal(generate(model, idx, 15, temperature=0, use_cache=False), ref)
        assert calls == [(5 + t, False) for t in range(15)]  # the whole window every step
    finally:
        handle.remove()
    assert torch.equal(attnlab_generate(model, idx, 15, temperature=0), ref)  # package name


def test_generate_reads_the_kv_cache(monkeypatch):
    # corrupt what the cache holds after the prompt: if generate really reads the keys and values
    # it cached (rather than recomputing them), its continuation changes
    model = DecoderLM(ModelConfig.preset("llama-tiny")).eval()
    idx = torch.randint(0, 256, (2, 5))
    clean = generate(model, idx, 10, temperature=0)
    step = model.decode_step

    def corrupting_step(tokens, state, **kwargs):
        logits, state = step(tokens, state, **kwargs)
        if tokens.shape[1] > 1:  # right after the prompt
            g = torch.Generator().manual_seed(0)
            for cache in state.caches:  # keys and values of the prompt replaced by noise
                cache.k.normal_(0.0, 10.0, generator=g)
                cache.v.normal_(0.0, 10.0, generator=g)
        return logits, state

    monkeypatch.setattr(model, "decode_step", corrupting_step)
    corrupted = generate(model, idx, 10, temperature=0)
    assert torch.equal(corrupted[:, :6], clean[:, :6])  # the first new token precedes the damage
    assert not torch.equal(corrupted, clean)


def test_generation_beyond_the_context_slides_the_window():
    model = DecoderLM(ModelConfig.preset("tiny", max_seq_len=16)).eval()
    idx = torch.randint(0, 256, (1, 10))
    out = generate(model, idx, 30, temperature=0)
    assert out.shape == (1, 40)
    # every token is the argmax given (at most) the previous 16 tokens
    out_nc = generate(model, idx, 30, temperature=0, use_cache=False)
    with torch.no_grad():
        for t in range(10, 40):
            window = out_nc[:, max(0, t - 16) : t]
            assert int(model(window)[0, -1].argmax()) == int(out_nc[0, t])
    assert torch.equal(out[:, :17], out_nc[:, :17])  # the same until the window first slides


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]]).repeat(2000, 1)
    g = torch.Generator().manual_seed(0)
    k = sample_next(logits, temperature=1.0, top_k=2, generator=g)
    assert set(k.tolist()) == {0, 1}
    probs = logits[0].softmax(-1)  # 0.64, 0.23, 0.09, ...: the nucleus for p=0.8 is {0, 1}
    assert probs[0] < 0.8 <= probs[:2].sum()
    p = sample_next(logits, temperature=1.0, top_p=0.8, generator=g)
    assert set(p.tolist()) == {0, 1}
    # the kept tokens keep their relative odds: P(0)/P(1) = e
    ratio = (p == 0).float().mean() / (p == 1).float().mean()
    assert abs(float(ratio) - torch.e) < 0.35
    assert set(sample_next(logits[:5], temperature=0).tolist()) == {0}


def test_sampling_is_reproducible_with_a_generator():
    model = DecoderLM(ModelConfig.preset("tiny")).eval()
    idx = torch.randint(0, 256, (1, 4))
    a = generate(model, idx, 20, generator=torch.Generator().manual_seed(3))
    b = generate(model, idx, 20, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_stop_id_ends_rows_and_fills_them():
    model = DecoderLM(ModelConfig.preset("tiny")).eval()
    idx = torch.randint(0, 256, (2, 4))
    free = generate(model, idx, 10, temperature=0)
    stop = int(free[0, 6])  # row 0 emits this at its third step
    out = generate(model, idx, 10, temperature=0, stop=stop)
    row = out[0, 4:].tolist()
    first = row.index(stop)
    assert row[:first] == free[0, 4 : 4 + first].tolist() and set(row[first:]) == {stop}


def test_streaming_callback_sees_every_step():
    model = DecoderLM(ModelConfig.preset("tiny")).eval()
    seen = []
    out = generate(
        model,
        torch.zeros(1, 3, dtype=torch.long),
        6,
        temperature=0,
        callback=lambda t: seen.append(int(t[0])),
    )
    assert seen == out[0, 3:].tolist()


def test_bad_generation_requests_raise_user_errors():
    model = DecoderLM(ModelConfig.preset("tiny", max_seq_len=8)).eval()
    with pytest.raises(UserError, match="context"):
        generate(model, torch.zeros(1, 9, dtype=torch.long), 1)
    with pytest.raises(UserError, match="temperature"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), 1, temperature=-1)
    with pytest.raises(UserError, match="top_p"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), 1, top_p=0)
    with pytest.raises(UserError, match="token ids"):
        generate(model, torch.full((1, 2), 999), 1)


def test_generation_hands_a_training_model_back_in_training_mode_even_on_error():
    model = DecoderLM(ModelConfig.preset("tiny", dropout=0.1)).train()
    idx = torch.zeros(1, 2, dtype=torch.long)
    modes = []
    generate(model, idx, 3, callback=lambda t: modes.append(model.training))
    assert modes == [False] * 3 and all(m.training for m in model.modules())
    with pytest.raises(TypeError):  # not a torch.Generator: fails at the first sample
        generate(model, idx, 3, generator="seed 0")
    assert all(m.training for m in model.modules())
    stream = stream_generate(model, idx, 5, temperature=0)
    next(stream)
    assert not model.training  # suspended while generating
    stream.close()  # a stream dropped early
    assert all(m.training for m in model.modules())
    model.eval()
    with pytest.raises(TypeError):
        generate(model, idx, 3, generator="seed 0")
    assert not any(m.training for m in model.modules())


def test_package_attribute_generate_is_the_function_even_after_importing_the_module():
    importlib.import_module("attnlab.decoding.sampling")  # where generate lives now
    assert callable(attnlab.generate) and attnlab.generate.__name__ == "generate"


def test_cache_is_sized_for_the_request_not_the_whole_context(monkeypatch):
    # an imported checkpoint can have 131k positions; the cache must not reserve all of them
    model = DecoderLM(ModelConfig.preset("llama-tiny", max_seq_len=100_000)).eval()
    sizes = []
    original = model.make_caches

    def spy(batch, max_len, **kwargs):
        sizes.append(max_len)
        return original(batch, max_len, **kwargs)

    monkeypatch.setattr(model, "make_caches", spy)
    idx = torch.randint(0, model.config.vocab_size, (2, 5))
    out = generate(model, idx, 7, temperature=0.0)
    assert out.shape == (2, 12)
    assert sizes == [12]
    assert torch.equal(out, generate(model, idx, 7, temperature=0.0, use_cache=False))


@pytest.mark.parametrize("name,overrides", CASES[:4] + CASES[-5:], ids=IDS[:4] + IDS[-5:])
def test_decode_step_logits_equal_the_full_forward(name, overrides):
    """decode_step (the interface every search uses): a prompt, then one token at a time, gives
    the logits a full forward gives at each position."""
    cfg = ModelConfig.preset(name, **overrides)
    model = DecoderLM(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        full = model(idx)  # (B, T, V)
        state = model.start_decoding(2, 12)
        logits, state = model.decode_step(idx[:, :4], state)
        steps = [logits]
        for t in range(4, 12):
            logits, state = model.decode_step(idx[:, t : t + 1], state)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 3:], atol=1e-5, rtol=0)


def _lstm(**kw):
    torch.manual_seed(0)
    return LSTMLM(LSTMConfig.preset("tiny", vocab_size=50, max_seq_len=32, **kw)).eval()


@pytest.mark.parametrize("n_layers", [1, 2])
def test_lstm_decode_step_equals_its_full_forward(n_layers):
    model = _lstm(n_layers=n_layers)
    idx = torch.randint(0, 50, (3, 10))
    with torch.no_grad():
        full = model(idx)  # (B, T, V)
        logits, state = model.decode_step(idx[:, :3], model.start_decoding(3, 10))
        steps = [logits]
        for t in range(3, 10):
            logits, state = model.decode_step(idx[:, t : t + 1], state)
            steps.append(logits)
        # the state is batch-first, so reordering rows (beam search) selects whole states
        state.reorder(torch.tensor([2, 0]))
        nxt, _ = model.decode_step(idx[[2, 0], 9:], state)
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 2:], atol=1e-5, rtol=0)
    both = torch.cat([idx[[2, 0]], idx[[2, 0], 9:]], 1)
    torch.testing.assert_close(nxt, model(both)[:, -1], atol=1e-5, rtol=0)


def test_lstm_generates_through_its_state_like_recomputation():
    model = _lstm(n_layers=2)
    idx = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        ref = _greedy_reference(model, idx, 12)
    assert torch.equal(generate(model, idx, 12, temperature=0), ref)
    assert torch.equal(generate(model, idx, 12, temperature=0, use_cache=False), ref)


def _exhaustive_best(model, prompt, n):
    """The continuation of ``n`` tokens with the largest log-probability, by enumerating every
    one and scoring it with a full forward pass."""
    V = model.config.vocab_size
    conts = torch.tensor(list(itertools.product(range(V), repeat=n)))  # (V^n, n)
    seqs = torch.cat([prompt.expand(len(conts), -1), conts], 1)  # (V^n, T + n)
    with torch.no_grad():
        logp = model(seqs).log_softmax(-1)[:, prompt.shape[1] - 1 : -1]  # (V^n, n, V)
    scores = logp.gather(-1, conts[..., None]).squeeze(-1).sum(-1)  # (V^n,)
    best = int(scores.argmax())
    return conts[best].tolist(), float(scores[best]), scores


@pytest.mark.parametrize(
    "make",
    [
        lambda: DecoderLM(ModelConfig.preset("tiny", vocab_size=4, max_seq_len=16)),
        lambda: DecoderLM(ModelConfig.preset("llama-tiny", vocab_size=4, max_seq_len=16)),
        lambda: LSTMLM(LSTMConfig.preset("tiny", vocab_size=4, max_seq_len=16)),
    ],
    ids=["gpt2", "llama", "lstm"],
)
def test_beam_as_wide_as_the_search_space_is_exhaustive_search(make):
    """V = 4 and 3 new tokens: a beam of 64 keeps every continuation, so its best is the best of
    all 64 scored one by one; a narrower beam never scores higher."""
    torch.manual_seed(1)
    model = make().eval()
    with torch.no_grad():  # sharper distributions than the init's near-uniform ones
        model.lm_head.weight.mul_(20 if isinstance(model, DecoderLM) else 5)
    prompts = torch.randint(0, 4, (2, 3))
    hyps = beam_generate(model, prompts, 3, beam=64)
    for b, hyp in enumerate(hyps):
        best, score, scores = _exhaustive_best(model, prompts[b : b + 1], 3)
        assert hyp.ids == best
        assert hyp.logprob == pytest.approx(score, abs=1e-4)
        assert (scores.sort(descending=True).values[:2].diff().abs() > 1e-4).all()  # no tie
        narrow = beam_generate(model, prompts[b : b + 1], 3, beam=2)[0]
        assert narrow.logprob <= score + 1e-5
    greedy = generate(model, prompts, 3, temperature=0)[:, 3:].tolist()
    assert [h.ids for h in beam_generate(model, prompts, 3, beam=1)] == greedy


def test_the_bigram_table_generates_by_recomputation_and_refuses_beam_search():
    model = BigramLM(BigramConfig(vocab_size=10, max_seq_len=8)).eval()
    with torch.no_grad():
        model.table.weight.copy_(torch.randn(10, 10))
    out = generate(model, torch.tensor([[3]]), 20, temperature=0)  # slides past max_seq_len
    for t in range(1, 21):
        assert int(out[0, t]) == int(model.table.weight[out[0, t - 1]].argmax())
    with pytest.raises(UserError, match="beam search needs"):
        beam_generate(model, torch.tensor([[3]]), 2, beam=2)


def test_generate_takes_stream_generates_settings_and_names_a_misspelt_one():
    model = DecoderLM(ModelConfig.preset("tiny")).eval()
    idx = torch.randint(0, 64, (1, 3))
    params = list(inspect.signature(generate).parameters)
    assert params == [*inspect.signature(stream_generate).parameters, "callback"]
    with pytest.raises(TypeError, match="temprature"):
        generate(model, idx, 2, temprature=0)
    steps = []
    out = generate(model, idx, 4, temperature=0, callback=steps.append)
    assert torch.equal(out[:, 3:], torch.stack(steps, dim=1))  # what streamed is what returned
    assert torch.equal(
        out[:, 3:], torch.stack(list(stream_generate(model, idx, 4, temperature=0)), 1)
    )

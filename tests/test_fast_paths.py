"""The fast paths of decoding and training give the same numbers as the plain ones.

- a static (preallocated, fixed-shape) KV cache gives the logits of the dynamic cache and of a
  full recomputation (1e-5, fp32), for every position scheme, grouped-query heads and left padding;
- a compiled decoding step gives the eager step's tokens;
- weight-only int8 layers stay within the quantisation error bound of fp32;
- bf16 and int8 decoding stay within a stated tolerance of fp32's logits and tokens;
- one bf16 query attends through fp32 products with the ``decode`` backend (attnlab.fast);
- ``torch.compile`` (inductor, no mocking) trains like eager.
"""

import copy
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import attnlab
import attnlab.fast.quant as quant_mod
from attnlab.attention import scaled_dot_product_attention
from attnlab.cli import main
from attnlab.config import LMTaskConfig, ModelConfig
from attnlab.data.tokenizers import CharTokenizer
from attnlab.decoding import generate
from attnlab.fast import for_decoding
from attnlab.fast.attention import FP32_QUERIES, ONE_QUERY_FP32_FROM, rows_as_steps
from attnlab.fast.compiled import capacity_bucket, start_static
from attnlab.fast.quant import Int8Linear, int8_error_bound, quantize_int8
from attnlab.models.lm import DecoderLM
from attnlab.tasks.lm import LMTask
from attnlab.train import TrainConfig, train

POSITIONS = ["learned", "rope", "alibi", "sinusoidal", "none"]


def _model(position="learned", **kw):
    cfg = ModelConfig.preset("tiny", position=position, max_seq_len=32, n_kv_heads=2, **kw)
    return DecoderLM(cfg).eval()


def _prompts(B=3, T=7, vocab=256):
    idx = torch.randint(0, vocab, (B, T))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :3] = False  # left padding of different lengths
    mask[1, :1] = False
    return idx, mask


@pytest.mark.parametrize("position", POSITIONS)
@torch.no_grad()
def test_static_cache_equals_dynamic_cache_equals_recomputation(position):
    model = _model(position)
    idx, mask = _prompts()
    steps = torch.randint(0, 256, (idx.shape[0], 6))
    full_ids = torch.cat([idx, steps], 1)
    full_mask = torch.cat([mask, torch.ones_like(steps, dtype=torch.bool)], 1)
    full = model(full_ids, attention_mask=full_mask)  # (B, T + 6, V)
    T = idx.shape[1]
    for static in (False, True):
        state = model.start_decoding(idx.shape[0], 20, static=static)
        logits, state = model.decode_step(idx, state, attention_mask=mask)
        torch.testing.assert_close(logits, full[:, T - 1], atol=1e-5, rtol=1e-5)
        for t in range(steps.shape[1]):
            logits, state = model.decode_step(steps[:, t : t + 1], state)
            torch.testing.assert_close(logits, full[:, T + t], atol=1e-5, rtol=1e-5)
        assert state.caches[0].length == T + steps.shape[1]


@torch.no_grad()
def test_static_cache_step_has_fixed_shapes_and_touches_no_python_counter():
    model = _model("rope")
    state = model.start_decoding(2, 16, static=True)
    model.decode_step(torch.randint(0, 256, (2, 5)), state)
    k_before = state.caches[0].k
    shapes = set()
    for _ in range(3):
        model.decode_step(torch.randint(0, 256, (2, 1)), state)
        shapes.add(tuple(state.caches[0].get()[0].shape))
    assert shapes == {(2, 2, 16, 16)}  # all slots every step: one shape to compile
    assert state.caches[0].k is k_before  # written in place: CUDA graphs can replay it
    assert state.caches[0]._length == 0 and state.caches[0].length == 8


@pytest.mark.slow
@torch.no_grad()
def test_each_model_keeps_its_compiled_step_and_a_changed_model_compiles_anew():
    """torch.compile (inductor, C++ kernels on a CPU) of the single-token step gives eager
    decoding's greedy tokens, with padding, in one graph for every step. The compiled CPU step
    skips Dynamo's per-call guards on the model: two models of the same shapes (other weights,
    another activation) must not share a graph, new weights must be read at call time, and a
    model changed in place (another dtype) must not reuse its old graph. (One test: each cold
    compile costs many seconds.)"""
    models = []
    for activation in ("gelu_tanh", "relu"):  # the same weights, another activation
        torch.manual_seed(1)
        models.append(_model("rope", n_layers=1, activation=activation))
        for p in models[-1].blocks.parameters():
            p.mul_(4.0)  # blocks that outweigh the tied embedding: the activation shows
    a, b = models
    torch.manual_seed(0)
    idx, mask = _prompts()
    eager_a = generate(a, idx, 6, temperature=0, attention_mask=mask)
    eager_b = generate(b, idx, 6, temperature=0, attention_mask=mask)
    assert not torch.equal(eager_a, eager_b)
    counters.clear()
    assert torch.equal(
        generate(a, idx, 6, temperature=0, attention_mask=mask, compile=True), eager_a
    )
    assert counters["stats"]["unique_graphs"] == 1  # the prompt and every step: one graph
    assert not counters["graph_break"]
    for model, eager in ((b, eager_b), (a, eager_a)):
        got = generate(model, idx, 6, temperature=0, attention_mask=mask, compile=True)
        assert torch.equal(got, eager)
    plain = generate(a, idx, 6, temperature=0)  # no padding: no mask input
    assert torch.equal(generate(a, idx, 6, temperature=0, compile=True), plain)
    for p in a.parameters():  # new values, same structure: the same graph reads them
        p.mul_(-1.5)
    moved = generate(a, idx, 6, temperature=0, attention_mask=mask)
    assert not torch.equal(moved, eager_a)
    assert torch.equal(generate(a, idx, 6, temperature=0, attention_mask=mask, compile=True), moved)
    a.to(torch.float64)  # another dtype: compiled anew
    eager64 = generate(a, idx, 6, temperature=0, attention_mask=mask)
    assert torch.equal(
        generate(a, idx, 6, temperature=0, attention_mask=mask, compile=True), eager64
    )


@torch.no_grad()
def test_a_compiled_verification_rounds_each_row_as_a_compiled_step():
    """Over static caches the compiled forward of several tokens (a speculative verification)
    gives each row bit for bit the compiled one-token step's logits with bf16 activations
    (inductor, no mocking): the graphs round every bf16 intermediate as eager code does
    (emulate_precision_casts), where fusing element-wise chains in fp32 by the number of tokens
    had made every row differ by a unit or two and flipped greedy near-ties."""
    torch.manual_seed(0)
    model = for_decoding(_model("rope", n_layers=2, init_std=0.5).to(torch.bfloat16))
    ids = torch.randint(0, 256, (1, 16))
    state = start_static(model, 1, 32, compile=True)
    model.decode_step(ids[:, :8], state)
    start = int(state.caches[0].cursor)
    steps = torch.stack([model.decode_step(ids[:, i : i + 1], state)[0][0] for i in range(8, 13)])
    for cache in state.caches:
        cache.crop(start)
    rows = state.step_forward(ids[:, 8:13], caches=state.caches, attention_mask=None,
                              logits_to_keep=5)[0]  # fmt: skip
    assert torch.equal(rows, steps)


@pytest.mark.parametrize("position", ["rope", "alibi", "learned"])
@torch.no_grad()
def test_an_eager_verification_over_a_growing_cache_rounds_each_row_as_a_step(position):
    """Over dynamic caches in eager mode (no --compile), a forward of several tokens (a
    speculative verification) inside rows_as_steps() gives each row bit for bit the one-token
    step's logits with bf16 activations: the decode backend attends each query over exactly the
    keys its step saw, where attention over the whole window (the later keys masked) summed
    otherwise and flipped greedy near-ties (without the split the 17-token rows differ for RoPE
    and learned positions here). ALiBi's bias rows are cut to the same keys (a wrong cut
    changes them)."""
    torch.manual_seed(1)
    cfg = ModelConfig.preset("tiny", position=position, max_seq_len=256, n_kv_heads=2,
                             init_std=0.5)  # fmt: skip
    model = for_decoding(DecoderLM(cfg).eval().to(torch.bfloat16))
    ids = torch.randint(0, 256, (1, 140))
    for start, width in [(100, 2), (111, 5), (120, 17)]:
        state = model.start_decoding(1, 256)
        model.decode_step(ids[:, :start], state)
        steps = [
            model.decode_step(ids[:, t : t + 1], state)[0][0] for t in range(start, start + width)
        ]
        for cache in state.caches:
            cache.crop(start)
        with rows_as_steps():  # as greedy speculative decoding verifies
            rows = model(ids[:, start : start + width], caches=state.caches,
                         logits_to_keep=width)[0]  # fmt: skip
        assert torch.equal(rows, torch.stack(steps)), (start, width)


def test_capacity_buckets_cover_the_need_with_few_graphs_and_little_waste():
    caps = [capacity_bucket(n, 4096) for n in range(1, 4097)]
    assert all(c >= n for n, c in zip(range(1, 4097), caps))  # room for every token
    assert caps == sorted(caps)  # a longer need never gets a smaller cache
    assert set(caps[:512]) == {64, 128, 256, 512}  # powers of two up to 512
    for lo in (512, 1024, 2048):  # then at most four graphs per doubling ...
        assert len({c for n, c in enumerate(caps, 1) if lo < n <= 2 * lo}) == 4
    # ... and at most a quarter of the slots unused above 512 (every step reads them all)
    assert all(c <= 1.25 * n for n, c in enumerate(caps, 1) if n > 512)
    assert capacity_bucket(544, 1024) == 640  # a 512-token prompt + 32 new tokens
    assert capacity_bucket(3000, 2048) == 2048  # never past the context


# -- weight-only int8 --------------------------------------------------------------------------


@pytest.mark.parametrize("use_kernel", [True, False])  # torch's kernel, the portable form
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [64, 17])  # 17: not a multiple of 8, the portable path
def test_int8_linear_is_within_the_rounding_bound_of_the_float_layer(dtype, k, use_kernel):
    linear = torch.nn.Linear(k, 48).to(dtype)
    q = Int8Linear.from_linear(linear)
    q.kernel_dtypes = {dtype} if use_kernel else set()
    x = torch.randn(5, 3, k, dtype=dtype)
    exact = torch.nn.functional.linear(x.float(), linear.weight.float(), linear.bias.float())
    got = q(x)
    assert got.dtype == dtype and got.shape == (5, 3, 48)
    # |y - ŷ| <= (s_n/2)·‖x‖₁, plus the rounding of the product in the activations' dtype
    eps = torch.finfo(dtype).eps
    slack = 4 * eps * (x.float().abs() @ linear.weight.float().abs().T + linear.bias.float().abs())
    assert ((got.float() - exact).abs() <= int8_error_bound(q, x) + slack).all()
    # and the layer computes exactly with its dequantised weights (fp32)
    if dtype == torch.float32:
        ref = torch.nn.functional.linear(x, q.dequantized(), linear.bias)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


FAST = {torch.float32, torch.bfloat16, torch.float16}


@pytest.mark.parametrize(
    "machine, capability, fast",
    [("x86_64", "AVX512", {torch.bfloat16}), ("x86_64", "AVX2", {torch.bfloat16}),
     ("AMD64", "DEFAULT", {torch.bfloat16}), ("aarch64", "DEFAULT", FAST)],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_int8_kernel_runs_where_it_is_vectorised(
    monkeypatch, caplog, machine, capability, fast, dtype
):
    """torch's int8 kernel is a scalar loop on x86 unless the activations are bf16 (~10x an
    fp32 matmul, with AVX2 and with AVX-512 alike): there fp32 layers take the portable form,
    and quantize_int8 says to use bf16 activations."""
    monkeypatch.setattr(quant_mod.platform, "machine", lambda: machine)
    monkeypatch.setattr(quant_mod.torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert quant_mod.kernel_dtypes() == fast
    calls = []
    real = torch._weight_int8pack_mm
    monkeypatch.setattr(torch, "_weight_int8pack_mm", lambda *a: calls.append(1) or real(*a))
    with caplog.at_level(logging.WARNING, logger="attnlab.fast.quant"):
        model = quantize_int8(_model("rope", n_layers=1).to(dtype))
    model(torch.randint(0, 256, (1, 5)))
    assert bool(calls) is (dtype in fast)
    warned = [r.getMessage() for r in caplog.records]
    if dtype in fast:
        assert warned == []
    else:
        assert len(warned) == 1 and capability in warned[0] and "bfloat16" in warned[0], warned


def test_quantize_int8_swaps_every_linear_including_the_tied_head():
    model = _model("rope")
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    quantize_int8(model)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == n_linear
    assert isinstance(model.lm_head, Int8Linear)
    assert model.tok_emb.weight.dtype == torch.float32  # the embedding is a lookup: kept


#: the documented tolerance of int8 logits, relative L2 error ‖Δ‖/‖logits‖ (fast/quant.py):
#: rounding moves each weight uniformly within ±s/2 (RMS s/√12), and with s = absmax/127 and
#: Gaussian rows (absmax ≈ σ·√(2 ln K)) that is ≈ 0.8 % of the weights' RMS, so each matmul's
#: output moves by ≈ 0.8 %. The 2-layer model chains 4·L + 1 = 9 matmuls: ≈ 0.8 % · √9 ≈ 2.4 %
#: expected; the tolerance is twice that.
INT8_RELATIVE_TOLERANCE = 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_int8_model_logits_are_within_the_documented_tolerance_of_fp32(dtype):
    model = _model("rope", n_layers=2)
    for p in model.parameters():  # trained-like weights: larger than the N(0, 0.02) init
        p.add_(torch.randn_like(p) * 0.1)
    idx = torch.randint(0, 256, (4, 24))
    ref = model(idx)
    quant = quantize_int8(_copy(model)).to(dtype)
    got = quant(idx).float()
    rel = (got - ref).norm() / ref.norm()
    assert rel < INT8_RELATIVE_TOLERANCE, rel
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


@pytest.mark.slow
@torch.no_grad()
@pytest.mark.parametrize("use_kernel", [True, False])
def test_a_bf16_int8_layer_compiles_with_inductor_and_computes_like_eager(use_kernel):
    """The int8 kernel takes its scales in the activations' dtype; they are stored so (a
    conversion inside the compiled graph did not lower), so ``--quantize int8 --compile`` runs;
    the portable form (CPUs without AVX-512) compiles too, inductor rounding its product to bf16
    once where eager rounds twice (within a bf16 step of outputs up to ~1.5)."""
    lin = torch.nn.Linear(64, 32).to(torch.bfloat16)
    q = Int8Linear.from_linear(lin)
    q.kernel_dtypes = {torch.bfloat16} if use_kernel else set()
    assert q.scale.dtype == torch.bfloat16
    norm = torch.nn.LayerNorm(64).to(torch.bfloat16)
    x = torch.randn(2, 1, 64, dtype=torch.bfloat16)
    compiled = torch.compile(lambda x: q(norm(x)), backend="inductor", fullgraph=True)
    tol = {} if use_kernel else dict(atol=1e-2, rtol=1.6e-2)
    torch.testing.assert_close(compiled(x), q(norm(x)), **tol)


def _copy(model):
    return copy.deepcopy(model)


def _decoded_logits(model, seq, mask, T):
    """Logits of the cached decoding path on a fixed sequence: the prompt ``seq[:, :T]`` (with
    ``mask``) in one step, then one token at a time; ``(B, L - T, V)`` in fp32."""
    state = model.start_decoding(seq.shape[0], seq.shape[1])
    logits, state = model.decode_step(seq[:, :T], state, attention_mask=mask)
    out = [logits]
    for t in range(T, seq.shape[1] - 1):
        logits, state = model.decode_step(seq[:, t : t + 1], state)
        out.append(logits)
    return torch.stack(out, 1).float()


#: (max, rms) of |logits - fp32 logits| over the fp32 logits' standard deviation. bf16 keeps 8
#: bits of mantissa (each rounding <= 2^-9 relative), measured 0.02-0.03 max / 0.005 rms over
#: seeds; int8 adds weights rounded to 1/254 of each output row's range: 0.035-0.05 / 0.01.
LOGIT_TOLERANCE = {"bf16": (0.06, 0.015), "int8": (0.1, 0.025)}


@torch.no_grad()
def test_bf16_and_int8_decoding_run_and_mostly_agree_with_fp32():
    """On fp32's greedy continuation, the bf16 and int8 (weights; bf16 activations) decoding
    paths give logits within :data:`LOGIT_TOLERANCE` of fp32's, the same next token at >= 95 %
    of positions, and their own greedy continuations share >= 90 % of fp32's tokens."""
    torch.manual_seed(0)
    model = _model("learned")
    idx, mask = _prompts()
    T = idx.shape[1]
    ref = generate(model, idx, 12, temperature=0, attention_mask=mask)
    ref_logits = _decoded_logits(model, ref, mask, T)
    scale = ref_logits.std()
    bf16 = _copy(model).to(torch.bfloat16)
    for name, m in (("bf16", bf16), ("int8", quantize_int8(_copy(model).to(torch.bfloat16)))):
        logits = _decoded_logits(m, ref, mask, T)
        err = (logits - ref_logits).abs() / scale
        max_tol, rms_tol = LOGIT_TOLERANCE[name]
        assert err.max() <= max_tol and err.pow(2).mean().sqrt() <= rms_tol, (name, err.max())
        assert (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean() >= 0.95, name
        out = generate(m, idx, 12, temperature=0, attention_mask=mask)
        assert out.shape == ref.shape and torch.equal(out[:, :T], idx)
        assert (out[:, T:] == ref[:, T:]).float().mean() >= 0.9, name
        state = m.start_decoding(3, 32)
        assert state.caches[0].k.dtype == torch.bfloat16  # caches follow the activations


# -- compiled training ---------------------------------------------------------------------------


def _toy_lm_task():
    text = "the quick brown fox jumps over the lazy dog; " * 60
    tok = CharTokenizer.train(text)
    ids = np.asarray(tok.encode(text), dtype=np.int64)
    return LMTask(ids, tok, LMTaskConfig(data="toy", seq_len=16, seed=0, vocab_size=tok.vocab_size))


@pytest.mark.slow
def test_compiled_training_with_inductor_matches_eager(tmp_path):
    """``TrainConfig(compile=True)``: the trainer's torch.compile (inductor: generated C++ on a
    CPU, no mocking) gives eager's losses within float tolerance, step after step."""
    task = _toy_lm_task()
    cfg = ModelConfig.preset(
        "tiny", vocab_size=task.vocab_size, max_seq_len=16, d_model=32, n_heads=2, n_layers=1
    )
    losses = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = DecoderLM(cfg)
        train_cfg = TrainConfig(
            steps=4,
            batch_size=4,
            lr=3e-3,
            warmup_steps=1,
            eval_every=4,
            eval_batches=1,
            log_every=1,
            compile=compiled,
            progress=False,
            device="cpu",
        )
        result = train(model, task, train_cfg, tmp_path / str(compiled))
        losses[compiled] = [r["loss"] for r in result.history if r.get("loss") is not None]
    assert len(losses[True]) == 4
    # same arithmetic up to the order of floating-point operations in the fused kernels
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-4, atol=1e-4)


# -- loading and the command line ------------------------------------------------------------------


@pytest.mark.slow
def test_load_and_generate_with_dtype_and_int8(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    args = ["--preset", "tiny", "--set", "d_model=32", "--set", "n_layers=1", "--seq-len", "32"]
    args += ["--batch-size", "4", "--max-chars", "20000", "--no-progress", "--warmup", "1"]
    assert main(["train", "lm", *args, "--steps", "2", "--out", str(run)]) == 0
    fp32 = attnlab.load(run)
    bf16 = attnlab.load(run, dtype="bfloat16")
    int8 = attnlab.load(run, quantize="int8")
    assert bf16.model.tok_emb.weight.dtype == torch.bfloat16
    assert isinstance(int8.model.lm_head, Int8Linear)
    assert int8.model.tok_emb.weight.dtype == torch.bfloat16  # int8 runs with bf16 activations
    assert attnlab.load(run, dtype="float32", quantize="int8").model.tok_emb.weight.dtype == (
        torch.float32
    )
    idx = torch.tensor([fp32.tokenizer.encode("def ")])
    with torch.no_grad():
        ref = fp32.model(idx)
        for loaded in (bf16, int8):
            rel = (loaded.model(idx).float() - ref).norm() / ref.norm()
            assert rel < INT8_RELATIVE_TOLERANCE
    capsys.readouterr()
    gen = ["generate", str(run), "--prompt", "def ", "-n", "5", "--temperature", "0"]
    for extra in (["--dtype", "bfloat16"], ["--quantize", "int8"]):
        assert main([*gen, *extra]) == 0
        assert capsys.readouterr().out.startswith("def ")
    assert main([*gen, "--compile", "--no-cache"]) == 2
    assert "drop --no-cache" in capsys.readouterr().err
    with pytest.raises(attnlab.errors.UserError, match="unknown quantization"):
        attnlab.load(run, quantize="int4")


@pytest.fixture
def fused(monkeypatch) -> list[int]:
    """A call record of torch's fused attention kernel (F.scaled_dot_product_attention)."""
    calls: list[int] = []
    real_sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real_sdpa(*a, **kw)
    )
    return calls


@pytest.mark.parametrize("bias_heads", [None, 1, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_one_unmasked_half_precision_query_is_the_formula_in_fp32(fused, dtype, bias_heads):
    """A decoding step over a growing cache in eager mode (one bf16/fp16 query, no mask) takes
    one_query_fp32 with the decode backend: no fused kernel, the float64 formula rounded once
    to the dtype, with GQA (2 query heads a key/value head) and an additive bias per head or
    shared by the heads."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 37, 16), torch.randn(2, 2, 37, 16)
    bias = None if bias_heads is None else torch.randn(1, bias_heads, 1, 37)
    half = None if bias is None else bias.to(dtype)
    got = scaled_dot_product_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), bias=half, is_causal=True, backend="decode"
    )
    assert got.dtype == dtype and got.shape == (2, 4, 1, 16) and not fused
    qd, kd, vd = (t.to(dtype).double() for t in (q, k, v))
    kd, vd = kd.repeat_interleave(2, dim=1), vd.repeat_interleave(2, dim=1)
    scores = (qd @ kd.transpose(-2, -1)) / 4.0
    if bias is not None:
        scores = scores + bias.to(dtype).double()
    want = (scores.softmax(-1) @ vd).to(dtype)
    assert (got.double() - want.double()).abs().max() <= 2 * want.double().abs().max() * 2**-8


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("Tq", [1, 5, FP32_QUERIES])
def test_one_half_precision_query_over_many_keys_is_the_formula_in_fp32(fused, dtype, Tq):
    """With the ``decode`` backend (attnlab.fast), a decoding step in bf16/fp16 over
    ≥ ONE_QUERY_FP32_FROM keys, or a verification of a few queries, runs the products in fp32 on
    a CPU (faster there): the outputs are the float64 formula's rounded once to the dtype, with
    GQA, a padding mask, an additive bias and a row with no allowed key. The default ``sdpa``
    backend takes torch's fused kernel, and so does ``decode`` for more queries."""
    torch.manual_seed(0)
    S = ONE_QUERY_FP32_FROM + 88
    q = torch.randn(3, 4, Tq, 16)
    k, v = torch.randn(3, 2, S, 16), torch.randn(3, 2, S, 16)
    mask = torch.rand(3, 1, 1, S) > 0.3
    mask[2] = False  # no key allowed: zeros, not NaN
    bias = torch.randn(1, 4, Tq, S)
    half = {"mask": mask, "bias": bias.to(dtype)}
    plain = scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), **half)
    assert len(fused) == 1  # the default path: torch's fused kernel, in the dtype
    got = scaled_dot_product_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), backend="decode", **half
    )
    assert got.dtype == dtype and len(fused) == 1  # the fp32 products, not the fused kernel
    qd, kd, vd = (t.to(dtype).double() for t in (q, k, v))
    kd, vd = kd.repeat_interleave(2, dim=1), vd.repeat_interleave(2, dim=1)
    scores = (qd @ kd.transpose(-2, -1)) / 4.0 + bias.to(dtype).double()
    want = scores.masked_fill(~mask, float("-inf")).softmax(-1).nan_to_num(0.0) @ vd
    torch.testing.assert_close(got.double(), want, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(plain.double(), want, atol=2e-2, rtol=2e-2)
    assert torch.equal(got[2], torch.zeros_like(got[2]))
    # fp32, or fewer keys: torch's fused kernel (one unmasked half-precision query excepted:
    # one_query_fp32, tests/test_fast_paths.py::test_one_unmasked_half_precision_query_...)
    scaled_dot_product_attention(q, k, v, mask=mask, backend="decode")
    short = scaled_dot_product_attention(
        q.to(dtype), k[:, :, :64].to(dtype), v[:, :, :64].to(dtype), backend="decode"
    )
    assert len(fused) == (2 if Tq == 1 else 3) and short.dtype == dtype
    many = torch.randn(3, 4, FP32_QUERIES + 1, 16).to(dtype)
    scaled_dot_product_attention(many, k.to(dtype), v.to(dtype), backend="decode")
    assert len(fused) == (3 if Tq == 1 else 4)  # more queries than a verification: fused

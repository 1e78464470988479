"""The fused output projection + cross-entropy (attnlab.fast.linear_cross_entropy)
against torch.nn.functional.cross_entropy over explicitly computed logits, and DecoderLM's
``targets=`` path, plain and with the LM task's ``head_loss=FusedLMLoss()``, against its
logits."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import ModelConfig
from attnlab.fast.loss import FusedLMLoss, LinearCEBuffer, linear_cross_entropy
from attnlab.layers.losses import cross_entropy
from attnlab.models.lm import DecoderLM


def _reference(h, W, y, b=None, eps=0.0, ignore=-100):
    z = h @ W.T + (0 if b is None else b)
    return F.cross_entropy(z.flatten(0, -2), y.flatten(), ignore_index=ignore, label_smoothing=eps)


@pytest.mark.parametrize("eps", [0.0, 0.15])
@pytest.mark.parametrize("with_bias", [False, True])
def test_loss_and_gradients_equal_cross_entropy_over_the_logits(eps, with_bias):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 7, 16, dtype=torch.double, generator=g, requires_grad=True)
    W = torch.randn(50, 16, dtype=torch.double, generator=g, requires_grad=True)
    b = torch.randn(50, dtype=torch.double, generator=g, requires_grad=True) if with_bias else None
    y = torch.randint(0, 50, (3, 7), generator=g)
    y[0, 2] = y[2, 6] = -100  # ignored positions
    inputs = [h, W] + ([b] if with_bias else [])
    fused = linear_cross_entropy(h, W, y, bias=b, label_smoothing=eps)
    ref = _reference(h, W, y, b, eps)
    torch.testing.assert_close(fused, ref, rtol=1e-12, atol=1e-12)
    # a non-unit upstream gradient (a loss scaled or summed with others)
    got = torch.autograd.grad(2.5 * fused, inputs)
    want = torch.autograd.grad(2.5 * ref, inputs)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # the loss-only path
        torch.testing.assert_close(linear_cross_entropy(h, W, y, bias=b, label_smoothing=eps), ref)


def test_every_target_ignored_gives_zero_loss_and_zero_gradients():
    h = torch.randn(4, 8, requires_grad=True)
    W = torch.randn(11, 8, requires_grad=True)
    loss = linear_cross_entropy(h, W, torch.full((4,), -100))
    loss.backward()
    assert loss.item() == 0.0
    assert h.grad.abs().max() == 0 and W.grad.abs().max() == 0


def test_large_logits_do_not_overflow():
    # logits of 1e4: exp would overflow in float32 without the per-row max
    h = torch.full((2, 4), 100.0, requires_grad=True)
    W = torch.stack([torch.full((4,), 25.0), torch.zeros(4), torch.full((4,), -25.0)])
    y = torch.tensor([0, 2])
    loss = linear_cross_entropy(h, W, y)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, _reference(h.detach(), W, y))
    loss.backward()
    assert torch.isfinite(h.grad).all()


def test_the_buffer_is_reused_between_steps_and_never_shared_by_live_graphs():
    torch.manual_seed(0)
    W = torch.randn(30, 8, requires_grad=True)
    buf = LinearCEBuffer()
    hs = [torch.randn(6, 8, requires_grad=True) for _ in range(3)]
    ys = [torch.randint(0, 30, (6,)) for _ in range(3)]
    # two graphs alive at once (two losses summed): each needs its own logits gradient
    total = linear_cross_entropy(hs[0], W, ys[0], buffer=buf) + linear_cross_entropy(
        hs[1], W, ys[1], buffer=buf
    )
    got = torch.autograd.grad(total, [hs[0], hs[1], W])
    want = torch.autograd.grad(
        _reference(hs[0], W, ys[0]) + _reference(hs[1], W, ys[1]), [hs[0], hs[1], W]
    )
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c)
    # after a backward the buffer comes back, and the next step writes into the same memory
    ptr = buf._free.data_ptr()
    loss = linear_cross_entropy(hs[2], W, ys[2], buffer=buf)
    assert buf._free is None  # lent to the graph
    loss.backward()
    assert buf._free.data_ptr() == ptr
    torch.testing.assert_close(
        hs[2].grad, torch.autograd.grad(_reference(hs[2], W, ys[2]), hs[2])[0]
    )


def test_a_graph_whose_buffer_was_reused_refuses_a_second_backward():
    # retain_graph, then a new step overwrites the returned buffer: autograd's version check
    # turns the stale gradient into an error instead of wrong numbers
    W = torch.randn(30, 8, requires_grad=True)
    buf = LinearCEBuffer()
    h = torch.randn(6, 8, requires_grad=True)
    loss = linear_cross_entropy(h, W, torch.randint(0, 30, (6,)), buffer=buf)
    loss.backward(retain_graph=True)
    linear_cross_entropy(h, W, torch.randint(0, 30, (6,)), buffer=buf)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_bad_shapes_and_settings_name_the_problem():
    h, W = torch.randn(2, 5, 8), torch.randn(30, 8)
    with pytest.raises(ValueError, match=r"targets of shape \(2, 5\)"):
        linear_cross_entropy(h, W, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"must be \(V, 8\)"):
        linear_cross_entropy(h, torch.randn(30, 7), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="one dtype"):
        linear_cross_entropy(h, W.double(), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="label_smoothing"):
        linear_cross_entropy(h, W, torch.zeros(2, 5, dtype=torch.long), label_smoothing=1.0)


# -- DecoderLM(idx, targets=...) ---------------------------------------------------------------


def _model(**overrides) -> DecoderLM:
    torch.manual_seed(0)
    cfg = ModelConfig.preset(
        "tiny", vocab_size=97, max_seq_len=16, d_model=32, n_heads=2, n_layers=2, **overrides
    )
    return DecoderLM(cfg)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("tied", [True, False])
def test_the_models_loss_equals_cross_entropy_of_its_logits_with_the_same_gradients(tied, fused):
    model = _model(tie_embeddings=tied)
    idx = torch.randint(0, 97, (3, 12))
    targets = torch.randint(0, 97, (3, 12))
    targets[1, :4] = -100
    ref_model = copy.deepcopy(model)
    head_loss = FusedLMLoss() if fused else None
    loss = model(idx, targets=targets, label_smoothing=0.1, head_loss=head_loss)
    ref = cross_entropy(ref_model(idx), targets, label_smoothing=0.1)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    loss.backward()
    ref.backward()
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    # the fused loss's buffer is memory kept by the loss, not state of the model
    if fused:
        assert head_loss.buffer._free is not None
        assert copy.deepcopy(head_loss).buffer._free is None
    assert not any("buffer" in k for k in model.state_dict())


def test_the_fused_loss_falls_back_to_the_logits_where_the_head_is_not_a_plain_linear():
    model = _model()
    fused = FusedLMLoss()
    idx, targets = torch.randint(0, 97, (2, 10)), torch.randint(0, 97, (2, 10))
    ref = cross_entropy(model(idx), targets)
    seen = []
    handle = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    torch.testing.assert_close(model(idx, targets=targets, head_loss=fused), ref)
    handle.remove()
    assert seen == [torch.Size([2, 10, 97])]  # the hook saw the logits: the unfused path ran
    assert fused.buffer._free is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(idx, targets=targets, head_loss=fused)
    torch.testing.assert_close(loss, ref, rtol=0.05, atol=0.05)  # bf16 logits
    with pytest.raises(ValueError, match="must have idx's shape"):
        model(idx, targets=targets[:, :5])
    with pytest.raises(ValueError, match="cannot be combined"):
        model(idx, targets=targets, logits_to_keep=1)

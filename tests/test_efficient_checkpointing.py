"""Activation checkpointing per Transformer block: same loss and gradients, fewer saved activations.

Checkpointing recomputes each block's forward during the backward pass instead of keeping its
activations; it must not change any number. Checked on the decoder LM (its
``activation_checkpointing`` config flag), with the exact ``math`` and ``tiled`` backends.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.models.lm import DecoderLM


def _loss_grads_and_saved(config: ModelConfig, state: dict | None, idx: torch.Tensor):
    torch.manual_seed(0)
    model = DecoderLM(config)
    if state is not None:
        model.load_state_dict(state)
    model.train()
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(idx[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return model.state_dict(), loss.detach(), grads, sum(saved)


@pytest.mark.parametrize(
    "backend,preset,overrides",
    [
        ("math", "tiny", {}),
        ("tiled", "llama-tiny", {"backend_options": {"block_q": 16, "block_k": 16}}),
        # dropout: the recomputed forward must draw the very same dropout masks
        ("math", "gpt2-tiny", {"dropout": 0.2, "attn_dropout": 0.2}),
    ],
)
def test_checkpointed_model_gets_the_same_gradients(backend, preset, overrides):
    base = ModelConfig.preset(preset, backend=backend, n_layers=3, max_seq_len=64, **overrides)
    ckpt = ModelConfig.from_dict({**base.to_dict(), "activation_checkpointing": True})
    idx = torch.randint(0, base.vocab_size, (2, 49))
    state, loss_a, grads_a, saved_a = _loss_grads_and_saved(base, None, idx)
    _, loss_b, grads_b, saved_b = _loss_grads_and_saved(ckpt, state, idx)
    torch.testing.assert_close(loss_b, loss_a, atol=0, rtol=0)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 0
    for name in grads_a:
        torch.testing.assert_close(
            grads_b[name], grads_a[name], atol=1e-6, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
        )
    # the point of it: the blocks' activations are not kept (only each block's input is)
    assert saved_b < saved_a / 2

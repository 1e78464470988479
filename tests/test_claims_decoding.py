"""The KV cache's claim, counted: with the cache a decode step costs the same at every context
length except for its attention term, 2·2·n_layers·(n_heads·head_dim)·S multiply-adds for the
S keys it attends to (q·Kᵀ and weights·V, one query); recomputing the window instead costs the
whole forward over S tokens, which grows linearly in S (plus the S² attention term).

FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` (2 per multiply-add of every
matmul) on the ``math`` backend, whose bmm's the counter sees on CPU (it does not count
``torch.nn.functional.scaled_dot_product_attention``'s CPU kernel for a single query).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from attnlab.config import ModelConfig
from attnlab.models.lm import DecoderLM

CONTEXTS = (16, 32, 64, 128)


def _flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _linear_weights(module: nn.Module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


def _step_costs(model: DecoderLM, S: int) -> tuple[int, int]:
    """FLOPs of producing the next token with S tokens of context: (cached step, recomputation)."""
    idx = torch.randint(0, model.config.vocab_size, (1, S))
    with torch.no_grad():
        state = model.start_decoding(1, S)
        _, state = model.decode_step(idx[:, :-1], state)  # the earlier S − 1 tokens are cached
        cached = _flops(lambda: model.decode_step(idx[:, -1:], state))
        recomputed = _flops(lambda: model(idx, logits_to_keep=1))
    return cached, recomputed


@pytest.mark.parametrize(
    "preset,overrides",
    [("tiny", {}), ("llama-tiny", {}), ("tiny", {"position": "rope", "n_layers": 3})],
)
def test_kv_cache_step_is_flat_in_the_context_but_for_attention_and_recomputation_grows(
    preset, overrides
):
    torch.manual_seed(0)
    cfg = ModelConfig.preset(preset, backend="math", max_seq_len=128, **overrides)
    model = DecoderLM(cfg).eval()
    L, d_attn = cfg.n_layers, cfg.n_heads * cfg.head_dim
    per_token = 2 * _linear_weights(model.blocks)  # projections and FFN, one token
    head = 2 * model.lm_head.weight.numel()  # logits of the last position only
    for S in CONTEXTS:
        cached, recomputed = _step_costs(model, S)
        attention = 2 * 2 * L * d_attn * S  # q·Kᵀ and weights·V over S keys, every layer
        assert cached == per_token + head + attention, (S, cached)
        # no cache: every block runs on all S tokens; math attention forms the full S×S scores
        assert recomputed == per_token * S + head + 2 * 2 * L * d_attn * S * S, (S, recomputed)
    # the claim in words: x8 context -> the cached step grows only by its attention term, while
    # the recomputation costs more than 8x as much
    c16, r16 = _step_costs(model, 16)
    c128, r128 = _step_costs(model, 128)
    assert c128 - c16 == 2 * 2 * L * d_attn * (128 - 16)
    assert c128 / c16 < 1.5 and r128 / r16 > 8
    assert r128 / c128 > 60  # the cache's saving at S = 128 for this small model

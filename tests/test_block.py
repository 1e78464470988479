"""TransformerBlock: pre/post-norm composition, parity with torch's encoder and decoder layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.attention import (
    capture_attention,
    collect_aux_losses,
    key_padding_mask,
    padding_mask,
)
from attnlab.models.builders import transformer_block

ATOL = 1e-5
B, T, S, C, H, FF = 2, 6, 5, 16, 4, 40


def _randomise_norms(module: nn.Module) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.normal_()


@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"norm": "rmsnorm", "ffn": "swiglu", "position": "rope", "n_kv_heads": 2, "bias": False},
        {"ffn": "moe", "n_experts": 4, "top_k": 2, "position": "alibi", "qk_norm": "rmsnorm"},
    ],
)
def test_block_is_the_pre_or_post_norm_composition(norm_position, options):
    block = transformer_block(C, H, norm_position=norm_position, **options).eval()
    _randomise_norms(block)
    x = torch.randn(B, T, C)

    def attn(h):
        return block.attn(h, is_causal=True)[0]

    if norm_position == "pre":  # x + Sublayer(Norm(x))
        h = x + attn(block.norm1(x))
        expected = h + block.ffn(block.norm2(h))
    else:  # Norm(x + Sublayer(x))
        h = block.norm1(x + attn(x))
        expected = block.norm2(h + block.ffn(h))
    torch.testing.assert_close(block(x, is_causal=True), expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_block_without_residuals_is_the_composition_without_skips(norm_position):
    block = transformer_block(C, H, norm_position=norm_position, residual=False).eval()
    _randomise_norms(block)
    x = torch.randn(B, T, C)

    def attn(h):
        return block.attn(h, is_causal=True)[0]

    if norm_position == "pre":  # Sublayer(Norm(x))
        expected = block.ffn(block.norm2(attn(block.norm1(x))))
    else:  # Norm(Sublayer(x))
        expected = block.norm2(block.ffn(block.norm1(attn(x))))
    torch.testing.assert_close(block(x, is_causal=True), expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_residual_flag_changes_only_the_skip_additions(norm_position):
    """``residual=True`` is the default block, bit for bit; ``False`` has the same parameters
    (names and seeded values) and differs only by the input added back."""
    blocks = {}
    for residual in (None, True, False):
        torch.manual_seed(0)
        kw = {} if residual is None else {"residual": residual}
        blocks[residual] = transformer_block(C, H, norm_position=norm_position, **kw).eval()
    x = torch.randn(B, T, C)
    states = [b.state_dict() for b in blocks.values()]
    assert all(s.keys() == states[0].keys() for s in states)
    assert all(torch.equal(s[k], states[0][k]) for s in states for k in s)
    default, same, without = (blocks[k](x, is_causal=True) for k in (None, True, False))
    assert torch.equal(default, same)
    assert (without - default).abs().max() > 0.1


def _copy_mha(ours, ref: nn.MultiheadAttention) -> None:
    E = ref.embed_dim
    with torch.no_grad():
        if hasattr(ours, "qkv"):
            ours.qkv.weight.copy_(ref.in_proj_weight)
            ours.qkv.bias.copy_(ref.in_proj_bias)
        else:
            ours.q_proj.weight.copy_(ref.in_proj_weight[:E])
            ours.q_proj.bias.copy_(ref.in_proj_bias[:E])
            ours.kv_proj.weight.copy_(ref.in_proj_weight[E:])
            ours.kv_proj.bias.copy_(ref.in_proj_bias[E:])
        ours.out_proj.load_state_dict(ref.out_proj.state_dict())


def _copy_common(block, ref) -> None:
    _copy_mha(block.attn, ref.self_attn)
    block.ffn.fc1.load_state_dict(ref.linear1.state_dict())
    block.ffn.fc2.load_state_dict(ref.linear2.state_dict())
    block.norm1.load_state_dict(ref.norm1.state_dict())


def _torch_causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).triu(1)  # torch: True = not allowed


@pytest.mark.parametrize("norm_first", [False, True])
def test_self_attention_block_equals_torch_encoder_layer(norm_first):
    ref = nn.TransformerEncoderLayer(
        C, H, FF, dropout=0.0, activation="relu", batch_first=True, norm_first=norm_first
    )
    _randomise_norms(ref)
    ref.train()  # dropout is 0; training mode keeps torch off its fused inference fast path
    block = transformer_block(
        C,
        H,
        ffn="mlp",
        ffn_hidden=FF,
        activation="relu",
        norm="layernorm",
        norm_eps=ref.norm1.eps,
        norm_position="pre" if norm_first else "post",
    )
    _copy_common(block, ref)
    block.norm2.load_state_dict(ref.norm2.state_dict())
    x = torch.randn(B, T, C)
    real = padding_mask([6, 4], T)
    expected = ref(x, src_mask=_torch_causal(T), src_key_padding_mask=~real)
    out = block(x, mask=key_padding_mask(real), is_causal=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=ATOL)
    expected = ref(x)  # bidirectional, no padding
    torch.testing.assert_close(block(x), expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cross_attention_block_equals_torch_decoder_layer(norm_first):
    ref = nn.TransformerDecoderLayer(
        C, H, FF, dropout=0.0, activation="relu", batch_first=True, norm_first=norm_first
    )
    _randomise_norms(ref)
    ref.train()
    block = transformer_block(
        C,
        H,
        ffn="mlp",
        ffn_hidden=FF,
        activation="relu",
        norm="layernorm",
        norm_eps=ref.norm1.eps,
        norm_position="pre" if norm_first else "post",
        cross_attention=True,
    )
    _copy_common(block, ref)
    _copy_mha(block.cross_attn, ref.multihead_attn)
    block.norm_cross.load_state_dict(ref.norm2.state_dict())  # torch: norm2 follows cross-attn
    block.norm2.load_state_dict(ref.norm3.state_dict())
    x, memory = torch.randn(B, T, C), torch.randn(B, S, C)
    real = padding_mask([5, 3], S)
    expected = ref(x, memory, tgt_mask=_torch_causal(T), memory_key_padding_mask=~real)
    with capture_attention(block) as maps:
        out = block(x, is_causal=True, context=memory, context_mask=key_padding_mask(real))
    torch.testing.assert_close(out, expected, rtol=0, atol=ATOL)
    # the weights of this call are reported to the capture, not kept on the block
    assert maps["attn"].shape == (B, H, T, T) and maps["cross_attn"].shape == (B, H, T, S)
    assert (maps["cross_attn"][1, :, :, 3:] == 0).all()
    assert (maps["attn"].triu(1) == 0).all()  # causal
    assert not hasattr(block, "attn_weights") and not hasattr(block, "cross_weights")


def test_decoder_block_with_caches_equals_full_pass():
    block = transformer_block(
        C, H, position="rope", cross_attention=True, context_dim=12, norm_position="pre"
    ).eval()
    x, memory = torch.randn(B, T, C), torch.randn(B, S, 12)
    full = block(x, is_causal=True, context=memory)
    cache, cross_cache = block.attn.make_cache(B, T), block.cross_attn.make_cache(B, S)
    steps = [
        block(
            x[:, t : t + 1],
            is_causal=True,
            cache=cache,
            cross_cache=cross_cache,
            context=memory if t == 0 else None,
        )
        for t in range(T)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=ATOL)


def test_residual_dropout_only_in_training():
    block = transformer_block(C, H, dropout=0.5)
    x = torch.randn(B, T, C)
    block.eval()
    torch.testing.assert_close(block(x), block(x))
    block.train()
    assert not torch.allclose(block(x), block(x))


def test_block_errors():
    with pytest.raises(ValueError, match="'middle'"):
        transformer_block(C, H, norm_position="middle")
    with pytest.raises(ValueError, match="'conv'"):
        transformer_block(C, H, ffn="conv")
    with pytest.raises(ValueError, match="context"):
        transformer_block(C, H, cross_attention=True)(torch.randn(B, T, C))
    with pytest.raises(ValueError, match=r"d_model \(16\).*n_heads \(3\)"):
        transformer_block(C, 3)


@pytest.mark.parametrize(
    "options",
    [
        {"norm_position": "post", "cross_attention": True, "context_dim": 12},
        {"ffn": "swiglu", "norm": "rmsnorm", "qk_norm": "layernorm", "position": "rope"},
        {"ffn": "moe", "n_experts": 4, "top_k": 2, "activation": "silu", "position": "alibi"},
    ],
)
def test_every_parameter_gets_a_finite_gradient(options):
    block = transformer_block(C, H, **options)
    context = torch.randn(B, S, 12) if options.get("cross_attention") else None
    with collect_aux_losses() as aux:
        out = block(torch.randn(B, 16, C), is_causal=True, context=context)
    loss = out.pow(2).mean() + aux.total()  # MoE: its router trains through the aux loss
    loss.backward()
    for name, p in block.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name

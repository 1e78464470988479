"""The causal dilated-convolution LM: causality (no output reads a later token), the receptive
field R = 1 + Σ (k − 1)·d against the model itself (a token R − 1 back changes the output, one R
back does not), the config's checks, and the registry round trip."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError, ConvLMConfig
from attnlab.layers.causal_conv import CausalConv1d
from attnlab.models.conv_lm import CausalConvLM
from attnlab.models.registry import build_model
from attnlab.runspec import resolve

V = 11


def _model(**kw) -> CausalConvLM:
    torch.manual_seed(0)
    return CausalConvLM(ConvLMConfig(vocab_size=V, max_seq_len=64, width=16, **kw)).eval()


@pytest.mark.parametrize(
    ("kernel_size", "dilations", "by_hand"),
    [(3, (1, 2, 4, 8), 31), (2, (1, 1, 3), 6), (5, (1,), 5), (1, (1, 2), 1)],
)
def test_receptive_field_is_one_plus_the_sum_of_k_minus_1_times_d(kernel_size, dilations, by_hand):
    cfg = ConvLMConfig(kernel_size=kernel_size, dilations=dilations)
    assert cfg.receptive_field == by_hand  # 1 + Σ (k − 1)·d, summed by hand
    assert CausalConvLM(cfg).receptive_field == by_hand


def test_changing_later_tokens_leaves_earlier_logits_unchanged():
    model = _model(kernel_size=3, dilations=(1, 2, 4))
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, V, (3, 40), generator=g)
    with torch.no_grad():
        base = model(idx)
        for t0 in (0, 7, 39):
            other = idx.clone()
            other[:, t0:] = torch.randint(0, V, other[:, t0:].shape, generator=g)
            changed = model(other)
            assert torch.equal(changed[:, :t0], base[:, :t0])
            assert not torch.equal(changed[:, t0:], base[:, t0:])  # the later ones do read them


@pytest.mark.parametrize(("kernel_size", "dilations"), [(3, (1, 2, 4)), (2, (1, 1, 3))])
def test_the_output_reads_exactly_the_last_r_tokens(kernel_size, dilations):
    """A token exactly R − 1 back changes the output at t; R back (and earlier) does not."""
    model = _model(kernel_size=kernel_size, dilations=dilations)
    R = model.receptive_field
    T, t = 40, 35
    idx = torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        base = model(idx)[0, t]

        def at(back: int) -> torch.Tensor:
            other = idx.clone()
            other[0, t - back] = (other[0, t - back] + 1) % V
            return model(other)[0, t]

        assert not torch.allclose(at(R - 1), base, atol=1e-6)
        for back in range(R, t + 1):
            assert torch.equal(at(back), base)


def test_causal_conv_is_the_sum_over_taps_with_zeros_before_the_start():
    torch.manual_seed(3)
    conv = CausalConv1d(2, 3, kernel_size=3, dilation=2)
    x = torch.randn(1, 9, 2)
    w, b = conv.conv.weight, conv.conv.bias  # (C_out, C_in, k)
    # y_t = b + Σ_j W_{k−1−j} x_{t − j·d}: torch's taps run oldest first
    rows = [
        b + sum(w[:, :, 2 - j] @ x[0, t - 2 * j] for j in range(3) if t - 2 * j >= 0)
        for t in range(9)
    ]
    want = torch.stack(rows)
    torch.testing.assert_close(conv(x)[0], want)


def test_config_checks_and_registry_round_trip():
    with pytest.raises(ConfigError, match="dilations must name at least one layer"):
        ConvLMConfig(dilations=())
    with pytest.raises(ConfigError, match="every dilation must be a positive integer"):
        ConvLMConfig(dilations=(1, 0))
    cfg = ConvLMConfig.preset("tiny", vocab_size=V)
    again = ConvLMConfig.from_dict(cfg.to_dict())  # JSON lists back to a tuple
    assert again == cfg and again.dilations == (1, 2, 4, 8)
    model = build_model("conv_lm", cfg.to_dict())
    assert isinstance(model, CausalConvLM) and model.kind == "conv_lm"
    spec = resolve(None, {"train.steps": 5, "kind": "conv_lm"}, [])  # train lm --arch conv
    assert spec.kind == "conv_lm" and not spec.auto and spec.model["width"] == 64  # tiny


def test_padded_batches_are_refused():
    with pytest.raises(ValueError, match="does not support padded batches"):
        _model()(torch.zeros(1, 4, dtype=torch.long), attention_mask=torch.tensor([[0, 1, 1, 1]]))

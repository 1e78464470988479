"""Scheduled sampling (Bengio et al. 2015): training a decoder on its own predictions.

Teacher forcing trains every step on the gold prefix, while at test time the decoder reads its own
outputs; the mismatch is *exposure bias*. Scheduled sampling feeds, at training step i, the gold
previous token with probability ε_i (:meth:`ScheduledSamplingConfig.gold_probability`: linear,
exponential or inverse-sigmoid decay) and the model's own greedy prediction otherwise. The targets
stay the gold tokens, so the model learns to continue correctly from a prefix it got wrong.

"The model's own prediction" is made in one of two ways:

- stepwise (RNNs): the recurrence is stepped anyway, so step t reads the argmax of step t-1's
  logits in the same pass (``model(src, src_mask, tgt_in, gold_mask=...)``);
- two passes (the Transformer, whose decoder reads all positions at once in training): a
  teacher-forced pass without gradient predicts every position, then a second pass on the mixed
  input gives the logits that are trained (Mihaylova & Martins 2019).

Shape legend: B batch, T target length, V target vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config.translation import ScheduledSamplingConfig

__all__ = ["draw_gold_mask", "mix_inputs", "decoder_inputs", "uses_stepwise"]


def draw_gold_mask(shape: tuple[int, int], gold_prob: float, *, seed: int) -> Tensor:
    """Where to feed the gold token: ``(B, T)`` bool, True with probability ``gold_prob``.

    Column 0 (``<start>``) is always True. Drawn on the CPU from ``seed``, so a batch's mask is
    the same on every device and after a resume.
    """
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) < gold_prob  # (B, T)
    mask[:, 0] = True
    return mask


def mix_inputs(tgt_in: Tensor, logits: Tensor, gold_mask: Tensor) -> Tensor:
    """Decoder inputs with the model's greedy predictions where ``gold_mask`` is False.

    Args:
        tgt_in: ``(B, T)`` gold inputs ``<start> y_1 … y_{T-1}``.
        logits: ``(B, T, V)`` of a teacher-forced pass: position t predicts input t+1.
        gold_mask: ``(B, T)`` bool.

    Returns:
        ``(B, T)``: ``tgt_in[:, t]`` where ``gold_mask[:, t]``, else ``argmax logits[:, t-1]``.
    """
    own = logits.argmax(-1)  # (B, T): own[:, t] is the model's guess of tgt_in[:, t + 1]
    mixed = tgt_in.clone()
    mixed[:, 1:] = torch.where(gold_mask[:, 1:], tgt_in[:, 1:], own[:, :-1])
    return mixed


def uses_stepwise(config: ScheduledSamplingConfig, model: nn.Module) -> bool:
    """Whether ``model`` is fed its predictions step by step (else in two passes).

    Raises:
        ValueError: ``scheme="stepwise"`` for a model whose decoder is not recurrent.
    """
    recurrent = bool(getattr(model, "recurrent", False))
    if config.scheme == "stepwise" and not recurrent:
        raise ValueError(
            f"scheduled sampling scheme 'stepwise' needs a recurrent decoder; "
            f"{type(model).__name__} reads all positions at once: use 'two_pass' or 'auto'"
        )
    return config.scheme == "stepwise" or (config.scheme == "auto" and recurrent)


def decoder_inputs(
    model: nn.Module,
    core: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    tgt_in: Tensor,
    gold_mask: Tensor,
    config: ScheduledSamplingConfig,
) -> tuple[Tensor, dict]:
    """The decoder input and forward keywords of a scheduled-sampling training pass.

    Call ``model(src, src_mask, inputs, **kwargs)`` with the result. Stepwise: the gold inputs
    and ``gold_mask`` (the model mixes as it steps). Two passes: this runs the teacher-forced
    pass without gradient and returns the mixed inputs.

    Args:
        model: the model as the trainer calls it (may be wrapped by DDP / ``torch.compile``).
        core: the unwrapped model (its ``recurrent`` flag).
    """
    if uses_stepwise(config, core):
        return tgt_in, {"gold_mask": gold_mask}
    with torch.no_grad():
        first = model(src, src_mask, tgt_in)  # (B, T, V)
    return mix_inputs(tgt_in, first, gold_mask), {}

"""The logit lens and direct logit attribution: read the residual stream through the model's head.

- **Logit lens** (nostalgebraist 2020): apply the final norm and the output head to the residual
  stream entering each block, and after the last; the last of these *is* the model's output.
- **Direct logit attribution**: with the final norm's scale σ frozen at its value in the run,
  the logit of a token is a sum over what each part wrote into the residual stream (the
  embeddings, each head through its slice of W_O, each MLP), plus the biases:

      logit(x) = Σ_c ((c − mean c) / σ) ⊙ γ · W_U[x]  +  β · W_U[x]         (LayerNorm)

  so the parts' contributions add up to the logit exactly (pre-norm stacks; RMSNorm drops the
  mean and β).

Shape legend: B batch, T time, C d_model, V vocabulary, L blocks, H heads, D head dim.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnlab.inspect.families import readout, stack_of
from attnlab.inspect.hooks import run_with_cache
from attnlab.layers.block import LayerNorm, RMSNorm
from attnlab.layers.hook import hook_name

__all__ = ["direct_logit_attribution", "logit_lens"]


def logit_lens(model: nn.Module, inputs: Any, **kwargs: Any) -> Tensor:
    """The output the head would give from the residual stream before each block and after the
    last: ``(L + 1, *output shape)``; entry ``L`` equals the model's output.

    Args:
        model: a family with one residual stream read by a head (LM, MLM, translation decoder,
            ViT, captioner, VQA).
        inputs: a tensor or a tuple of the forward's positional arguments.

    Raises:
        ValueError: a family without such a stream (RNNs, Swin).
    """
    stack_name, head = readout(model)
    s = stack_of(model, stack_name)
    names = [s.hook(i, "hook_resid_pre") for i in range(len(s))]
    names.append(s.hook(len(s) - 1, "hook_resid_post"))
    with torch.no_grad():
        _, cache = run_with_cache(model, inputs, names=names, **kwargs)
        return torch.stack([head(model, cache[n], inputs) for n in names])


# the model-level embedding hook points (the decoder's, in translation)
_EMBEDS = ("hook_embed", "hook_tgt_embed", "hook_pos_embed")

# class name -> (final norm attribute, unembedding attribute, stack)
_HEADS = {
    "DecoderLM": ("norm_f", "lm_head", "blocks"),
    "Seq2SeqTransformer": ("dec_norm", "lm_head", "decoder"),
    "TransformerCaptioner": ("norm_f", "head", "blocks"),
}


def direct_logit_attribution(
    model: nn.Module, inputs: Any, targets: Tensor | None = None
) -> dict[str, Tensor]:
    """Each part's direct contribution to the logit of ``targets``.

    Args:
        model: a decoder with a pre-norm stack and a linear head (LM, translation, captioner).
        inputs: a tensor or a tuple of the forward's positional arguments.
        targets: ``(B, T)`` token ids whose logits are explained (default: the argmax).

    Returns:
        ``{part: (B, T)}`` with parts ``embed`` (token and absolute position embeddings),
        ``{block}.attn.head{h}`` per head, ``{block}.attn.bias`` (W_O's bias), ``{block}.mlp``
        (and ``{block}.cross_attn.head{h}`` in decoders with cross-attention), and ``bias`` (the
        norm's β and the head's bias); they sum to the logits of ``targets``.

    Raises:
        ValueError: another family, or a post-norm stack (its norms sit between the parts).
    """
    kind = type(model).__name__
    if kind not in _HEADS:
        raise ValueError(f"direct logit attribution works for {sorted(_HEADS)}, not {kind}")
    norm_attr, head_attr, stack_name = _HEADS[kind]
    s = stack_of(model, stack_name)
    norm, head = getattr(model, norm_attr), getattr(model, head_attr)
    if not isinstance(norm, LayerNorm | RMSNorm):
        raise ValueError(
            "direct logit attribution needs a pre-norm stack with a final norm; this model's "
            "blocks are post-norm, so their norms sit between the parts"
        )
    attns = ["attn", "cross_attn"] if s.cross else ["attn"]
    final = s.hook(len(s) - 1, "hook_resid_post")
    scale_name = f"{_hook_prefix(model, norm)}.hook_scale"
    with torch.no_grad():
        logits, cache = run_with_cache(
            model,
            inputs,
            names=lambda n: (
                n == final
                or n == scale_name
                or n in _EMBEDS
                or n.endswith(".hook_mlp_out")
                or any(n.endswith(f".{a}.hook_z") for a in attns)
            ),
        )
        if targets is None:
            targets = logits.argmax(-1)
        w_u = head.weight[targets]  # (B, T, C)
        sigma = cache[scale_name]  # (B, T, 1)
        gamma = norm.weight

        def project(c: Tensor) -> Tensor:  # a residual-stream write (B, T, C) -> (B, T)
            if isinstance(norm, LayerNorm):
                c = c - c.mean(-1, keepdim=True)
            return ((c / sigma) * gamma * w_u).sum(-1)

        parts: dict[str, Tensor] = {}
        embed = sum(cache[n] for n in cache if n in _EMBEDS)  # (B, T, C)
        parts["embed"] = project(embed)
        for block in s.blocks:
            module = model.get_submodule(_module_path(model, block))
            for a in attns:
                attn = getattr(module, a)
                z = cache[f"{block}.{a}.hook_z"]  # (B, T, H, D)
                H, D = z.shape[-2], z.shape[-1]
                w_o = attn.out_proj.weight.view(-1, H, D)  # (C, H, D)
                per_head = torch.einsum("bthd,chd->bthc", z, w_o)  # (B, T, H, C)
                for h in range(H):
                    parts[f"{block}.{a}.head{h}"] = project(per_head[:, :, h])
                if attn.out_proj.bias is not None:
                    parts[f"{block}.{a}.bias"] = project(attn.out_proj.bias.expand_as(embed))
            parts[f"{block}.mlp"] = project(cache[f"{block}.hook_mlp_out"])
        bias = torch.zeros_like(parts["embed"])
        if isinstance(norm, LayerNorm) and norm.bias is not None:
            bias = bias + (norm.bias * w_u).sum(-1)
        if getattr(head, "bias", None) is not None:
            bias = bias + head.bias[targets]
        parts["bias"] = bias
    return parts


def _module_path(model: nn.Module, hook_prefix: str) -> str:
    for path, _ in model.named_modules():
        if hook_name(path) == hook_prefix:
            return path
    raise ValueError(f"no module at {hook_prefix!r}")


def _hook_prefix(model: nn.Module, module: nn.Module) -> str:
    for path, m in model.named_modules():
        if m is module:
            return hook_name(path)
    raise ValueError("module not in model")

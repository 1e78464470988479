"""What inspection needs to know about each family: its stacks of blocks, which are causal, and
how a residual stream becomes the model's output (for the logit lens).

A *stack* is a list of Transformer blocks sharing one residual stream, named by the path of the
list: ``blocks`` (LM, MLM, ViT, captioner, VQA), ``encoder`` / ``decoder`` (translation),
``stages.{s}.blocks`` (Swin, whose blocks sit at ``stages.{s}.blocks.{i}.block``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.layers.block import TransformerBlock
from attnlab.layers.hook import hook_name

__all__ = ["Stack", "causal_stacks", "find_stacks", "readout", "stack_of"]

# class name -> stacks whose self-attention is causal
_CAUSAL = {
    "DecoderLM": {"blocks"},
    "Seq2SeqTransformer": {"decoder"},
    "T5": {"decoder"},
    "T5SpanModel": {"decoder"},
    "TransformerCaptioner": {"blocks"},
}


@dataclass
class Stack:
    """A list of blocks on one residual stream.

    Attributes:
        name: the list's path (``blocks``, ``decoder``, ``stages.1.blocks``).
        blocks: each block's hook prefix (``blocks.0``, ``stages.1.blocks.0.block``).
        n_heads: heads of the blocks' self-attention.
        causal: whether the self-attention is causal.
        cross: whether the blocks have cross-attention.
    """

    name: str
    blocks: list[str]
    n_heads: int
    causal: bool
    cross: bool

    def hook(self, layer: int, suffix: str) -> str:
        """Hook name of ``suffix`` in block ``layer`` (``hook_resid_pre``, ``attn.hook_z``)."""
        return f"{self.blocks[layer]}.{suffix}"

    def __len__(self) -> int:
        return len(self.blocks)


def causal_stacks(model: nn.Module) -> set[str]:
    """Names of the stacks of ``model`` whose self-attention is causal."""
    return set(_CAUSAL.get(type(model).__name__, set()))


def find_stacks(model: nn.Module) -> dict[str, Stack]:
    """Every stack of Transformer blocks in ``model``, by name, in module order."""
    causal = causal_stacks(model)
    stacks: dict[str, Stack] = {}
    for path, module in model.named_modules():
        if not isinstance(module, TransformerBlock):
            continue
        name = re.sub(r"\.\d+(\.block)?$", "", path)
        if name not in stacks:
            stacks[name] = Stack(
                name, [], module.attn.n_heads, name in causal, bool(module.has_cross)
            )
        stacks[name].blocks.append(hook_name(path))
    return stacks


def stack_of(model: nn.Module, name: str | None = None) -> Stack:
    """The stack called ``name`` (default: the model's only one, or the one that produces the
    output: ``decoder`` for translation, the last stage for Swin).

    Raises:
        ValueError: a model without blocks, or an unknown stack name.
    """
    stacks = find_stacks(model)
    if not stacks:
        raise ValueError(
            f"{type(model).__name__} has no Transformer blocks (no residual stream to inspect "
            "by layer); its hook points still work with run_with_cache / run_with_hooks"
        )
    if name is None:
        name = "decoder" if "decoder" in stacks else list(stacks)[-1]
    if name not in stacks:
        raise ValueError(f"unknown stack {name!r}; this model has {list(stacks)}")
    return stacks[name]


Readout = Callable[[nn.Module, Tensor, Any], Tensor]

_READOUTS: dict[str, tuple[str, Readout]] = {
    "DecoderLM": ("blocks", lambda m, x, inputs: m.lm_head(m.norm_f(x))),
    "EncoderMLM": ("blocks", lambda m, x, inputs: m.head(m.norm_f(x))),
    "Seq2SeqTransformer": ("decoder", lambda m, x, inputs: m.lm_head(m.dec_norm(x))),
    # T5: the head scales the decoder output by d_model^-1/2 first (1.0)
    "T5": ("decoder", lambda m, x, inputs: m.head(m.dec_norm(x))),
    "T5SpanModel": ("decoder", lambda m, x, inputs: m.head(m.dec_norm(x))),
    "TransformerCaptioner": ("blocks", lambda m, x, inputs: m.head(m.norm_f(x))),
    "VisionTransformer": ("blocks", lambda m, x, inputs: m.head(m.pool(m.norm(x)))),
    "TransformerVQA": ("blocks", lambda m, x, inputs: m.head(_vqa_pool(m.norm_f(x), inputs))),
}


def _vqa_pool(x: Tensor, inputs: Any) -> Tensor:
    lengths = inputs[2]
    real = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]  # (B, L)
    return (x * real[..., None]).sum(1) / lengths[:, None].to(x.dtype)  # (B, D)


def readout(model: nn.Module) -> tuple[str, Readout]:
    """``(stack name, fn(model, resid, inputs) -> output)``: the head applied to a residual
    stream, as the model applies it to its last block's output.

    Raises:
        ValueError: a family without one residual stream ending in the output (RNNs, Swin,
            whose stages change width and work in windows).
    """
    kind = type(model).__name__
    if kind not in _READOUTS:
        raise ValueError(
            f"the logit lens needs one residual stream that the head reads; {kind} has none "
            f"(it works for {sorted(_READOUTS)})"
        )
    return _READOUTS[kind]

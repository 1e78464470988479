"""What every Hugging Face family provides, and the one conversion path they all go through.

A family module (:mod:`~attnlab.interop.hf.lm`, :mod:`~attnlab.interop.hf.vision`,
:mod:`~attnlab.interop.hf.bert`) declares, per architecture, a :class:`Family` for reading
(config translation, the attnlab model to build, the :class:`~attnlab.interop.keymap.KeyMap`) and
an ``export`` function for writing (``model -> (config.json dict, KeyMap)``). The key map is the
only place where names and layouts are written down; both directions come from it:

- reading: ``expected = keymap.to_theirs(shapes of the model built from config.json)`` is checked
  against the checkpoint's names and shapes before any tensor is read, then
  ``model.load_state_dict(keymap.to_ours(tensors))``;
- writing: ``keymap.to_theirs(model.state_dict())``.

Also here: the pieces of config translation several families share (activation names, settings a
Hugging Face block cannot express).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.checkpoint_check import Header, build_on_meta, explain
from attnlab.errors import UserError
from attnlab.interop.keymap import KeyMap, check_shapes

__all__ = [
    "Family",
    "HF_ACTIVATIONS",
    "TO_HF_ACTIVATION",
    "hf_activation",
    "get",
    "require",
    "require_plain_heads",
    "prepare",
    "check_config",
    "expected_shapes",
    "load_weights",
    "model_from_state_dict",
    "params_to",
    "names_without",
]

#: Hugging Face ``hidden_act`` / ``activation_function`` -> attnlab's activation name.
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "relu2": "relu2",
    "quick_gelu": "quick_gelu",
}
#: attnlab's activation -> the Hugging Face name written to config.json.
TO_HF_ACTIVATION = {
    "gelu": "gelu",
    "gelu_tanh": "gelu_new",
    "relu": "relu",
    "silu": "silu",
    "relu2": "relu2",  # transformers' ReLUSquaredActivation
    "quick_gelu": "quick_gelu",
}


@dataclass(frozen=True)
class Family:
    """How to read one Hugging Face architecture family.

    Attributes:
        name: the family (``gpt2``, ``vit``...), also its ``model_type`` in config.json.
        architectures: the ``architectures[0]`` values it reads.
        config_from_hf: ``(config.json dict, tensor names) -> attnlab config``; the names decide
            what config.json does not say (a classification head, a pooler).
        build: ``config -> attnlab model``.
        keymap: ``(config.json dict, attnlab config, tensor names) -> KeyMap``; the names choose
            between layouts (Mixtral's experts, a ``vit.`` prefix).
        model_types: config.json ``model_type`` values the family answers for whatever the
            architecture (it then refuses the heads it lacks by name); a config without
            ``architectures`` is matched on ``name``.
    """

    name: str
    architectures: tuple[str, ...]
    config_from_hf: Callable[[dict, Collection[str]], Any]
    build: Callable[[Any], nn.Module]
    keymap: Callable[[dict, Any, Collection[str]], KeyMap]
    model_types: tuple[str, ...] = ()


# ---- shared config translation ------------------------------------------------------------------


def hf_activation(name: str, what: str = "hidden_act") -> str:
    """attnlab's activation for a Hugging Face one.

    Raises:
        UserError: an activation attnlab does not have.
    """
    if name not in HF_ACTIVATIONS:
        raise UserError(f"{what} {name!r} is not supported; supported: {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[name]


def get(hf: Mapping, *names: str, default: Any = None) -> Any:
    """The first of ``names`` that config.json sets (not null), else ``default`` (aliases)."""
    for n in names:
        if hf.get(n) is not None:
            return hf[n]
    return default


def require(config: Any, what: str, **fixed: Any) -> None:
    """Refuse a config with settings ``what`` has no counterpart for.

    Raises:
        UserError: naming the first field that differs from its ``fixed`` value.
    """
    for name, value in fixed.items():
        if getattr(config, name) != value:
            raise UserError(f"{what} needs {name}={value!r}, not {name}={getattr(config, name)!r}")


def require_plain_heads(config: Any, what: str) -> None:
    """Refuse grouped-query attention or a head width other than ``d_model / n_heads``.

    Raises:
        UserError: naming both settings.
    """
    if config.n_kv_heads != config.n_heads or config.head_dim * config.n_heads != config.d_model:
        raise UserError(
            f"{what} needs n_kv_heads = n_heads and head_dim = d_model / n_heads "
            f"(got n_heads={config.n_heads}, n_kv_heads={config.n_kv_heads}, "
            f"head_dim={config.head_dim}, d_model={config.d_model})"
        )


# ---- the one conversion path --------------------------------------------------------------------


def prepare(family: Family, hf: dict, names: Collection[str]) -> tuple[nn.Module, KeyMap]:
    """The attnlab model config.json describes (fresh weights) and the key map to load it with.

    Raises:
        UserError: an unsupported option, a missing field, or values attnlab cannot build.
    """
    try:
        cfg = family.config_from_hf(hf, names)
        model = family.build(cfg)
    except UserError:
        raise
    except KeyError as err:
        raise UserError(f"{family.name} config.json lacks the field {err}") from None
    except (TypeError, ValueError) as err:
        raise UserError(f"config.json describes a model attnlab cannot build: {err}") from None
    return model, family.keymap(hf, cfg, names)


def check_config(
    family: Family, hf: dict, header: Header, *, what: str, source: str = "the file"
) -> None:
    """Check config.json against the weights' header before anything real is built.

    The model config.json describes is built on the ``meta`` device under a budget taken from
    the header (:func:`attnlab.checkpoint_check.build_on_meta`), then its tensors, through the
    key map, are compared with the header's.

    Raises:
        UserError: a config that outgrows its weights, or missing, unexpected or misshapen
            tensors (named with both shapes, after the config.json field that explains them).
    """
    names = list(header.shapes)
    given: list[dict[str, str]] = []  # current name -> name in the file, of config.json's build

    def shapes_of(cfg: dict) -> tuple[nn.Module, dict, dict]:
        model, keymap = prepare(family, cfg, names)
        canonical = keymap.canonical(names)
        given.append(canonical)
        found = {c: header.shapes[n] for c, n in canonical.items()}
        return model, expected_shapes(model, keymap), found

    built = build_on_meta(shapes_of, hf, header, what=what)
    try:
        check_shapes(built.expected, built.found, given_names=given[0], what="they", source=source)
    except UserError as err:
        why = explain(built.expected, built.found, hf, rebuild=built.rebuild)
        raise UserError(f"{what}: {why} ({err})" if why else f"{what}: {err}") from None


def expected_shapes(model: nn.Module, keymap: KeyMap) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the other side must hold for ``model`` (tied copies aside).

    Computed by running the key map on shape-only (meta) tensors: no memory, no copies.
    """
    meta = {
        n: torch.empty(t.shape, dtype=t.dtype, device="meta") for n, t in model.state_dict().items()
    }
    return {n: tuple(t.shape) for n, t in keymap.to_theirs(meta).items()}


def params_to(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Parameters to ``dtype``; buffers (RoPE's ``inv_freq``) stay as they are.

    ``Module.to(bfloat16)`` would round the RoPE frequencies to 8 bits of mantissa, which puts
    the rotation angles radians off after a few thousand positions; transformers keeps them fp32.
    """
    buffers = dict(model.named_buffers())
    model = model.to(dtype)
    for name, b in buffers.items():
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, b)
    return model


def load_weights(
    model: nn.Module, keymap: KeyMap, theirs: Mapping[str, Tensor], dtype: torch.dtype
) -> nn.Module:
    """``model`` (in ``dtype``, eval mode) holding ``theirs`` converted by ``keymap``.

    ``theirs`` has been checked against :func:`expected_shapes`; attnlab tensors the key map
    ignores (BERT's MLM head when the checkpoint is a ``BertModel``) keep their initial values.

    Raises:
        RuntimeError: the key map and the model disagree (a bug, not a user error).
    """
    cast = {n: t.to(dtype) if t.is_floating_point() else t for n, t in theirs.items()}
    state = keymap.to_ours(cast)
    model = params_to(model, dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [n for n in missing if not keymap.ignored(n, "ours")]
    if missing or unexpected:
        raise RuntimeError(f"internal mapping error: missing {missing}, unexpected {unexpected}")
    return model.eval()


def model_from_state_dict(
    family: Family,
    hf: dict,
    state_dict: Mapping[str, Tensor],
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """An attnlab model from a config.json dict and an in-memory Hugging Face state dict.

    The same path as reading a folder (:func:`attnlab.interop.from_hf`), without the files.

    Raises:
        UserError: unsupported options; missing, unexpected or misshapen tensors (named, with
            both shapes), checked before anything is loaded.
    """
    header = Header(
        {n: tuple(t.shape) for n, t in state_dict.items()},
        sum(t.numel() * t.element_size() for t in state_dict.values()),
        "the state dict",
    )
    what = f"cannot convert the {family.name} state dict"
    check_config(family, hf, header, what=what, source="the state dict")
    model, keymap = prepare(family, hf, list(state_dict))
    canonical = keymap.canonical(state_dict)
    return load_weights(model, keymap, {c: state_dict[n] for c, n in canonical.items()}, dtype)


def names_without(names: Collection[str], prefix: str) -> set[str]:
    """``names`` with ``prefix`` taken off those that have it (a head class's base-model prefix)."""
    return {n.removeprefix(prefix) for n in names}

"""Each default is one choice: a module's constructor default equals its config's default.

Every ``nn.Module`` class of ``attnlab.attention``, ``attnlab.layers`` and ``attnlab.models`` is
compared with the config that builds it (the family's config for a model file, ``BlockConfig``
for the shared parts): a constructor parameter named like a config field must have the field's
default, so that building a part by hand and building it from a default config give the same
thing.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import pytest
from torch import nn

import attnlab.config as C
from attnlab.config import BlockConfig
from attnlab.config.multimodal import SceneModelConfig
from attnlab.layers.builders import build_block

#: the config that builds the modules of each models/ file (BlockConfig for everything else)
FAMILY_CONFIG = {
    "attnlab.models.encoder": C.EncoderConfig,
    "attnlab.models.lm": C.ModelConfig,
    "attnlab.models.seq2seq": C.Seq2SeqConfig,
    "attnlab.models.t5": C.T5Config,
    "attnlab.models.vision.vit": C.ViTConfig,
    "attnlab.models.vision.swin": C.SwinConfig,
    "attnlab.models.vision.cnn": C.CNNConfig,
    "attnlab.models.rnn": C.RNNSeq2SeqConfig,
    "attnlab.models.translation": C.RNNSeq2SeqConfig,
    "attnlab.models.rnn_lm": C.LSTMConfig,
    "attnlab.models.multimodal": SceneModelConfig,
}

#: parameters whose name is a config field's but whose meaning differs, with the reason
SAME_NAME_OTHER_MEANING = {
    # None stands for no options, {} (a mutable default argument would be shared)
    ("MultiHeadAttention", "backend_options"),
    # a gated FFN built by hand is Llama's, bias-free; from a config it gets the config's bias
    ("SwiGLU", "bias"),
}


def _config_for(module: str) -> type:
    for prefix, cls in FAMILY_CONFIG.items():
        if module == prefix or module.startswith(prefix + "."):
            return cls
    return BlockConfig


def _modules() -> list[type[nn.Module]]:
    found: dict[type, None] = {}
    for name in ("attnlab.attention", "attnlab.layers", "attnlab.models"):
        pkg = importlib.import_module(name)
        for info in pkgutil.walk_packages(pkg.__path__, name + "."):
            mod = importlib.import_module(info.name)
            for obj in vars(mod).values():
                if (
                    isinstance(obj, type)
                    and issubclass(obj, nn.Module)
                    and obj.__module__ == mod.__name__
                ):
                    found[obj] = None
    return list(found)


def _defaults(cls: type) -> dict:
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(cls)
        if f.init
    }


MODULES = _modules()


def test_the_scan_finds_the_parts_and_the_models():
    names = {m.__name__ for m in MODULES}
    assert {"MultiHeadAttention", "MLP", "SwiGLU", "MoE", "DecoderLM", "VisionTransformer"} <= names


@pytest.mark.parametrize("module", MODULES, ids=lambda m: f"{m.__module__}.{m.__name__}")
def test_a_modules_defaults_are_its_configs(module):
    config = _config_for(module.__module__)
    defaults = _defaults(config)
    wrong = {
        name: (p.default, defaults[name])
        for name, p in inspect.signature(module.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
        and name in defaults
        and (module.__name__, name) not in SAME_NAME_OTHER_MEANING
        and p.default != defaults[name]
    }
    assert not wrong, f"{module.__name__} defaults (module, {config.__name__}): {wrong}"


def test_every_exception_names_a_parameter_that_exists():
    by_name = {m.__name__: m for m in MODULES}
    for cls_name, param in SAME_NAME_OTHER_MEANING:
        assert param in inspect.signature(by_name[cls_name].__init__).parameters


def test_qk_norm_eps_reaches_the_norms():
    cfg = BlockConfig(d_model=32, n_heads=4, qk_norm="rmsnorm", qk_norm_eps=1e-3)
    attn = build_block(cfg).attn
    assert attn.q_norm.eps == attn.k_norm.eps == 1e-3
    assert BlockConfig.from_dict({"d_model": 32, "n_heads": 4}).qk_norm_eps == 1e-6  # old runs

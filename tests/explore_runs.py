"""Tiny run directories for the explorer's tests, written directly (no training): the files
``attnlab.runs.load`` reads (config.json, model.safetensors and the kind's tokenizer, vocabulary
or labels), with randomly initialised models of each family's ``tiny`` preset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from attnlab.data.tokenizers import CharTokenizer, TokenizerWithSpecials
from attnlab.models.registry import get_kind
from attnlab.runs import save_model

LM_TEXT = "the cat sat on the mat. a dog ran."
SRC_WORDS = ["one", "two", "three", "four", "five", "hundred", "and"]
TGT_WORDS = ["un", "deux", "trois", "quatre", "cinq", "cent", "et"]
TRANSLATION_SPECIALS = ["<pad>", "<start>", "<end>", "<unk>"]
SCENE_WORDS = ["<pad>", "<unk>", "<start>", "<end>", "a", "red", "blue", "circle", "square"]
SCENE_WORDS += ["what", "colour", "is", "the", "?", "left", "of", "."]
ANSWERS = ["red", "blue", "circle", "square", "yes", "no"]


def _config(kind: str, **fields):
    cls = get_kind(kind).config_cls
    presets = getattr(cls, "PRESETS", None) or {}
    if "tiny" in presets or hasattr(cls, "preset"):
        try:
            return cls.preset("tiny", **fields)
        except (ValueError, KeyError):
            pass
    return cls(**fields)


def _save(run: Path, kind: str, config, *, seed: int = 0) -> torch.nn.Module:
    run.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = get_kind(kind).build(config).eval()
    save_model(model, run / "model.safetensors")
    (run / "config.json").write_text(json.dumps({"kind": kind, "model": config.to_dict()}))
    return model


def lm_run(run: Path, *, max_seq_len: int = 32) -> Path:
    """A decoder_lm run with a character tokenizer over :data:`LM_TEXT`'s alphabet."""
    tok = CharTokenizer.train(LM_TEXT + "ehlowrdbq")
    cfg = _config("decoder_lm", vocab_size=tok.vocab_size, max_seq_len=max_seq_len)
    _save(run, "decoder_lm", cfg)
    tok.save(run)
    return run


def mlm_run(run: Path, *, max_seq_len: int = 32) -> Path:
    """An encoder_mlm run with a character tokenizer (plus ``[PAD] [CLS] [SEP] [MASK]``) over
    :data:`LM_TEXT`'s alphabet."""
    tok = TokenizerWithSpecials(CharTokenizer.train(LM_TEXT + "ehlowrdbq"))
    cfg = _config("encoder_mlm", vocab_size=tok.vocab_size, max_seq_len=max_seq_len)
    _save(run, "encoder_mlm", cfg)
    tok.save(run)
    return run


def translation_run(run: Path, kind: str = "transformer") -> Path:
    """A ``transformer`` or ``rnn-attn`` run over a few number words (word level)."""
    src = TRANSLATION_SPECIALS + SRC_WORDS
    tgt = TRANSLATION_SPECIALS + TGT_WORDS
    fields = dict(src_vocab_size=len(src), tgt_vocab_size=len(tgt))
    _save(run, kind, _config(kind, **fields))
    vocab = {
        "src": {"level": "word", "tokens": src, "bpe": None},
        "tgt": {"level": "word", "tokens": tgt, "bpe": None},
        "normalizer": {"lowercase": True, "strip_hyphens": True},
        "max_tgt_len": 8,
    }
    (run / "vocab.json").write_text(json.dumps(vocab))
    return run


def image_file(path: Path, size: int = 8, channels: int = 1, seed: int = 0) -> Path:
    """A random PNG image."""
    rng = np.random.default_rng(seed)
    shape = (size, size) if channels == 1 else (size, size, 3)
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(path)
    return path


def image_run(run: Path, kind: str = "vit") -> Path:
    """A ``vit`` or ``swin`` run for 8×8 grey images, 10 classes (the tiny presets)."""
    cfg = _config(kind)
    _save(run, kind, cfg)
    labels = {
        "classes": [str(i) for i in range(cfg.num_classes)],
        "image_shape": [cfg.in_channels, cfg.image_size, cfg.image_size],
        "mean": [0.5] * cfg.in_channels,
        "std": [0.25] * cfg.in_channels,
    }
    (run / "labels.json").write_text(json.dumps(labels))
    return run


def scene_run(run: Path, kind: str) -> Path:
    """A ``caption_transformer`` or ``vqa_transformer`` run on 32×32 scenes."""
    fields = dict(arch="transformer", vocab_size=len(SCENE_WORDS))
    if kind.startswith("vqa"):
        fields["n_answers"] = len(ANSWERS)
    _save(run, kind, _config(kind, **fields))
    (run / "vocab.json").write_text(json.dumps({"words": SCENE_WORDS, "answers": ANSWERS}))
    return run

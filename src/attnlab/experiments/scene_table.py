"""The scene experiments of ``attnlab experiment`` as data: each one's name, help, training
scenes, ``(module, config class, title[, renamed])`` (the module's ``run`` and
``format_table``; ``renamed``: config field -> flag dest) and own flag rows, and the rows they
share. :mod:`attnlab.commands.multimodal` registers and runs them.
"""

from __future__ import annotations

from attnlab.config.multimodal import VQA_MODELS
from attnlab.experiments import caption_bptt, caption_features, caption_retrieval, vqa_bias

__all__ = ["PRESETS", "SCENE_EXPERIMENTS", "shared_rows"]

PRESETS = ("tiny", "small")


# fmt: off
def shared_rows(name: str, n_train: int) -> list[tuple]:
    """The flags every scene experiment has: output, budget, data, size, device."""
    return [
        ("--out", None, f"runs/{name}", "output directory (default %(default)s)"),
        ("--steps", int, 800, "steps per model (default 800)"),
        ("--max-time", float, None, "seconds of training per model (overrides --steps)",
         {"metavar": "SECONDS"}),
        ("--batch-size", int, 64, "default %(default)s"),
        ("--n-train", int, n_train, "training scenes (default %(default)s)"),
        ("--preset", PRESETS, "tiny", "model size"),
        ("--device", None, "auto", "auto, cpu, cuda or cuda:N"),
        ("--seed", int, 0, None),
        ("--overwrite", "store_true", None, "replace the runs of an earlier --out"),
        ("--no-progress", "store_false", None, None, {"dest": "progress"}),
    ]


SCENE_EXPERIMENTS = (
    ("vqa-bias", "blind (question-only) vs image-reading VQA accuracy per question type", 3000,
     (vqa_bias, vqa_bias.VQABiasConfig,
      "VQA accuracy (%) per question type, same budget per model"), [
        ("--models", tuple(VQA_MODELS), list(VQA_MODELS), None, {"nargs": "+"}),
        ("--colour-bias", float, 0.3,
         "chance an object takes its shape's favourite colour (default 0.3)"),
    ]),
    ("caption-retrieval", "do captioners compose or retrieve? verbatim training captions "
     "and unseen colour-shape combinations, both captioners", 2000,
     (caption_retrieval, caption_retrieval.CaptionRetrievalConfig,
      "Captioners: composition vs retrieval", {"beam_size": "beam"}), [
        ("--beam", int, 1, "beam width (default 1: greedy)"),
        ("--models", None, ["lstm", "transformer"], "captioners (default lstm transformer; "
         "prefix: LLaVA-style image tokens in the LM)",
         {"nargs": "+", "choices": ["lstm", "transformer", "prefix"]}),
        ("--encoder", ["cnn", "vit"], "cnn", "image encoder (default cnn)"),
        ("--n-eval", int, 200, "val and unseen scenes captioned"),
    ]),
    ("caption-bptt",
     "LSTM captioner: truncated backpropagation through time vs full, accuracy by position",
     2000, (caption_bptt, caption_bptt.CaptionBPTTConfig,
            "LSTM captioner: truncated vs full backpropagation through time"), [
        ("--windows", int, [0, 2], "truncation windows in words, 0 = full (default 0 2)",
         {"nargs": "+"}),
        ("--n-eval", int, 200, "val scenes measured"),
    ]),
    ("caption-features",
     "CNN+LSTM captioner from the classifier's logits vs its penultimate features", 2000,
     (caption_features, caption_features.CaptionFeaturesConfig,
      "CNN+LSTM captioner from a frozen classifier: logits vs penultimate features"), [
        ("--pretrain-steps", int, 300,
         "steps training the classifier before it is frozen (default 300)"),
        ("--n-eval", int, 500, "val scenes captioned (default 500)"),
        ("--encoder-width", int, 64,
         "classifier width = penultimate feature size (default 64)"),
    ]),
)
# fmt: on

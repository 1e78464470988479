"""The flags of ``attnlab train image`` and the vision experiments as data: the data rows (shared
with ``attnlab experiment inductive-bias`` / ``patch-size``), the model and distillation rows of
``train image`` and where each flag goes in config.json.
"""

from __future__ import annotations

from attnlab.runspec.vision import VISION_KINDS

__all__ = ["DATA_CHOICES", "AUGMENT", "FLAG_KEYS", "DATA_FLAGS", "TRAIN_SECTIONS"]

DATA_CHOICES = ("digits", "shapes", "folder", "cifar10", "mnist")
AUGMENT = {"auto": None, "on": True, "off": False}

#: flags of ``train image`` that are settings (beside the training flags), and where they go in
#: config.json
FLAG_KEYS = {
    **{k: f"model.{k}" for k in ("preset", "patch_size", "window_size", "pooling", "position")},
    **{k: f"task.{k}" for k in ("data", "data_path", "image_size", "channels", "shapes_n")},
    **{k: f"task.{k}" for k in ("shapes_label", "train_fraction", "augment", "teacher")},
    **{k: f"task.{k}" for k in ("distillation", "distill_alpha", "distill_temperature")},
    "init_from": "task.init_from",
}


# fmt: off
DATA_FLAGS = [
    ("--data", DATA_CHOICES, "digits",
     "digits: scikit-learn's 8×8 digits; shapes: generated coloured shapes; folder: class "
     "sub-folders of images; cifar10 / mnist: files you downloaded (default: %(default)s)"),
    ("--data-path", None, None,
     "folder / CIFAR-10 batches / MNIST IDX files location", {"metavar": "PATH"}),
    ("--image-size", int, None,
     "square side in pixels: folder images are resized to it (default 32), shapes are drawn "
     "at it (default 32), digits/cifar10/mnist keep their size unless it is given"),
    ("--channels", (1, 3), 3,
     "channels for folder images (default: %(default)s)", {"type": int}),
    ("--shapes-n", int, 3000, "number of generated shapes (default: %(default)s)"),
    ("--shapes-label", ("shape", "colour", "both"), "shape",
     "what a shapes class is (default: %(default)s)"),
]
#: ``train image``'s (argument group, rows) after the data
TRAIN_SECTIONS = [
    ("model", [
        ("--model", VISION_KINDS, "vit",
         "architecture (default: %(default)s, or the kind in --config)"),
        ("--preset", None, None, "model preset (default: tiny for ≤16 px images, small above)"),
        ("--patch-size", int, None, "ViT/Swin patch size"),
        ("--window-size", int, None, "Swin window size"),
        ("--pooling", ("cls", "mean"), None, "ViT pooling"),
        ("--position", ("learned", "sincos"), None, "ViT positions"),
        ("--train-fraction", float, 1.0,
         "use this share of the training split (default: %(default)s)"),
        ("--augment", tuple(AUGMENT), None,
         "random crop (+ flips where they keep the class); auto = on for images of 16 px or "
         "more (default: auto)"),
        ("--init-from", None, None,
         "start from the weights of a trained run of the same architecture (pre-train there, "
         "fine-tune here): every tensor is copied, the head too when the classes are the same, "
         "else the head starts afresh; another kind, size or patch size is refused",
         {"metavar": "RUN"}),
    ]),
    ("distillation (--model deit)", [
        ("--teacher", None, None,
         "run directory of a trained classifier (e.g. a CNN) of the same image size and "
         "classes: the distillation head learns its predictions", {"metavar": "RUN"}),
        ("--distillation", ("hard", "soft"), "hard",
         "hard: the teacher's arg-max as label; soft: τ²·KL to its temperature-τ softmax "
         "(default: %(default)s)"),
        ("--distill-alpha", float, 0.5, "weight of the distillation head's loss, the class "
         "head's is 1 − α (default: %(default)s)"),
        ("--distill-temperature", float, 1.0, "τ of soft distillation (default: %(default)s)"),
    ]),
]
# fmt: on

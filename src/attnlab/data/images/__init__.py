"""Image classification data, all offline: bundled, generated, or read from the user's files.

Sources (:func:`load_image_data` picks one by name):

- ``digits``: scikit-learn's bundled 8×8 grey handwritten digits (1 797 images, 10 classes).
- ``shapes``: generated coloured shapes (circle, square, triangle, cross) on a noisy background at
  any resolution; the class is the shape, the colour, or both (:mod:`.shapes`).
- ``folder``: a directory with one sub-folder per class, read with PIL and resized (:mod:`.readers`).
- ``cifar10``: the CIFAR-10 "python version" batches the user downloaded, unpickled with a
  restricted unpickler that admits only what a batch holds (:mod:`.cifar`).
- ``mnist``: MNIST-format IDX files (``train-images-idx3-ubyte`` …, optionally ``.gz``).

Every source ends as an :class:`ImageSplits` of float images in [0, 1], shape ``(N, C, H, W)``,
split into train / val / test (:mod:`.splits`); ``image_size=S`` resizes the fixed-size sources
too. :mod:`.transforms` has the augmentations and the normalisation, :class:`ImageSettings` what a
trained classifier needs to read new images. The classification task that serves batches to the
trainer is :class:`attnlab.tasks.image.ImageClassificationTask`.
"""

from attnlab.data.images.cifar import load_cifar10, safe_unpickle
from attnlab.data.images.readers import (
    IMAGE_EXTENSIONS,
    load_digits,
    load_image_folder,
    load_mnist,
    read_image,
    resize_image,
)
from attnlab.data.images.settings import LABELS_FILE, ImageSettings
from attnlab.data.images.shapes import COLOUR_NAMES, SHAPE_NAMES, make_shapes, relabel_shapes
from attnlab.data.images.sources import DATA_SOURCES, FLIP_OK, load_image_data
from attnlab.data.images.splits import ImageSplits, hold_out_val, resize_splits, split_images
from attnlab.data.images.transforms import normalize, random_crop, random_flip

__all__ = [
    "DATA_SOURCES",
    "FLIP_OK",
    "IMAGE_EXTENSIONS",
    "LABELS_FILE",
    "SHAPE_NAMES",
    "COLOUR_NAMES",
    "ImageSplits",
    "ImageSettings",
    "load_image_data",
    "load_digits",
    "make_shapes",
    "relabel_shapes",
    "load_image_folder",
    "load_cifar10",
    "load_mnist",
    "safe_unpickle",
    "resize_splits",
    "split_images",
    "hold_out_val",
    "read_image",
    "resize_image",
    "random_crop",
    "random_flip",
    "normalize",
]

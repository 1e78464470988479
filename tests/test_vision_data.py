"""Image data: digits, generated shapes, class folders, CIFAR-10 batches and MNIST IDX files written
here in their formats, augmentations, the classification task, and bad files — including CIFAR-10
pickles crafted to run code, which must be refused before anything runs."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import attnlab.data.images as images
from attnlab.data.images import (
    load_cifar10,
    load_digits,
    load_image_data,
    load_image_folder,
    load_mnist,
    make_shapes,
    random_crop,
    random_flip,
    read_image,
    safe_unpickle,
)
from attnlab.errors import UserError
from attnlab.tasks.image import ImageClassificationTask


def test_digits_are_sklearn_digits_in_unit_range():
    from sklearn.datasets import load_digits as sk  # heavy (~1 s): this test only

    d = load_digits()
    assert d.image_shape == (1, 8, 8) and d.classes == [str(i) for i in range(10)]
    n = sum(len(d.split(s)[1]) for s in ("train", "val", "test"))
    assert n == len(sk().target) == 1797
    x, y = d.train
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    # every training image is one of sklearn's, with its label
    ref = torch.tensor(sk().images, dtype=torch.float32) / 16
    i = int(((ref - x[0, 0]).abs().flatten(1).sum(1)).argmin())
    assert torch.equal(ref[i], x[0, 0]) and int(sk().target[i]) == int(y[0])


@pytest.mark.parametrize("size", [12, 40])
def test_shapes_any_resolution_and_colour_labels_match_pixels(size):
    d = make_shapes(60, size, label="colour", seed=3)
    assert d.image_shape == (3, size, size) and d.classes == ["red", "green", "blue"]
    x, y = d.train
    # the brightest channel of the brightest pixels is the labelled colour
    flat = x.flatten(2)  # (N, 3, HW)
    bright = flat.sum(1).argmax(-1)  # (N,)
    dominant = flat[torch.arange(len(y)), :, bright].argmax(-1)
    assert torch.equal(dominant, y)


def test_shapes_label_both_has_twelve_classes_and_is_deterministic():
    a, b = make_shapes(40, 16, label="both", seed=1), make_shapes(40, 16, label="both", seed=1)
    assert len(a.classes) == 12 and "red circle" in a.classes
    assert torch.equal(a.train[0], b.train[0]) and torch.equal(a.test[1], b.test[1])
    with pytest.raises(ValueError, match="label"):
        make_shapes(40, 16, label="size")


def _write_folder(root, counts, size=10):
    for cls, n in counts.items():
        (root / cls).mkdir(parents=True)
        for i in range(n):
            arr = np.full((size, size + 2, 3), 40 * i, dtype=np.uint8)
            Image.fromarray(arr).save(root / cls / f"{i}.png")


def test_image_folder_classes_sorted_and_resized(tmp_path):
    _write_folder(tmp_path, {"dog": 6, "cat": 6})
    (tmp_path / "cat" / "notes.txt").write_text("ignored")
    d = load_image_folder(tmp_path, image_size=16, channels=1)
    assert d.classes == ["cat", "dog"] and d.image_shape == (1, 16, 16)
    assert sum(len(d.split(s)[1]) for s in ("train", "val", "test")) == 12


def test_empty_class_folder_and_unreadable_file_are_named(tmp_path):
    _write_folder(tmp_path, {"a": 2})
    (tmp_path / "b").mkdir()
    with pytest.raises(UserError, match=r"class folder .*b'? contains no images"):
        load_image_folder(tmp_path)
    (tmp_path / "b" / "broken.png").write_bytes(b"not a png at all")
    with pytest.raises(UserError, match=r"cannot read image .*broken\.png"):
        load_image_folder(tmp_path)
    with pytest.raises(UserError, match="no class sub-folders"):
        load_image_folder(tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="missing"):
        load_image_folder(tmp_path / "missing")


def test_read_image_converts_channels(tmp_path):
    arr = np.zeros((5, 7, 3), dtype=np.uint8)
    arr[..., 0] = 255
    Image.fromarray(arr).save(tmp_path / "red.png")
    rgb = read_image(tmp_path / "red.png")
    assert rgb.shape == (3, 5, 7) and torch.allclose(rgb[0], torch.ones(5, 7))
    grey = read_image(tmp_path / "red.png", image_size=4, channels=1)
    assert grey.shape == (1, 4, 4)
    # PIL's L conversion: 299/1000 of the red channel
    assert abs(float(grey.mean()) - 76 / 255) < 1e-6


def _cifar_batch(path, n, seed):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, n).tolist()
    with open(path, "wb") as f:
        pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, f)
    return data, labels


def test_cifar10_python_batches(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    data1, labels1 = _cifar_batch(root / "data_batch_1", 12, 0)
    _cifar_batch(root / "data_batch_2", 8, 1)
    test, test_labels = _cifar_batch(root / "test_batch", 5, 2)
    names = [
        b"airplane",
        b"automobile",
        b"bird",
        b"cat",
        b"deer",
        b"dog",
        b"frog",
        b"horse",
        b"ship",
        b"truck",
    ]
    with open(root / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": names}, f)
    d = load_cifar10(tmp_path)  # the parent directory works too
    assert d.classes[0] == "airplane" and d.image_shape == (3, 32, 32)
    assert len(d.train[1]) + len(d.val[1]) == 20 and len(d.test[1]) == 5
    # row layout: 1024 red, then green, then blue values, each row-major 32×32
    x0 = d.test[0][0]
    assert torch.equal((x0[1, 0, 5] * 255).round().byte(), torch.tensor(test[0][1024 + 5]))
    assert d.test[1].tolist() == test_labels
    (root / "test_batch").write_bytes(b"garbage")
    with pytest.raises(UserError, match="test_batch"):
        load_cifar10(root)
    with open(root / "test_batch", "wb") as f:  # a pickle, but not a batch dict
        pickle.dump([1, 2, 3], f)
    with pytest.raises(UserError, match="test_batch.*not a CIFAR-10 batch"):
        load_cifar10(root)
    with pytest.raises(FileNotFoundError, match="CIFAR-10"):
        load_cifar10(tmp_path / "nothing")


def _idx(path, arr, gz=False):
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + b"".join(
        struct.pack(">I", s) for s in arr.shape
    )
    raw = header + arr.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(path, "wb").write(raw)


def test_mnist_idx_files_plain_and_gzipped(tmp_path):
    rng = np.random.default_rng(0)
    tr_x, tr_y = rng.integers(0, 256, (20, 28, 28)), rng.integers(0, 10, 20)
    te_x, te_y = rng.integers(0, 256, (6, 28, 28)), rng.integers(0, 10, 6)
    _idx(tmp_path / "train-images-idx3-ubyte", tr_x)
    _idx(tmp_path / "train-labels-idx1-ubyte", tr_y)
    _idx(tmp_path / "t10k-images-idx3-ubyte.gz", te_x, gz=True)
    _idx(tmp_path / "t10k-labels-idx1-ubyte.gz", te_y, gz=True)
    d = load_mnist(tmp_path)
    assert d.image_shape == (1, 28, 28)
    assert torch.equal((d.test[0][:, 0] * 255).round().long(), torch.tensor(te_x))
    assert d.test[1].tolist() == te_y.tolist()
    assert len(d.train[1]) + len(d.val[1]) == 20
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x09abc")
    with pytest.raises(UserError, match="train-labels-idx1-ubyte.*promises"):
        load_mnist(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match="train-labels-idx1-ubyte"):
        load_mnist(tmp_path)


def test_random_crop_is_a_shift_of_the_zero_padded_image():
    x = torch.randn(16, 2, 6, 6)
    out = random_crop(x, 2, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for b in range(16):  # each output is one of the 5×5 windows of its padded input
        assert any(
            torch.equal(out[b], padded[b, :, i : i + 6, j : j + 6])
            for i in range(5)
            for j in range(5)
        )
    assert not torch.equal(out, x)
    assert torch.equal(random_crop(x, 0), x)


def test_random_flip_mirrors_some_images_only():
    x = torch.randn(64, 1, 4, 4)
    out = random_flip(x, torch.Generator().manual_seed(0))
    same = [(out[b] == x[b]).all().item() for b in range(64)]
    mirrored = [(out[b] == x[b].flip(-1)).all().item() for b in range(64)]
    assert all(s or m for s, m in zip(same, mirrored)) and 10 < sum(mirrored) < 54


def test_task_batches_are_deterministic_and_split_over_ranks():
    d = make_shapes(80, 16, seed=0)
    task = ImageClassificationTask(d, seed=5)
    assert task.augment and task.flip  # 16 px shapes: crop and flips on
    a = task.get_batch("train", 3, 8)
    b = task.get_batch("train", 3, 8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    digits_task = ImageClassificationTask(load_digits())
    assert not digits_task.augment and not digits_task.flip
    full = digits_task.get_batch("train", 7, 8)
    parts = [digits_task.get_batch("train", 7, 8, rank=r, world=2) for r in range(2)]
    assert torch.equal(torch.cat([p[1] for p in parts]), full[1])
    assert torch.equal(torch.cat([p[0] for p in parts]), full[0])
    # one epoch of batches visits every training image once
    n = len(digits_task.train_y)
    seen = torch.cat([digits_task.get_batch("train", s, 2)[1] for s in range(n // 2)])
    assert torch.equal(seen.bincount(minlength=10), digits_task.train_y.bincount(minlength=10))
    # normalisation uses the training statistics
    x = digits_task.prepare(digits_task.train_x)
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-2


def test_train_fraction_keeps_a_subset():
    d = load_digits()
    small = ImageClassificationTask(d, train_fraction=0.1)
    assert len(small.train_y) == round(0.1 * len(d.train[1]))
    with pytest.raises(ValueError, match="train_fraction"):
        ImageClassificationTask(d, train_fraction=0.0)


def test_image_size_resizes_fixed_size_sources():
    d = load_digits()
    assert load_image_data("digits", image_size=8).image_shape == (1, 8, 8)
    big = load_image_data("digits", image_size=16)
    assert big.image_shape == (1, 16, 16) and torch.equal(big.test[1], d.test[1])
    # an upsampled image keeps its range, and blank (all-zero) corners stay blank
    x, x16 = d.test[0], big.test[0]
    assert 0 <= float(x16.min()) and float(x16.max()) <= 1
    blank = x[:, 0, 0, 0] == 0
    assert bool((x16[blank, 0, 0, 0] == 0).all())
    # shrinking (antialiased) averages neighbours: each image keeps its mean brightness
    small = load_image_data("digits", image_size=4)
    torch.testing.assert_close(small.test[0].mean((1, 2, 3)), x.mean((1, 2, 3)), atol=0.05, rtol=0)
    with pytest.raises(UserError, match="image size must be positive, got 0"):
        load_image_data("digits", image_size=0)


class _Payload:
    """Unpickling this calls ``open(target, "w")``: a pickle that creates a file when loaded."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar10_crafted_pickle_is_refused_before_it_runs(tmp_path, protocol):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    _cifar_batch(root / "data_batch_1", 4, 0)
    _cifar_batch(root / "test_batch", 2, 1)
    target = tmp_path / "pwned.txt"
    crafted = {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": _Payload(target)}
    with open(root / "data_batch_2", "wb") as f:
        pickle.dump(crafted, f, protocol=protocol)
    with pytest.raises(UserError, match=r"data_batch_2.*io\.open.*refused") as err:
        load_cifar10(root)
    assert not target.exists(), "the crafted pickle ran"
    control = tmp_path / "control.txt"  # the payload is real: plain pickle.load runs it
    pickle.loads(pickle.dumps(_Payload(control), protocol=protocol)).close()
    assert control.exists()
    assert "cannot read CIFAR-10 batch" in str(err.value)
    # the same for the meta file, and for a classic os.system payload
    (root / "data_batch_2").unlink()
    with open(root / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [_Payload(target)]}, f, protocol=protocol)
    with pytest.raises(UserError, match="batches.meta"):
        load_cifar10(root)
    assert not target.exists()


def test_cifar10_refuses_every_global_but_numpy_arrays(tmp_path):
    path = tmp_path / "b"
    for payload in (
        b"cos\nsystem\n(S'touch x'\ntR.",  # protocol 0: os.system("touch x")
        b"cbuiltins\neval\n(S'1'\ntR.",
        b"cnumpy\nload\n(S'x'\ntR.",  # numpy, but not an array reconstructor
        b"csubprocess\ncall\n(S'x'\ntR.",
    ):
        path.write_bytes(payload)
        with pytest.raises(UserError, match=r"'.*b'.*refused"):
            safe_unpickle(path)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_cifar10_real_format_batches_load_at_every_protocol(tmp_path, protocol):
    """Batches written by numpy + pickle (any protocol, numpy's own reconstructors) still load,
    with a label list or an int array, bytes keys and the file-name list a real batch holds."""
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(protocol)
    batches = {}
    for name, n in (("data_batch_1", 6), ("test_batch", 3)):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, n)
        batch = {
            b"batch_label": b"training batch 1 of 5",
            b"labels": labels.tolist() if name == "test_batch" else labels,
            b"data": data,
            b"filenames": [f"img_{i}.png".encode() for i in range(n)],
        }
        with open(root / name, "wb") as f:
            pickle.dump(batch, f, protocol=protocol)
        batches[name] = (data, labels)
    with open(root / "batches.meta", "wb") as f:
        names = [b"plane", b"car", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship"]
        pickle.dump({b"label_names": names + [b"truck"], b"num_vis": 3072}, f, protocol=protocol)
    d = load_cifar10(root)
    assert d.classes[:2] == ["plane", "car"]
    data, labels = batches["test_batch"]
    assert d.test[1].tolist() == labels.tolist()
    assert torch.equal((d.test[0] * 255).round().byte().reshape(3, 3072), torch.from_numpy(data))


def test_no_image_reader_unpickles():
    """Only the CIFAR-10 reader touches pickles, and only through the restricted unpickler."""
    for path in Path(images.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert "pickle.load(" not in text and "torch.load(" not in text, path.name
        if path.name != "cifar.py":
            assert "import pickle" not in text, path.name

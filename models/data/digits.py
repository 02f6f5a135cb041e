"""Digit images for the MNIST case study: real MNIST files, or scikit-learn's bundled 8x8 digits.

Everything here is numpy only (no TensorFlow), so it is quick to import and to unit-test.
Every loader returns a :class:`DigitData` whose images are float32 ``[N, 28, 28, 1]`` in ``[0, 1]``
(NHWC, white digit on black as in MNIST) and whose labels are int64 ``[N]`` in ``0..9``.

Nothing is downloaded: MNIST is read from files the user already has (``--data_dir``), and the
fallback set is the one scikit-learn ships inside its wheel (1797 real handwritten digits).
"""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGE_SIZE = 28
NUM_CLASSES = 10

# IDX type codes (http://yann.lecun.com/exdb/mnist/): the third byte of the magic number.
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

# The four files of the standard distribution; each may also be gzipped, and some mirrors write
# "train-images.idx3-ubyte" (a dot instead of the dash).
_IDX_NAMES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")

DIGITS_TEST_SIZE = 300
DIGITS_SPLIT_SEED = 0  # fixed, so the test set is the same whatever --seed training uses


class DataError(ValueError):
    """The data the user pointed at is missing or malformed; the message says what to do."""


@dataclass(frozen=True)
class DigitData:
    """A train/test split of 28x28 grey-scale digit images."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str

    def describe(self) -> str:
        return (
            f"{self.source}: {len(self.train_labels)} train / {len(self.test_labels)} test images"
        )


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into an array of its declared type and shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as stream:
            raw = stream.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read IDX file {path}: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(
            f"{path} is not an IDX file (bad magic number {raw[:4].hex() or 'empty'}); "
            "expected the MNIST files train-images-idx3-ubyte etc., gzipped or not"
        )
    dtype = _IDX_DTYPES[raw[2]]
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != count * dtype.itemsize:
        raise DataError(
            f"{path}: header declares shape {shape} ({count * dtype.itemsize} bytes of data) "
            f"but the file holds {len(raw) - header}; the file is truncated or corrupt"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def _find_idx(data_dir: Path, stem: str) -> Path | None:
    dotted = stem.replace("-idx", ".idx")
    for name in (stem, stem + ".gz", dotted, dotted + ".gz"):
        if (data_dir / name).is_file():
            return data_dir / name
    return None


def to_model_images(images: np.ndarray) -> np.ndarray:
    """Scale uint8 ``[N, 28, 28]`` (or float) images to float32 ``[N, 28, 28, 1]`` in ``[0, 1]``."""
    images = np.asarray(images)
    if images.ndim != 3 or images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise DataError(f"expected images of shape [N, 28, 28], got {list(images.shape)}")
    scale = 255.0 if images.dtype == np.uint8 or images.max(initial=0) > 1.0 else 1.0
    return (images.astype(np.float32) / scale)[..., np.newaxis]


def _checked(images: np.ndarray, labels: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    if len(labels) != len(images):
        raise DataError(f"{what}: {len(images)} images but {len(labels)} labels")
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataError(f"{what}: labels must be 0..9, found {labels.min()}..{labels.max()}")
    return to_model_images(images), labels


def load_mnist_dir(data_dir: Path) -> DigitData:
    """Load MNIST from ``data_dir``: ``mnist.npz`` (Keras layout) or the four standard IDX files."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"--data_dir {data_dir} is not a directory")
    npz = data_dir / "mnist.npz"
    if npz.is_file():
        return _load_npz(npz)
    found = {key: _find_idx(data_dir, stem) for key, stem in _IDX_NAMES.items()}
    missing = [_IDX_NAMES[key] for key, path in found.items() if path is None]
    if missing:
        raise DataError(
            f"--data_dir {data_dir} holds neither mnist.npz nor the MNIST IDX files "
            f"(missing: {', '.join(missing)}, with or without .gz); put the files there, "
            "or omit --data_dir to train on scikit-learn's bundled digits"
        )
    arrays = {key: read_idx(path) for key, path in found.items() if path is not None}
    train = _checked(arrays["train_images"], arrays["train_labels"], "MNIST train set")
    test = _checked(arrays["test_images"], arrays["test_labels"], "MNIST test set")
    return DigitData(*train, *test, source=f"MNIST IDX files in {data_dir}")


def _load_npz(path: Path) -> DigitData:
    try:
        with np.load(path) as archive:
            missing = [key for key in _NPZ_KEYS if key not in archive.files]
            if missing:
                raise DataError(
                    f"{path} lacks the arrays {', '.join(missing)}; expected the Keras layout "
                    "with x_train, y_train, x_test, y_test"
                )
            arrays = {key: archive[key] for key in _NPZ_KEYS}
    except (OSError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"cannot read {path}: {exc}") from exc
    train = _checked(arrays["x_train"], arrays["y_train"], f"{path} train set")
    test = _checked(arrays["x_test"], arrays["y_test"], f"{path} test set")
    return DigitData(*train, *test, source=f"MNIST {path}")


def _interpolation_matrix(size_in: int, size_out: int) -> np.ndarray:
    """Matrix ``W`` (out x in) so that ``W @ x`` is the linear resampling of ``x`` (half-pixel
    centres, edges clamped), the same convention as ``tf.image.resize(..., 'bilinear')``."""
    centres = (np.arange(size_out) + 0.5) * size_in / size_out - 0.5
    centres = np.clip(centres, 0.0, size_in - 1.0)
    low = np.floor(centres).astype(int)
    high = np.minimum(low + 1, size_in - 1)
    frac = centres - low
    matrix = np.zeros((size_out, size_in))
    matrix[np.arange(size_out), low] += 1.0 - frac
    matrix[np.arange(size_out), high] += frac
    return matrix


def resize_images(images: np.ndarray, size: int) -> np.ndarray:
    """Bilinearly resize square images ``[N, h, h]`` to ``[N, size, size]``."""
    weights = _interpolation_matrix(images.shape[1], size)
    return np.einsum("oh,nhw,pw->nop", weights, images, weights)


def mnist_like(images_8x8: np.ndarray) -> np.ndarray:
    """Turn scikit-learn's 8x8 digits (values 0..16) into MNIST-like 28x28 images in [0, 1].

    MNIST centres each digit in a 20x20 box inside the 28x28 frame; do the same: resize to 20x20
    and pad 4 pixels of background on every side.
    """
    small = np.asarray(images_8x8, dtype=np.float64).reshape(-1, 8, 8) / 16.0
    box = np.clip(resize_images(small, 20), 0.0, 1.0)
    framed = np.pad(box, ((0, 0), (4, 4), (4, 4)))
    return framed.astype(np.float32)[..., np.newaxis]


def load_sklearn_digits(test_size: int = DIGITS_TEST_SIZE) -> DigitData:
    """scikit-learn's bundled digits (1797 images), resized to 28x28, with a fixed split."""
    from sklearn.datasets import load_digits  # bundled with the wheel: no download

    bunch = load_digits()
    images = mnist_like(bunch.images)
    labels = bunch.target.astype(np.int64)
    order = np.random.RandomState(DIGITS_SPLIT_SEED).permutation(len(labels))
    test, train = order[:test_size], order[test_size:]
    return DigitData(
        images[train],
        labels[train],
        images[test],
        labels[test],
        source="scikit-learn digits (8x8, resized to 28x28)",
    )


def load_data(data_dir: str | Path | None) -> DigitData:
    """MNIST from ``data_dir`` when given, else scikit-learn's digits."""
    if data_dir:
        return load_mnist_dir(Path(data_dir))
    return load_sklearn_digits()

"""ImageNet-layout TFRecords: a writer of small random sets, and the benchmark's input pipeline.

Layout (as written by TensorFlow's ``build_imagenet_data.py`` and read by tf_cnn_benchmarks):
shards named ``train-00000-of-00004`` ... in one directory, each record a ``tf.train.Example`` with
``image/encoded`` (JPEG bytes), ``image/class/label`` (int64, 1-based: 0 is the background class,
hence 1001-class models), ``image/height``, ``image/width``, ``image/format``.

Write a set::

    python -m tflaunch.models.tfrecords --out /tmp/imagenet-mini --num_images 256 --image_size 96 \
        --num_classes 10

The reader decodes the JPEGs, flips at random, resizes to the model's input size, scales to
[-1, 1], batches (dropping the remainder, so every step has the same shape) and prefetches.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow's C++ runtime loads

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SHARD_PATTERN = "train-*-of-*"


def shard_name(index: int, num_shards: int, prefix: str = "train") -> str:
    """``train-00003-of-00008``: the ImageNet shard naming."""
    return f"{prefix}-{index:05d}-of-{num_shards:05d}"


def _example(jpeg: bytes, label: int, size: int) -> tf.train.Example:
    def int64(value: int) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    def raw(value: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    features = {
        "image/encoded": raw(jpeg),
        "image/format": raw(b"JPEG"),
        "image/class/label": int64(label),
        "image/height": int64(size),
        "image/width": int64(size),
    }
    return tf.train.Example(features=tf.train.Features(feature=features))


def write_dataset(
    out_dir: str,
    num_images: int,
    image_size: int,
    num_classes: int,
    num_shards: int = 4,
    seed: int = 0,
) -> list[str]:
    """Write ``num_images`` random JPEGs with labels in 1..num_classes; return the shard paths."""
    if num_images < 1 or image_size < 1 or num_classes < 1 or num_shards < 1:
        raise ValueError("num_images, image_size, num_classes and num_shards must be positive")
    num_shards = min(num_shards, num_images)
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = [os.path.join(out_dir, shard_name(i, num_shards)) for i in range(num_shards)]
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    try:
        for i in range(num_images):
            pixels = rng.integers(0, 256, size=(image_size, image_size, 3), dtype=np.uint8)
            jpeg = tf.io.encode_jpeg(pixels, quality=90).numpy()
            label = int(rng.integers(1, num_classes + 1))
            writers[i % num_shards].write(_example(jpeg, label, image_size).SerializeToString())
    finally:
        for writer in writers:
            writer.close()
    return paths


def list_shards(data_dir: str) -> list[str]:
    """The training shards in ``data_dir``, sorted; an error saying what was expected if none."""
    files = sorted(glob.glob(os.path.join(data_dir, SHARD_PATTERN)))
    if not files:
        raise FileNotFoundError(
            f"no TFRecord shards matching {SHARD_PATTERN!r} in {data_dir!r}. Write a small set "
            "with `python -m tflaunch.models.tfrecords --out DIR`, or point --data_dir at ImageNet "
            "TFRecords (train-00000-of-01024 ...)."
        )
    return files


_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def _preprocess(record: tf.Tensor, image_size: int, data_format: str):
    parsed = tf.io.parse_single_example(record, _FEATURES)
    image = tf.io.decode_jpeg(parsed["image/encoded"], channels=3)
    image = tf.image.random_flip_left_right(image)
    image = tf.image.resize(image, [image_size, image_size])  # float32
    image = image * (2.0 / 255.0) - 1.0
    if data_format == "NCHW":
        image = tf.transpose(image, [2, 0, 1])
    label = tf.cast(parsed["image/class/label"], tf.int32)
    return image, label


def make_dataset(
    files: Sequence[str],
    batch_size: int,
    image_size: int,
    data_format: str = "NHWC",
    num_shards: int = 1,
    shard_index: int = 0,
) -> tf.data.Dataset:
    """Endless batches of (images, labels) for worker ``shard_index`` of ``num_shards``.

    Workers split the files when there are at least as many files as workers (each reads only its
    own), otherwise they split the records.
    """
    files = list(files)
    ds = tf.data.Dataset.from_tensor_slices(files)
    by_file = len(files) >= num_shards
    if by_file and num_shards > 1:
        ds = ds.shard(num_shards, shard_index)
    ds = ds.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(4, len(files)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    if not by_file and num_shards > 1:
        ds = ds.shard(num_shards, shard_index)
    ds = ds.repeat().shuffle(256)
    ds = ds.map(
        lambda r: _preprocess(r, image_size, data_format), num_parallel_calls=tf.data.AUTOTUNE
    )
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

"""Model registry for the benchmark: tf_cnn_benchmarks' model names -> constructors.

Each entry builds a ``tf.Module`` whose variables are created in its constructor (so the device
or strategy scope active at construction places them) and whose ``__call__(images, training)``
returns logits. Image sizes are per model: the default and the smallest accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf


@dataclass(frozen=True)
class ModelSpec:
    """What the benchmark needs to know about one model."""

    name: str
    build: Callable[[int, str], tf.Module]
    default_image_size: int
    min_image_size: int
    default_num_classes: int


def _inception3(num_classes: int, data_format: str) -> tf.Module:
    from tflaunch.models.inception import InceptionV3

    return InceptionV3(num_classes=num_classes, data_format=data_format)


def _resnet50(num_classes: int, data_format: str) -> tf.Module:
    from tflaunch.models.resnet import ResNet50

    return ResNet50(num_classes=num_classes, data_format=data_format)


MODELS: dict[str, ModelSpec] = {
    # tf_cnn_benchmarks trains ImageNet models with 1001 classes (background class included).
    "inception3": ModelSpec("inception3", _inception3, 299, 75, 1001),
    "resnet50": ModelSpec("resnet50", _resnet50, 224, 32, 1001),
}


def get_model_spec(name: str) -> ModelSpec:
    """Look a model up by its tf_cnn_benchmarks name; unknown names list the valid ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(
            f"unknown --model {name!r}; choose one of: {', '.join(sorted(MODELS))}"
        ) from None

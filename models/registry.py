"""The networks this package builds, by name: one table for the benchmark, the placement report
(``tflaunch placement --model``) and the sweeps' cluster files.

Main names are tf_cnn_benchmarks' (``inception3``, ``resnet50``); names used here before
(``inception_v3``) stay valid as aliases. No TensorFlow at import: a builder imports its network
when it is called, so that tflaunch's CLI can list and check names where TensorFlow is absent.

A builder takes ``(num_classes, data_format)`` and creates every variable while it runs, so the
device or strategy scope active around it places them. The CNNs return a ``tf.Module`` whose
``__call__(images, training)`` gives logits (what the benchmark trains); the deep MNIST net is a
TF1 graph function, built on a placeholder, so it works in graph mode only (the placement report
builds every model in a graph).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class UnknownModelError(ValueError):
    """A model name that is neither a main name nor an alias; the message lists the valid ones."""


@dataclass(frozen=True)
class ModelSpec:
    """What the benchmark and the placement report need to know about one network."""

    name: str
    description: str
    build: Callable[[int, str], object]
    default_image_size: int
    min_image_size: int
    default_num_classes: int
    fixed_num_classes: bool = False  # the net always has default_num_classes outputs
    benchmark: bool = True  # a tf.Module the CNN benchmark can train


def _inception3(num_classes: int, data_format: str) -> object:
    from tflaunch.models.nets.inception import InceptionV3

    return InceptionV3(num_classes=num_classes, data_format=data_format)


def _resnet50(num_classes: int, data_format: str) -> object:
    from tflaunch.models.nets.resnet import ResNet50

    return ResNet50(num_classes=num_classes, data_format=data_format)


def _deep_mnist(num_classes: int, data_format: str) -> object:
    import tensorflow as tf

    from tflaunch.models.nets.deep_mnist import IMAGE_SIZE, deep_mnist

    images = tf.compat.v1.placeholder(tf.float32, [None, IMAGE_SIZE, IMAGE_SIZE, 1])
    return deep_mnist(images, data_format, 0.0)


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # tf_cnn_benchmarks trains ImageNet models with 1001 classes (background class included).
        ModelSpec(
            "inception3", "InceptionV3 (models/nets/inception.py)", _inception3, 299, 75, 1001
        ),
        ModelSpec("resnet50", "ResNet-50 (models/nets/resnet.py)", _resnet50, 224, 32, 1001),
        ModelSpec(
            "mnist",
            "deep MNIST net (models/nets/deep_mnist.py; always 10 classes)",
            _deep_mnist,
            28,
            28,
            10,
            fixed_num_classes=True,
            benchmark=False,
        ),
    )
}

ALIASES: dict[str, str] = {"inception_v3": "inception3"}


def model_names(*, benchmark: bool = False, aliases: bool = False) -> tuple[str, ...]:
    """Main names (the benchmark's only, with ``benchmark``), then the aliases if asked for."""
    main = tuple(name for name, spec in MODELS.items() if spec.benchmark or not benchmark)
    extra = tuple(alias for alias, name in ALIASES.items() if name in main) if aliases else ()
    return main + extra


def get_model_spec(name: str, *, benchmark: bool = False) -> ModelSpec:
    """The model called ``name`` (a main name or an alias); unknown names list the valid ones.

    With ``benchmark``, only the CNNs the benchmark trains count.
    """
    spec = MODELS.get(ALIASES.get(name, name))
    if spec is not None and (spec.benchmark or not benchmark):
        return spec
    aliases = [a for a in model_names(benchmark=benchmark, aliases=True) if a in ALIASES]
    why = "" if spec is None else " (not a CNN the benchmark trains)"
    raise UnknownModelError(
        f"unknown --model {name!r}{why}; choose one of: "
        + ", ".join(model_names(benchmark=benchmark))
        + (f" (aliases: {', '.join(aliases)})" if aliases else "")
    )


def model_variables(name: str, num_classes: int = 1000, trainable_only: bool = True) -> list:
    """A model's variables (placement VariableSpecs) in creation order, from one graph-mode build
    (nothing computed): what a replica_device_setter would place."""
    from tflaunch.models.placement import graph_variables

    spec = get_model_spec(name)
    classes = spec.default_num_classes if spec.fixed_num_classes else num_classes
    variables = graph_variables(lambda: spec.build(classes, "NHWC"))
    return [v for v in variables if v.trainable or not trainable_only]

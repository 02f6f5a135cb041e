"""The networks this package builds, by name: one table for the benchmark, the placement report
(``tflaunch placement --model``) and sweeps (``tflaunch bench`` checks a sweep's ``--model``).

Main names are tf_cnn_benchmarks' (``inception3``, ``resnet50``); names used here before
(``inception_v3``) stay valid as aliases.

The table is data: each entry names its network's factory as ``"module:attribute"`` (as gym's
registry names entry points), imported only by :meth:`ModelSpec.build`. Reading the table imports
no network and no TensorFlow, so tflaunch's CLI lists and checks names where TensorFlow is absent.

A factory takes ``num_classes`` and ``data_format`` and creates every variable while it runs, so
the device or strategy scope active around it places them. The CNNs return a ``tf.Module`` whose
``__call__(images, training)`` gives logits (what the benchmark trains); the deep MNIST net is a
TF1 graph function, built on a placeholder, so it works in graph mode only (the placement report
builds every model in a graph).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

# How the benchmark (``models.benchmark --variable_update``) shares variables: defined here, where
# the tools that list them (``tflaunch bench``, ``tflaunch model``) can read them without TensorFlow.
VARIABLE_UPDATES = ("parameter_server", "distributed_replicated", "collective_all_reduce")


class UnknownModelError(ValueError):
    """A model name that is neither a main name nor an alias; the message lists the valid ones."""


@dataclass(frozen=True)
class ModelSpec:
    """What the benchmark and the placement report need to know about one network."""

    name: str
    description: str
    factory: str  # "module:attribute", called with num_classes= and data_format=
    default_image_size: int
    min_image_size: int
    default_num_classes: int
    fixed_num_classes: bool = False  # the net always has default_num_classes outputs
    benchmark: bool = True  # a tf.Module the CNN benchmark can train
    # Its variables are made by building it in a TF1 graph, without running it: the placement
    # report and netbench's PS test (``tflaunch netbench --ps-model``) size them that way.
    sized_in_graph: bool = True

    def build(self, num_classes: int, data_format: str = "NHWC") -> object:
        """Import the network and build it (its variables are created here)."""
        module, _, attribute = self.factory.partition(":")
        factory = getattr(importlib.import_module(module), attribute)
        return factory(num_classes=num_classes, data_format=data_format)


_NETS = "tflaunch.models.nets"
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # tf_cnn_benchmarks trains ImageNet models with 1001 classes (background class included).
        ModelSpec(
            "inception3",
            "InceptionV3 (models/nets/inception.py)",
            f"{_NETS}.inception:InceptionV3",
            299,
            75,
            1001,
        ),
        ModelSpec(
            "resnet50",
            "ResNet-50 (models/nets/resnet.py)",
            f"{_NETS}.resnet:ResNet50",
            224,
            32,
            1001,
        ),
        ModelSpec(
            "mnist",
            "deep MNIST net (models/nets/deep_mnist.py; always 10 classes)",
            f"{_NETS}.deep_mnist:build_on_placeholder",
            28,
            28,
            10,
            fixed_num_classes=True,
            benchmark=False,
        ),
    )
}

ALIASES: dict[str, str] = {"inception_v3": "inception3"}


def model_names(
    *, benchmark: bool = False, aliases: bool = False, sized_in_graph: bool = False
) -> tuple[str, ...]:
    """Main names (the benchmark's only, with ``benchmark``; those whose variables a graph
    build sizes only, with ``sized_in_graph``), then their aliases if asked for."""
    main = tuple(
        name
        for name, spec in MODELS.items()
        if (spec.benchmark or not benchmark) and (spec.sized_in_graph or not sized_in_graph)
    )
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

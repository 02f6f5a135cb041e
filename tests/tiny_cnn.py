"""A CNN the benchmark trains at almost no cost (two convolutions with batch norm, one dense
layer: 6 trainable variables, 14 KB), for checks whose subject is the update, the barrier, the
queues or the transfers and not the network. Its graph builds in a tenth of a second where
InceptionV3's takes 3-5 s of CPU, and a step moves 14 KB, not InceptionV3's 95 MB. Tests put
it in the model table through the ``tiny_cnn`` fixture (tests/conftest.py), and real clusters
through tests/programs/tiny_benchmark.py; never in the product's."""

from __future__ import annotations

import tensorflow as tf

from tflaunch.models.nets.layers import Classifier, ConvBN, Dense, global_avg_pool
from tflaunch.models.registry import ModelSpec

SPEC = ModelSpec("tiny_cnn", "tests/tiny_cnn.py", "tests.tiny_cnn:TinyCNN", 8, 8, 10)
TRAINABLE = (
    6  # each convolution's kernel and batch norm's beta (no scale), the dense kernel and bias
)


class TinyCNN(Classifier):
    def __init__(self, num_classes: int = 10, data_format: str = "NHWC") -> None:
        super().__init__(num_classes, data_format, "tiny_cnn")
        with self.name_scope:
            self.conv1 = ConvBN(3, 8, 3, data_format=data_format, name="conv1")
            self.conv2 = ConvBN(8, 8, 3, data_format=data_format, name="conv2")
            self.classifier = Dense(8, num_classes, name="predictions")

    def __call__(self, images: tf.Tensor, training: bool = True) -> tf.Tensor:
        x = self.conv2(self.conv1(images, training), training)
        return self.classifier(global_avg_pool(x, self.data_format))

"""TensorFlow's "deep MNIST" net, TF1-style (``tf.compat.v1.get_variable`` in variable scopes), as
the distributed MNIST case study (:mod:`tflaunch.models.mnist`) trains it. Graph mode only.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1

IMAGE_SIZE = 28
NUM_CLASSES = 10


def _weights(name: str, shape: list[int]) -> tf.Variable:
    fan_in = int(np.prod(shape[:-1]))
    init = v1.truncated_normal_initializer(stddev=float(np.sqrt(2.0 / fan_in)))  # He et al.
    return v1.get_variable(name, shape, initializer=init)


def _biases(name: str, size: int) -> tf.Variable:
    return v1.get_variable(name, [size], initializer=v1.constant_initializer(0.1))


def _conv_pool(name: str, x: tf.Tensor, channels_in: int, channels_out: int, fmt: str) -> tf.Tensor:
    """5x5 convolution, ReLU, 2x2 max-pool: one block of the deep MNIST net."""
    with v1.variable_scope(name):
        kernel = _weights("weights", [5, 5, channels_in, channels_out])  # HWIO in either format
        x = tf.nn.conv2d(x, kernel, strides=1, padding="SAME", data_format=fmt)
        x = tf.nn.relu(tf.nn.bias_add(x, _biases("biases", channels_out), data_format=fmt))
        return tf.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", data_format=fmt)


def _dense(name: str, x: tf.Tensor, size_in: int, size_out: int) -> tf.Tensor:
    with v1.variable_scope(name):
        return tf.matmul(x, _weights("weights", [size_in, size_out])) + _biases("biases", size_out)


def deep_mnist(
    images: tf.Tensor, data_format: str, drop_rate: tf.Tensor, num_classes: int = NUM_CLASSES
) -> tf.Tensor:
    """TensorFlow's deep MNIST net: conv 5x5x32, conv 5x5x64 (each ReLU + 2x2 max-pool),
    dense 1024 (ReLU), dropout, dense ``num_classes``. ``images`` are NHWC; logits come out [N, num_classes].
    The variables are the same for both data formats, so NCHW and NHWC tasks can share them."""
    x = images if data_format == "NHWC" else tf.transpose(images, [0, 3, 1, 2])
    x = _conv_pool("conv1", x, 1, 32, data_format)
    x = _conv_pool("conv2", x, 32, 64, data_format)
    if data_format == "NCHW":
        x = tf.transpose(x, [0, 2, 3, 1])  # flatten in NHWC order either way
    x = tf.reshape(x, [-1, 7 * 7 * 64])
    x = tf.nn.relu(_dense("fc1", x, 7 * 7 * 64, 1024))
    x = tf.nn.dropout(x, rate=drop_rate)
    return _dense("fc2", x, 1024, num_classes)


def build_on_placeholder(num_classes: int = NUM_CLASSES, data_format: str = "NHWC") -> tf.Tensor:
    """The net on an image placeholder (dropout off): the registry's factory, for learning the
    variables it creates in a graph."""
    images = v1.placeholder(tf.float32, [None, IMAGE_SIZE, IMAGE_SIZE, 1], name="images")
    return deep_mnist(images, data_format, 0.0, num_classes)

"""A small layer library of plain TensorFlow variables and ops, shared by the CNN definitions.

Why not Keras: the same model object must run in TF1-style between-graph replication (graph mode
under ``replica_device_setter``, which only sees variables created as graph ops inside its device
scope) and under TF2 ``tf.distribute`` strategies (which only mirror variables created inside
``strategy.scope()``). Every layer here creates its ``tf.Variable`` objects eagerly in ``__init__``
(shapes are known from the channel counts), so whichever device scope or strategy scope is active
while the model is *constructed* decides where the variables live.

Layers take ``data_format`` ("NHWC" or "NCHW"). TensorFlow's CPU convolution kernels are NHWC-only;
:func:`check_data_format` refuses NCHW with a clear message when no GPU is visible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tensorflow as tf

DATA_FORMATS = ("NHWC", "NCHW")


class DataFormatError(ValueError):
    """The requested data format cannot run on this machine (NCHW without a GPU)."""


def check_data_format(data_format: str) -> None:
    """Refuse unknown formats, and NCHW where TensorFlow's CPU convolutions cannot run it."""
    if data_format not in DATA_FORMATS:
        raise DataFormatError(
            f"data_format must be one of {', '.join(DATA_FORMATS)}, not {data_format!r}."
        )
    if data_format == "NCHW" and not tf.config.list_physical_devices("GPU"):
        raise DataFormatError(
            "data_format NCHW needs a GPU: TensorFlow's CPU convolution and pooling kernels are "
            "NHWC-only, and no GPU is visible to this process. Use --data_format NHWC on CPU "
            "(tf_cnn_benchmarks' NCHW default is for GPUs)."
        )


class Classifier(tf.Module):
    """What the networks here have in common: images [N, H, W, 3] (or [N, 3, H, W] for NCHW) to
    ``num_classes`` logits, in a ``data_format`` checked to run on this machine."""

    def __init__(self, num_classes: int, data_format: str, name: str) -> None:
        check_data_format(data_format)
        super().__init__(name=name)
        self.data_format = data_format
        self.num_classes = num_classes


def channel_axis(data_format: str) -> int:
    """Axis of the channels in a 4-D activation."""
    return 1 if data_format == "NCHW" else 3


def _glorot_uniform(shape: Sequence[int], fan_in: int, fan_out: int) -> tf.Tensor:
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return tf.random.uniform(shape, -limit, limit, dtype=tf.float32)


class Conv2D(tf.Module):
    """2-D convolution with an optional bias; kernel layout HWIO as in Keras."""

    def __init__(
        self,
        in_channels: int,
        filters: int,
        kernel: int | tuple[int, int],
        strides: int = 1,
        padding: str = "SAME",
        use_bias: bool = False,
        data_format: str = "NHWC",
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        self.strides = strides
        self.padding = padding.upper()
        self.data_format = data_format
        with self.name_scope:
            shape = (kh, kw, in_channels, filters)
            self.kernel = tf.Variable(
                _glorot_uniform(shape, kh * kw * in_channels, kh * kw * filters), name="kernel"
            )
            self.bias = tf.Variable(tf.zeros((filters,)), name="bias") if use_bias else None

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        y = tf.nn.conv2d(x, self.kernel, self.strides, self.padding, data_format=self.data_format)
        if self.bias is not None:
            y = tf.nn.bias_add(y, self.bias, data_format=self.data_format)
        return y


class BatchNorm(tf.Module):
    """Batch normalisation as tf_cnn_benchmarks and Keras do it.

    Trainable: beta (``center``) and gamma (``scale``; Keras's InceptionV3 uses ``scale=False``).
    Non-trainable: moving mean and variance, updated from batch statistics while training. They are
    ON_READ variables so that under ``tf.distribute`` each replica updates its own copy (reads
    average them); in graph mode the updates go into the UPDATE_OPS collection, which the training
    op depends on.
    """

    def __init__(
        self,
        channels: int,
        scale: bool = True,
        center: bool = True,
        epsilon: float = 1e-3,
        decay: float = 0.99,
        data_format: str = "NHWC",
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self.epsilon = epsilon
        self.decay = decay
        self.data_format = data_format
        self.channels = channels
        with self.name_scope:
            self.gamma = tf.Variable(tf.ones((channels,)), name="gamma") if scale else None
            self.beta = tf.Variable(tf.zeros((channels,)), name="beta") if center else None
            stat = {
                "trainable": False,
                "synchronization": tf.VariableSynchronization.ON_READ,
                "aggregation": tf.VariableAggregation.MEAN,
            }
            self.moving_mean = tf.Variable(tf.zeros((channels,)), name="moving_mean", **stat)
            self.moving_variance = tf.Variable(tf.ones((channels,)), name="moving_variance", **stat)

    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        ones = tf.ones((self.channels,), x.dtype)
        zeros = tf.zeros((self.channels,), x.dtype)
        gamma = self.gamma if self.gamma is not None else ones
        beta = self.beta if self.beta is not None else zeros
        if not training:
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(
                x,
                gamma,
                beta,
                mean=self.moving_mean,
                variance=self.moving_variance,
                epsilon=self.epsilon,
                data_format=self.data_format,
                is_training=False,
            )
            return y
        y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
            x, gamma, beta, epsilon=self.epsilon, data_format=self.data_format, is_training=True
        )
        rate = 1.0 - self.decay
        updates = [
            self.moving_mean.assign_sub((self.moving_mean - mean) * rate),
            self.moving_variance.assign_sub((self.moving_variance - variance) * rate),
        ]
        if not tf.executing_eagerly() and not tf.inside_function():
            for update in updates:
                tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
        return y


class ConvBN(tf.Module):
    """Convolution, batch norm, ReLU: Keras's ``conv2d_bn`` / tf_cnn_benchmarks' ``conv``."""

    def __init__(
        self,
        in_channels: int,
        filters: int,
        kernel: int | tuple[int, int],
        strides: int = 1,
        padding: str = "SAME",
        use_bias: bool = False,
        bn_scale: bool = False,
        epsilon: float = 1e-3,
        relu: bool = True,
        data_format: str = "NHWC",
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self.relu = relu
        self.out_channels = filters
        with self.name_scope:
            self.conv = Conv2D(
                in_channels, filters, kernel, strides, padding, use_bias, data_format, name="conv"
            )
            self.bn = BatchNorm(
                filters, scale=bn_scale, epsilon=epsilon, data_format=data_format, name="bn"
            )

    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        y = self.bn(self.conv(x), training)
        return tf.nn.relu(y) if self.relu else y


class Dense(tf.Module):
    """Fully connected layer with bias."""

    def __init__(self, in_features: int, units: int, name: str | None = None) -> None:
        super().__init__(name=name)
        with self.name_scope:
            self.kernel = tf.Variable(
                _glorot_uniform((in_features, units), in_features, units), name="kernel"
            )
            self.bias = tf.Variable(tf.zeros((units,)), name="bias")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(x, self.kernel) + self.bias


def max_pool(x: tf.Tensor, size: int, strides: int, padding: str, data_format: str) -> tf.Tensor:
    """Max pooling with a square window."""
    return tf.nn.max_pool2d(x, size, strides, padding.upper(), data_format=data_format)


def avg_pool(x: tf.Tensor, size: int, strides: int, padding: str, data_format: str) -> tf.Tensor:
    """Average pooling with a square window (padding excluded from the average, as in Keras)."""
    return tf.nn.avg_pool2d(x, size, strides, padding.upper(), data_format=data_format)


def global_avg_pool(x: tf.Tensor, data_format: str) -> tf.Tensor:
    """Mean over the spatial axes: [N, C]."""
    axes = [2, 3] if data_format == "NCHW" else [1, 2]
    return tf.reduce_mean(x, axis=axes)


def zero_pad(x: tf.Tensor, pad: int, data_format: str) -> tf.Tensor:
    """Symmetric spatial zero padding (Keras's ZeroPadding2D)."""
    spatial = [[pad, pad], [pad, pad]]
    paddings = [[0, 0], [0, 0], *spatial] if data_format == "NCHW" else [[0, 0], *spatial, [0, 0]]
    return tf.pad(x, paddings)


def concat(tensors: Sequence[tf.Tensor], data_format: str) -> tf.Tensor:
    """Concatenate along the channel axis."""
    return tf.concat(list(tensors), axis=channel_axis(data_format))

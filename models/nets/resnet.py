"""ResNet-50 (v1) in plain TensorFlow variables and ops (see models/nets/layers.py for why not Keras).

Layer for layer Keras's ``ResNet50``: convolutions with bias, batch norm with gamma and beta
(epsilon 1.001e-5), bottleneck blocks whose stride sits on the first 1x1 convolution, a projection
shortcut at the start of each stage. With 1000 classes it has Keras's 25,583,592 trainable
parameters.
"""

from __future__ import annotations

import tensorflow as tf

from tflaunch.models.nets.layers import (
    Classifier,
    ConvBN,
    Dense,
    global_avg_pool,
    max_pool,
    zero_pad,
)

MIN_IMAGE_SIZE = 32
DEFAULT_IMAGE_SIZE = 224
_EPS = 1.001e-5


def _conv_bn(in_ch: int, filters: int, kernel: int, strides: int, relu: bool, df: str, name: str):
    padding = "VALID" if kernel in (1, 7) else "SAME"
    return ConvBN(
        in_ch,
        filters,
        kernel,
        strides,
        padding,
        use_bias=True,
        bn_scale=True,
        epsilon=_EPS,
        relu=relu,
        data_format=df,
        name=name,
    )


class Bottleneck(tf.Module):
    """1x1 -> 3x3 -> 1x1 (x4 channels) with an identity or projection shortcut (Keras block1)."""

    def __init__(
        self, in_ch: int, filters: int, strides: int, projection: bool, df: str, name: str
    ) -> None:
        super().__init__(name=name)
        with self.name_scope:
            self.shortcut = (
                _conv_bn(in_ch, 4 * filters, 1, strides, False, df, "conv0") if projection else None
            )
            self.convs = [
                _conv_bn(in_ch, filters, 1, strides, True, df, "conv1"),
                _conv_bn(filters, filters, 3, 1, True, df, "conv2"),
                _conv_bn(filters, 4 * filters, 1, 1, False, df, "conv3"),
            ]
        self.out_channels = 4 * filters

    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        shortcut = self.shortcut(x, training) if self.shortcut is not None else x
        y = x
        for conv in self.convs:
            y = conv(y, training)
        return tf.nn.relu(shortcut + y)


class ResNet50(Classifier):
    """ResNet-50 classifier: images [N, H, W, 3] (or [N, 3, H, W] for NCHW) -> logits."""

    default_image_size = DEFAULT_IMAGE_SIZE
    min_image_size = MIN_IMAGE_SIZE

    def __init__(
        self, num_classes: int = 1000, data_format: str = "NHWC", name: str = "resnet50"
    ) -> None:
        super().__init__(num_classes, data_format, name)
        df = data_format
        with self.name_scope:
            self.conv1 = _conv_bn(3, 64, 7, 2, True, df, "conv1")
            blocks: list[Bottleneck] = []
            ch = 64
            for stage, (filters, count, stride) in enumerate(
                ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), start=2
            ):
                for i in range(count):
                    block = Bottleneck(
                        ch,
                        filters,
                        stride if i == 0 else 1,
                        projection=i == 0,
                        df=df,
                        name=f"conv{stage}_block{i + 1}",
                    )
                    blocks.append(block)
                    ch = block.out_channels
            self.blocks = blocks
            self.classifier = Dense(ch, num_classes, name="predictions")

    def __call__(self, images: tf.Tensor, training: bool = True) -> tf.Tensor:
        df = self.data_format
        x = self.conv1(zero_pad(images, 3, df), training)
        x = max_pool(zero_pad(x, 1, df), 3, 2, "VALID", df)
        for block in self.blocks:
            x = block(x, training)
        return self.classifier(global_avg_pool(x, df))

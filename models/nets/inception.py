"""InceptionV3 in plain TensorFlow variables and ops (see models/nets/layers.py for why not Keras).

Layer for layer the network of Keras's ``InceptionV3`` (Szegedy et al. 2015; 94 convolutions
without bias, each followed by batch norm with beta but no gamma, then the classifier): with 1000
classes it has exactly Keras's 23,817,352 trainable parameters in 190 trainable variables.
tf_cnn_benchmarks trains it with 1001 classes (ImageNet plus background); ``num_classes`` chooses.
The smallest input it accepts is 75x75 (as in Keras).
"""

from __future__ import annotations

import tensorflow as tf

from tflaunch.models.nets.layers import (
    Classifier,
    ConvBN,
    Dense,
    avg_pool,
    concat,
    global_avg_pool,
)
from tflaunch.models.nets.layers import max_pool as _max_pool

MIN_IMAGE_SIZE = 75
DEFAULT_IMAGE_SIZE = 299


class _Builder:
    """Creates ConvBN layers in order while tracking names and data format."""

    def __init__(self, data_format: str) -> None:
        self.data_format = data_format
        self.count = 0

    def conv(
        self,
        in_ch: int,
        filters: int,
        kernel: int | tuple[int, int],
        strides: int = 1,
        padding: str = "SAME",
    ) -> ConvBN:
        self.count += 1
        return ConvBN(
            in_ch,
            filters,
            kernel,
            strides,
            padding,
            use_bias=False,
            bn_scale=False,
            epsilon=1e-3,
            data_format=self.data_format,
            name=f"conv2d_{self.count}",
        )


class InceptionA(tf.Module):
    """35x35 block (Keras mixed0-2): 1x1, 5x5, double 3x3 and pooled branches."""

    def __init__(self, b: _Builder, in_ch: int, pool_filters: int, name: str) -> None:
        super().__init__(name=name)
        self.data_format = b.data_format
        with self.name_scope:
            self.b1 = b.conv(in_ch, 64, 1)
            self.b5 = [b.conv(in_ch, 48, 1), b.conv(48, 64, 5)]
            self.b3 = [b.conv(in_ch, 64, 1), b.conv(64, 96, 3), b.conv(96, 96, 3)]
            self.bp = b.conv(in_ch, pool_filters, 1)
        self.out_channels = 64 + 64 + 96 + pool_filters

    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        df = self.data_format
        pooled = avg_pool(x, 3, 1, "SAME", df)
        return concat(
            [
                self.b1(x, training),
                _chain(self.b5, x, training),
                _chain(self.b3, x, training),
                self.bp(pooled, training),
            ],
            df,
        )


class ReductionA(tf.Module):
    """35x35 -> 17x17 (Keras mixed3)."""

    def __init__(self, b: _Builder, in_ch: int, name: str) -> None:
        super().__init__(name=name)
        self.data_format = b.data_format
        with self.name_scope:
            self.b3 = b.conv(in_ch, 384, 3, 2, "VALID")
            self.b3dbl = [b.conv(in_ch, 64, 1), b.conv(64, 96, 3), b.conv(96, 96, 3, 2, "VALID")]
        self.out_channels = 384 + 96 + in_ch

    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        df = self.data_format
        return concat(
            [
                self.b3(x, training),
                _chain(self.b3dbl, x, training),
                _max_pool(x, 3, 2, "VALID", df),
            ],
            df,
        )


class InceptionC(tf.Module):
    """17x17 block with factorised 7x7 convolutions (Keras mixed4-7)."""

    def __init__(self, b: _Builder, in_ch: int, c7: int, name: str) -> None:
        super().__init__(name=name)
        self.data_format = b.data_format
        with self.name_scope:
            self.b1 = b.conv(in_ch, 192, 1)
            self.b7 = [b.conv(in_ch, c7, 1), b.conv(c7, c7, (1, 7)), b.conv(c7, 192, (7, 1))]
            self.b7dbl = [
                b.conv(in_ch, c7, 1),
                b.conv(c7, c7, (7, 1)),
                b.conv(c7, c7, (1, 7)),
                b.conv(c7, c7, (7, 1)),
                b.conv(c7, 192, (1, 7)),
            ]
            self.bp = b.conv(in_ch, 192, 1)
        self.out_channels = 4 * 192

    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        df = self.data_format
        pooled = avg_pool(x, 3, 1, "SAME", df)
        return concat(
            [
                self.b1(x, training),
                _chain(self.b7, x, training),
                _chain(self.b7dbl, x, training),
                self.bp(pooled, training),
            ],
            df,
        )


class ReductionB(tf.Module):
    """17x17 -> 8x8 (Keras mixed8)."""

    def __init__(self, b: _Builder, in_ch: int, name: str) -> None:
        super().__init__(name=name)
        self.data_format = b.data_format
        with self.name_scope:
            self.b3 = [b.conv(in_ch, 192, 1), b.conv(192, 320, 3, 2, "VALID")]
            self.b7x3 = [
                b.conv(in_ch, 192, 1),
                b.conv(192, 192, (1, 7)),
                b.conv(192, 192, (7, 1)),
                b.conv(192, 192, 3, 2, "VALID"),
            ]
        self.out_channels = 320 + 192 + in_ch

    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        df = self.data_format
        return concat(
            [
                _chain(self.b3, x, training),
                _chain(self.b7x3, x, training),
                _max_pool(x, 3, 2, "VALID", df),
            ],
            df,
        )


class InceptionE(tf.Module):
    """8x8 block with expanded 1x3/3x1 branches (Keras mixed9-10)."""

    def __init__(self, b: _Builder, in_ch: int, name: str) -> None:
        super().__init__(name=name)
        self.data_format = b.data_format
        with self.name_scope:
            self.b1 = b.conv(in_ch, 320, 1)
            self.b3 = b.conv(in_ch, 384, 1)
            self.b3_1 = b.conv(384, 384, (1, 3))
            self.b3_2 = b.conv(384, 384, (3, 1))
            self.b3dbl = [b.conv(in_ch, 448, 1), b.conv(448, 384, 3)]
            self.b3dbl_1 = b.conv(384, 384, (1, 3))
            self.b3dbl_2 = b.conv(384, 384, (3, 1))
            self.bp = b.conv(in_ch, 192, 1)
        self.out_channels = 320 + 768 + 768 + 192

    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        df = self.data_format
        b3 = self.b3(x, training)
        b3dbl = _chain(self.b3dbl, x, training)
        pooled = avg_pool(x, 3, 1, "SAME", df)
        return concat(
            [
                self.b1(x, training),
                concat([self.b3_1(b3, training), self.b3_2(b3, training)], df),
                concat([self.b3dbl_1(b3dbl, training), self.b3dbl_2(b3dbl, training)], df),
                self.bp(pooled, training),
            ],
            df,
        )


def _chain(layers: list[ConvBN], x: tf.Tensor, training: bool) -> tf.Tensor:
    for layer in layers:
        x = layer(x, training)
    return x


class InceptionV3(Classifier):
    """InceptionV3 classifier: images [N, H, W, 3] (or [N, 3, H, W] for NCHW) -> logits."""

    default_image_size = DEFAULT_IMAGE_SIZE
    min_image_size = MIN_IMAGE_SIZE

    def __init__(
        self, num_classes: int = 1000, data_format: str = "NHWC", name: str = "inception_v3"
    ) -> None:
        super().__init__(num_classes, data_format, name)
        b = _Builder(data_format)
        with self.name_scope:
            self.stem = [
                b.conv(3, 32, 3, 2, "VALID"),
                b.conv(32, 32, 3, 1, "VALID"),
                b.conv(32, 64, 3),
            ]
            self.stem2 = [b.conv(64, 80, 1, 1, "VALID"), b.conv(80, 192, 3, 1, "VALID")]
            blocks: list[tf.Module] = []
            ch = 192
            for i, pool_filters in enumerate((32, 64, 64)):
                blocks.append(InceptionA(b, ch, pool_filters, name=f"mixed{i}"))
                ch = blocks[-1].out_channels
            blocks.append(ReductionA(b, ch, name="mixed3"))
            ch = blocks[-1].out_channels
            for i, c7 in enumerate((128, 160, 160, 192)):
                blocks.append(InceptionC(b, ch, c7, name=f"mixed{4 + i}"))
                ch = blocks[-1].out_channels
            blocks.append(ReductionB(b, ch, name="mixed8"))
            ch = blocks[-1].out_channels
            for i in range(2):
                blocks.append(InceptionE(b, ch, name=f"mixed{9 + i}"))
                ch = blocks[-1].out_channels
            self.blocks = blocks
            self.classifier = Dense(ch, num_classes, name="predictions")

    def __call__(self, images: tf.Tensor, training: bool = True) -> tf.Tensor:
        df = self.data_format
        x = _chain(self.stem, images, training)
        x = _max_pool(x, 3, 2, "VALID", df)
        x = _chain(self.stem2, x, training)
        x = _max_pool(x, 3, 2, "VALID", df)
        for block in self.blocks:
            x = block(x, training)
        return self.classifier(global_avg_pool(x, df))

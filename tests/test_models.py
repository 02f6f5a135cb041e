"""The CNN definitions: parameter counts against Keras's own models, shapes, data formats.

The Keras models are built here on purpose: the point is to compare with Keras itself, not with
numbers copied from its documentation.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import LazyModule, tensorflow_module
from tflaunch.models.registry import get_model_spec

tf = LazyModule("tensorflow")
inception = LazyModule("tflaunch.models.nets.inception")  # these three import tensorflow
layers = LazyModule("tflaunch.models.nets.layers")
resnet = LazyModule("tflaunch.models.nets.resnet")
pytestmark = tensorflow_module()


def _trainable(variables) -> tuple[int, int]:
    return sum(int(np.prod(v.shape)) for v in variables), len(variables)


def test_inception_v3_matches_keras_parameter_count() -> None:
    keras_model = tf.keras.applications.InceptionV3(weights=None)
    ours = inception.InceptionV3(num_classes=1000)
    assert _trainable(ours.trainable_variables) == _trainable(keras_model.trainable_weights)
    assert _trainable(ours.trainable_variables) == (23_817_352, 190)


def test_resnet50_matches_keras_parameter_count() -> None:
    keras_model = tf.keras.applications.ResNet50(weights=None)
    ours = resnet.ResNet50(num_classes=1000)
    assert _trainable(ours.trainable_variables) == _trainable(keras_model.trainable_weights)
    assert _trainable(ours.trainable_variables)[0] == 25_583_592


def test_1001_classes_adds_one_output_unit() -> None:
    ours = inception.InceptionV3(num_classes=1001)
    # 2048 weights and one bias more than the 1000-class network.
    assert _trainable(ours.trainable_variables)[0] == 23_817_352 + 2049


def test_inception_smallest_input_trains_one_step() -> None:
    spec = get_model_spec("inception3")
    model = spec.build(10, "NHWC")
    images = tf.random.uniform([2, spec.min_image_size, spec.min_image_size, 3])
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=[1, 2], logits=logits)
        )
    grads = tape.gradient(loss, model.trainable_variables)
    assert logits.shape == (2, 10)
    assert all(g is not None for g in grads)
    # Batch-norm moving statistics moved away from their initial values.
    first_bn = model.stem[0].bn
    assert float(tf.reduce_sum(tf.abs(first_bn.moving_mean))) > 0.0


def test_graph_mode_variables_follow_replica_device_setter() -> None:
    graph = tf.Graph()
    with graph.as_default():
        setter = tf.compat.v1.train.replica_device_setter(
            ps_tasks=2, worker_device="/job:worker/task:0"
        )
        with tf.compat.v1.device(setter):
            model = resnet.ResNet50(num_classes=10)
            logits = model(tf.zeros([1, 32, 32, 3]), training=True)
    devices = {v.device for v in model.trainable_variables}
    assert devices == {"/job:ps/task:0", "/job:ps/task:1"}
    assert logits.op.device == "/job:worker/task:0"
    assert len(graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)) == 2 * 53


def test_nchw_refused_without_gpu() -> None:
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU is visible: NCHW is allowed here")
    with pytest.raises(layers.DataFormatError, match="NHWC-only"):
        layers.check_data_format("NCHW")
    with pytest.raises(layers.DataFormatError, match="NCHW needs a GPU"):
        inception.InceptionV3(data_format="NCHW")


def test_unknown_model_lists_choices() -> None:
    with pytest.raises(ValueError, match="inception3"):
        get_model_spec("vgg16")

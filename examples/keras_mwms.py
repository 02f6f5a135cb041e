"""A plain TensorFlow/Keras multi-worker program, as TensorFlow's tutorial "Multi-worker training
with Keras" writes it: MultiWorkerMirroredStrategy, a model built and compiled in its scope,
``model.fit`` on a ``tf.data`` dataset. tflaunch gives each worker its TF_CONFIG; nothing here
knows about tflaunch. The data are scikit-learn's bundled 8x8 digits (no download).

Under TensorFlow 2.16+ ``tf.keras`` is Keras 3, whose ``fit`` fails with this strategy
(``Attempt to convert a value (PerReplica:{...}) with an unsupported type``): run it with
``program.keras: legacy`` (examples/keras-mwms.yaml) and the tf_keras package
(``pip install 'tflaunch[keras2]'``).
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402


def digits_dataset(batch_size):
    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., np.newaxis]
    labels = digits.target.astype("int64")
    return (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .shuffle(len(labels), seed=0)
        .repeat()
        .batch(batch_size)
    )


def build_and_compile_cnn_model():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(8, 8, 1)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.Adam(learning_rate=0.01),
        metrics=["accuracy"],
    )
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps_per_epoch", type=int, default=30)
    parser.add_argument("--per_worker_batch", type=int, default=32)
    args = parser.parse_args()

    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras = tf.keras.Sequential.__module__.split(".")[0]  # tf_keras (Keras 2) or keras (3)
    print(f"tf.keras is {keras}; {num_workers} workers", flush=True)

    dataset = digits_dataset(args.per_worker_batch * num_workers)
    with strategy.scope():
        model = build_and_compile_cnn_model()
    history = model.fit(
        dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2
    )
    print(f"final accuracy: {history.history['accuracy'][-1]:.3f}", flush=True)


if __name__ == "__main__":
    main()

"""A Keras ``fit`` under MultiWorkerMirroredStrategy, written against plain TensorFlow and Keras
2 (``tf_keras``, with ``TF_USE_LEGACY_KERAS=1``: Keras 3's ``fit`` fails under this strategy).
It knows nothing of tflaunch: the cluster comes from ``TF_CONFIG``. Small on purpose (a dense
network on random data), for the trace and progress tests."""

import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras


def main() -> int:
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 32)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048).repeat().batch(64)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.layers.Input((32,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(2),
            ]
        )
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    print(f"keras: {keras.__name__}, {strategy.num_replicas_in_sync} replicas", flush=True)
    history = model.fit(data, epochs=epochs, steps_per_epoch=steps, verbose=1)
    print(f"final accuracy: {history.history['accuracy'][-1]:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""TensorFlow's ParameterServerStrategy tutorial ("Parameter server training with
ParameterServerStrategy", its real-cluster section), written as the tutorial writes it: the
workers and PS start a ``tf.distribute.Server`` from TF_CONFIG and ``join()`` it forever; the chief
builds the strategy, trains with ``Model.fit`` on a ``DatasetCreator`` and exits. Nothing here
knows about tflaunch. Keras 2 (``program.keras: legacy``): ``DatasetCreator`` is tf.keras's."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if cluster_resolver.task_type in ("worker", "ps"):
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    server = tf.distribute.Server(
        cluster_resolver.cluster_spec(),
        job_name=cluster_resolver.task_type,
        task_index=cluster_resolver.task_id,
        protocol=cluster_resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"{cluster_resolver.task_type}:{cluster_resolver.task_id} serving", flush=True)
    server.join()

strategy = tf.distribute.ParameterServerStrategy(cluster_resolver)
with strategy.scope():
    model = tf.keras.models.Sequential([tf.keras.layers.Dense(10)])
    model.compile(tf.keras.optimizers.legacy.SGD(), loss="mse", steps_per_execution=10)


def dataset_fn(input_context):
    x = tf.random.uniform((10, 10))
    y = tf.random.uniform((10,))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(2).prefetch(2)


history = model.fit(
    tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=3, steps_per_epoch=20
)
print(f"chief done: loss {history.history['loss'][-1]:.4f}", flush=True)
